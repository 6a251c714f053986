/* A C ABI over the kernels, for callers that cannot use C++ (ctypes from
 * Python, benchmarks comparing with numpy or PyTorch). Built as the shared
 * library trainwatch_kernels_c.
 *
 * Every function returning int returns 0 on success and otherwise a status
 * code (the numbers of trainwatch::kernels::StatusCode);
 * tw_kernels_last_error() then describes the failure (per thread). dtype
 * values: 0 float32, 1 bfloat16, 2 float16. cpu_path: 0 auto, 1 portable,
 * 2 avx2. */

#ifndef TRAINWATCH_KERNELS_C_API_H_
#define TRAINWATCH_KERNELS_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct TwGradStats {
  double sum_squares;
  int64_t nonfinite;
  int64_t numel;
  double max_abs;
} TwGradStats;

/* The message of this thread's last failure ("" if none). */
const char* tw_kernels_last_error(void);

int tw_kernels_cpu_path_supported(int32_t cpu_path);

/* Grad stats of `count` host tensors. The per-tensor arrays may be null;
 * when not null they receive `count` entries. */
int tw_kernels_grad_stats_cpu(const void* const* data, const int32_t* dtypes,
                              const int64_t* numels, int64_t count,
                              int32_t cpu_path, TwGradStats* out,
                              double* tensor_sum_squares,
                              int64_t* tensor_nonfinite,
                              double* tensor_max_abs);

typedef struct TwLogitStats {
  double sum_log_z;
  int64_t rows_counted;
  int64_t nonfinite_rows;
  double max_logit;
} TwLogitStats;

/* Logit stats (log Z per row, by online softmax) of a host [rows x vocab]
 * matrix, contiguous rows, on the calling thread. labels may be null; when
 * not, a row whose label equals ignore_index is left out. */
int tw_kernels_logit_stats_cpu(const void* data, int32_t dtype, int64_t rows,
                               int64_t vocab, const int32_t* labels,
                               int32_t ignore_index, int32_t cpu_path,
                               TwLogitStats* out);

/* The benchmark baseline: a plain single-threaded sum of the bytes at
 * `data` read as 64-bit words (`bytes` rounded down to a multiple of 8). */
uint64_t tw_kernels_plain_word_sum(const void* data, int64_t bytes);

/* 1 when the library was built with CUDA. */
int tw_kernels_has_cuda(void);
/* Usable CUDA devices (0 without CUDA, a driver or a device). */
int tw_kernels_cuda_device_count(void);

/* GPU grad stats over device tensors, through an opaque plan
 * (trainwatch::kernels::GradStatsGpuPlan). `stream` is a cudaStream_t (null:
 * the default stream). Unimplemented (12) when built without CUDA. */
int tw_kernels_gpu_plan_create(const void* const* data, const int32_t* dtypes,
                               const int64_t* numels, int64_t count,
                               int32_t per_tensor, void** plan);
int tw_kernels_gpu_plan_launch(void* plan, void* stream);
int tw_kernels_gpu_plan_readback(void* plan, void* stream);
/* Reads the pinned copy; the caller must have synchronized the stream. */
int tw_kernels_gpu_plan_result(void* plan, TwGradStats* out,
                               double* tensor_sum_squares,
                               int64_t* tensor_nonfinite,
                               double* tensor_max_abs);
void tw_kernels_gpu_plan_destroy(void* plan);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TRAINWATCH_KERNELS_C_API_H_ */
