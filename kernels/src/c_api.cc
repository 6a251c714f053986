#include "trainwatch/kernels/c_api.h"

#include <cstring>
#include <string>
#include <vector>

#include "trainwatch/kernels/grad_stats.h"
#include "trainwatch/kernels/logit_stats.h"
#include "trainwatch/kernels/status.h"
#include "trainwatch/kernels/tensor_view.h"

#if defined(TRAINWATCH_KERNELS_HAVE_CUDA)
#include "trainwatch/kernels/cuda.h"
#endif

namespace {

using trainwatch::kernels::CpuPath;
using trainwatch::kernels::DType;
using trainwatch::kernels::GradStats;
using trainwatch::kernels::GradStatsOptions;
using trainwatch::kernels::Status;
using trainwatch::kernels::StatusCode;
using trainwatch::kernels::TensorView;

thread_local std::string last_error;

int Report(const Status& s) {
  last_error = s.ok() ? std::string() : s.ToString();
  return static_cast<int>(s.code());
}

Status MakeViews(const void* const* data, const int32_t* dtypes,
                 const int64_t* numels, int64_t count,
                 std::vector<TensorView>* views) {
  if (count < 0) return trainwatch::kernels::InvalidArgumentError("count < 0");
  if (count > 0 &&
      (data == nullptr || dtypes == nullptr || numels == nullptr)) {
    return trainwatch::kernels::InvalidArgumentError("null array");
  }
  views->resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    (*views)[i] = TensorView{data[i], static_cast<DType>(dtypes[i]), numels[i]};
  }
  return trainwatch::kernels::OkStatus();
}

void CopyOut(const GradStats& s, TwGradStats* out, double* tsum, int64_t* tbad,
             double* tmax) {
  out->sum_squares = s.sum_squares;
  out->nonfinite = s.nonfinite;
  out->numel = s.numel;
  out->max_abs = s.max_abs;
  const size_t n = s.tensor_sum_squares.size();
  if (tsum != nullptr)
    std::memcpy(tsum, s.tensor_sum_squares.data(), n * sizeof(double));
  if (tbad != nullptr)
    std::memcpy(tbad, s.tensor_nonfinite.data(), n * sizeof(int64_t));
  if (tmax != nullptr)
    std::memcpy(tmax, s.tensor_max_abs.data(), n * sizeof(double));
}

}  // namespace

extern "C" {

const char* tw_kernels_last_error(void) { return last_error.c_str(); }

int tw_kernels_cpu_path_supported(int32_t cpu_path) {
  return trainwatch::kernels::CpuPathSupported(static_cast<CpuPath>(cpu_path))
             ? 1
             : 0;
}

int tw_kernels_grad_stats_cpu(const void* const* data, const int32_t* dtypes,
                              const int64_t* numels, int64_t count,
                              int32_t cpu_path, TwGradStats* out,
                              double* tensor_sum_squares,
                              int64_t* tensor_nonfinite,
                              double* tensor_max_abs) {
  if (out == nullptr) {
    return Report(trainwatch::kernels::InvalidArgumentError("out is null"));
  }
  thread_local std::vector<TensorView> views;
  thread_local GradStats stats;
  Status s = MakeViews(data, dtypes, numels, count, &views);
  if (!s.ok()) return Report(s);
  GradStatsOptions options;
  options.cpu_path = static_cast<CpuPath>(cpu_path);
  options.per_tensor = tensor_sum_squares != nullptr ||
                       tensor_nonfinite != nullptr || tensor_max_abs != nullptr;
  s = trainwatch::kernels::ComputeGradStats(views.data(), views.size(), options,
                                            &stats);
  if (s.ok()) {
    CopyOut(stats, out, tensor_sum_squares, tensor_nonfinite, tensor_max_abs);
  }
  return Report(s);
}

int tw_kernels_logit_stats_cpu(const void* data, int32_t dtype, int64_t rows,
                               int64_t vocab, const int32_t* labels,
                               int32_t ignore_index, int32_t cpu_path,
                               TwLogitStats* out) {
  if (out == nullptr) {
    return Report(trainwatch::kernels::InvalidArgumentError("out is null"));
  }
  trainwatch::kernels::LogitsView view;
  view.data = data;
  view.dtype = static_cast<DType>(dtype);
  view.rows = rows;
  view.vocab = vocab;
  trainwatch::kernels::LogitStatsOptions options;
  options.labels = labels;
  options.ignore_index = ignore_index;
  options.cpu_path = static_cast<CpuPath>(cpu_path);
  trainwatch::kernels::LogitStats stats;
  const Status s =
      trainwatch::kernels::ComputeLogitStats(view, options, &stats);
  if (s.ok()) {
    out->sum_log_z = stats.sum_log_z;
    out->rows_counted = stats.rows_counted;
    out->nonfinite_rows = stats.nonfinite_rows;
    out->max_logit = stats.max_logit;
  }
  return Report(s);
}

uint64_t tw_kernels_plain_word_sum(const void* data, int64_t bytes) {
  // Four independent sums so that the add latency is not the limit: the
  // baseline should run at the memory's speed, not the adder's.
  const uint64_t* p = static_cast<const uint64_t*>(data);
  const int64_t n = bytes / 8;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}

#if defined(TRAINWATCH_KERNELS_HAVE_CUDA)

int tw_kernels_has_cuda(void) { return 1; }

int tw_kernels_cuda_device_count(void) {
  return trainwatch::kernels::CudaDeviceCount();
}

int tw_kernels_gpu_plan_create(const void* const* data, const int32_t* dtypes,
                               const int64_t* numels, int64_t count,
                               int32_t per_tensor, void** plan) {
  if (plan == nullptr) {
    return Report(trainwatch::kernels::InvalidArgumentError("plan is null"));
  }
  std::vector<TensorView> views;
  Status s = MakeViews(data, dtypes, numels, count, &views);
  if (!s.ok()) return Report(s);
  GradStatsOptions options;
  options.per_tensor = per_tensor != 0;
  std::unique_ptr<trainwatch::kernels::GradStatsGpuPlan> p;
  s = trainwatch::kernels::GradStatsGpuPlan::Create(views.data(), views.size(),
                                                    options, &p);
  if (s.ok()) *plan = p.release();
  return Report(s);
}

int tw_kernels_gpu_plan_launch(void* plan, void* stream) {
  return Report(
      static_cast<trainwatch::kernels::GradStatsGpuPlan*>(plan)->Launch(
          static_cast<cudaStream_t>(stream)));
}

int tw_kernels_gpu_plan_readback(void* plan, void* stream) {
  return Report(
      static_cast<trainwatch::kernels::GradStatsGpuPlan*>(plan)->ReadbackAsync(
          static_cast<cudaStream_t>(stream)));
}

int tw_kernels_gpu_plan_result(void* plan, TwGradStats* out,
                               double* tensor_sum_squares,
                               int64_t* tensor_nonfinite,
                               double* tensor_max_abs) {
  if (out == nullptr) {
    return Report(trainwatch::kernels::InvalidArgumentError("out is null"));
  }
  GradStats stats;
  const Status s =
      static_cast<trainwatch::kernels::GradStatsGpuPlan*>(plan)->Result(&stats);
  if (s.ok()) {
    CopyOut(stats, out, tensor_sum_squares, tensor_nonfinite, tensor_max_abs);
  }
  return Report(s);
}

void tw_kernels_gpu_plan_destroy(void* plan) {
  delete static_cast<trainwatch::kernels::GradStatsGpuPlan*>(plan);
}

#else  // !TRAINWATCH_KERNELS_HAVE_CUDA

namespace {
int NoCuda() {
  return Report(trainwatch::kernels::UnimplementedError(
      "trainwatch kernels were built without CUDA"));
}
}  // namespace

int tw_kernels_has_cuda(void) { return 0; }
int tw_kernels_cuda_device_count(void) { return 0; }
int tw_kernels_gpu_plan_create(const void* const*, const int32_t*,
                               const int64_t*, int64_t, int32_t, void**) {
  return NoCuda();
}
int tw_kernels_gpu_plan_launch(void*, void*) { return NoCuda(); }
int tw_kernels_gpu_plan_readback(void*, void*) { return NoCuda(); }
int tw_kernels_gpu_plan_result(void*, TwGradStats*, double*, int64_t*,
                               double*) {
  return NoCuda();
}
void tw_kernels_gpu_plan_destroy(void*) {}

#endif

}  // extern "C"
