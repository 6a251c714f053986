// The CUDA entry points. Available when the library was built with CUDA
// (TRAINWATCH_KERNELS_HAVE_CUDA is defined to 1 for its users); include this
// header only then.
//
// The pattern, for every statistic: a plan or workspace object is created
// once (it allocates device and pinned host memory, which synchronizes);
// each step, Launch() enqueues a fixed number of kernels on the caller's
// stream and returns at once — no host synchronization, no allocation, safe
// to capture in a CUDA graph — and ReadbackAsync() enqueues one small copy of
// the results into pinned host memory. The caller's own synchronization
// (cudaStreamSynchronize, an event, or the next step's natural sync point)
// is the only wait; after it, Result() reads the host copy.
//
// Results are deterministic: the partition of the work into blocks depends
// on the sizes only, reductions run in a fixed order, and nothing uses
// floating-point atomics. The same inputs give bit-identical results on every
// run (on the same GPU model and build; CPU and GPU results agree to within
// rounding, not bit for bit).
//
// None of these objects is thread-safe; use one per stream.

#ifndef TRAINWATCH_KERNELS_CUDA_H_
#define TRAINWATCH_KERNELS_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "trainwatch/kernels/cross_entropy.h"
#include "trainwatch/kernels/grad_stats.h"
#include "trainwatch/kernels/logit_stats.h"
#include "trainwatch/kernels/status.h"
#include "trainwatch/kernels/tensor_view.h"

namespace trainwatch::kernels {

// Number of CUDA devices this process can use; 0 when there is none or no
// driver (never an error, so callers can simply skip GPU work).
int CudaDeviceCount();

// Whether this build's kernels run on the current device: a device exists
// and the library holds machine code or PTX for its architecture (a build
// for sm_80 and newer has none for a Turing GPU). Unavailable with the
// runtime's reason otherwise.
Status CudaKernelsRunnable();

// The start of a plan's device result buffer, for consumers that reduce on
// the device (e.g. an all-reduce of sum_squares across ranks before any
// host copy). When the plan was created with per_tensor, the header is
// followed by double[n] sums of squares, unsigned long long[n] nonfinite
// counts and double[n] max |x|, n = the number of tensors.
struct GpuGradStatsHeader {
  double sum_squares;
  unsigned long long nonfinite;
  long long numel;
  double max_abs;
};

// Gradient statistics over a fixed list of device tensors (the model's
// gradients: the same pointers and sizes every step).
//
// Partition: each tensor is cut into segments of 128 KiB; a segment of at
// least 2,048 elements gets a CUDA block to itself, shorter ones (small
// tensors, tails) are packed up to 64 per block and reduced one per warp. A
// step is two kernels whatever the number of tensors: one writes a partial
// per segment, the second reduces the partials in a fixed order in fp64.
class GradStatsGpuPlan {
 public:
  // Builds the partition and uploads it (synchronous: call once, outside the
  // step). The views must be device (or managed) memory; they are not read
  // here. Errors: InvalidArgument for bad views, Unavailable without a
  // device, ResourceExhausted / Internal for CUDA failures.
  static Status Create(const TensorView* tensors, size_t count,
                       const GradStatsOptions& options,
                       std::unique_ptr<GradStatsGpuPlan>* out);
  ~GradStatsGpuPlan();
  GradStatsGpuPlan(const GradStatsGpuPlan&) = delete;
  GradStatsGpuPlan& operator=(const GradStatsGpuPlan&) = delete;

  // Points the plan at new buffers with the same count, dtypes and sizes
  // (e.g. gradients reallocated): uploads the new pointers on `stream`,
  // which must be the stream later Launch() calls use. Waits only for the
  // previous Rebind's upload, long finished in practice.
  // InvalidArgument when the shapes differ.
  Status Rebind(const TensorView* tensors, size_t count, cudaStream_t stream);

  // Enqueues the statistics kernels (kKernelsPerLaunch of them) on `stream`.
  Status Launch(cudaStream_t stream);
  // Enqueues the copy of the results into this plan's pinned host buffer.
  Status ReadbackAsync(cudaStream_t stream);
  // Reads the host buffer. REQUIRES: the stream has passed the last
  // ReadbackAsync (the caller synchronized); otherwise the values are stale.
  Status Result(GradStats* out) const;

  // Device memory laid out as described at GpuGradStatsHeader; written by
  // Launch().
  const GpuGradStatsHeader* device_result() const;
  // Its size in bytes, and Result() from a host copy of it that the caller
  // made (e.g. gathered with other results into one device-to-host copy).
  size_t result_bytes() const;
  Status ResultFrom(const void* host_copy, GradStats* out) const;

  static constexpr int kKernelsPerLaunch = 2;
  size_t tensor_count() const;
  int64_t segment_count() const;
  int64_t block_count() const;

 private:
  struct Impl;
  explicit GradStatsGpuPlan(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One-shot convenience: plan, launch, read back and synchronize `stream`.
// For tests and tools; a training loop keeps a plan.
Status ComputeGradStatsGpu(const TensorView* tensors, size_t count,
                           const GradStatsOptions& options, cudaStream_t stream,
                           GradStats* out);

// Logit statistics (trainwatch/kernels/logit_stats.h) on device logits: one
// block per row (online softmax, one read), then one block for the fixed-
// order reduction over rows. LogitStatsOptions pointers are device pointers;
// cpu_path is ignored.
class LogitStatsGpu {
 public:
  // Workspace for up to `max_rows` rows (synchronous).
  static Status Create(int64_t max_rows, std::unique_ptr<LogitStatsGpu>* out);
  ~LogitStatsGpu();
  LogitStatsGpu(const LogitStatsGpu&) = delete;
  LogitStatsGpu& operator=(const LogitStatsGpu&) = delete;

  // InvalidArgument for a bad view or logits.rows > max_rows.
  Status Launch(const LogitsView& logits, const LogitStatsOptions& options,
                cudaStream_t stream);
  Status ReadbackAsync(cudaStream_t stream);
  // REQUIRES: the stream has passed the last ReadbackAsync.
  Status Result(LogitStats* out) const;
  // The device result Launch() writes (result_bytes() of it), and Result()
  // from a host copy of it that the caller made, as for GradStatsGpuPlan.
  const void* device_result() const;
  static size_t result_bytes();
  static Status ResultFrom(const void* host_copy, LogitStats* out);

  static constexpr int kKernelsPerLaunch = 2;

 private:
  struct Impl;
  explicit LogitStatsGpu(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

Status ComputeLogitStatsGpu(const LogitsView& logits,
                            const LogitStatsOptions& options,
                            cudaStream_t stream, LogitStats* out);

// Fused cross entropy + z-loss forward and backward
// (trainwatch/kernels/cross_entropy.h) on device logits: one block per row
// computes log Z by online softmax, the row's loss, and (when
// options.grad_logits is set) writes the gradient in a second sweep over the
// row; a second kernel sums the row losses in a fixed order.
class CrossEntropyGpu {
 public:
  static Status Create(int64_t max_rows, std::unique_ptr<CrossEntropyGpu>* out);
  ~CrossEntropyGpu();
  CrossEntropyGpu(const CrossEntropyGpu&) = delete;
  CrossEntropyGpu& operator=(const CrossEntropyGpu&) = delete;

  Status Launch(const LogitsView& logits, const CrossEntropyOptions& options,
                cudaStream_t stream);
  Status ReadbackAsync(cudaStream_t stream);
  // REQUIRES: the stream has passed the last ReadbackAsync.
  Status Result(CrossEntropyResult* out) const;

  static constexpr int kKernelsPerLaunch = 2;

 private:
  struct Impl;
  explicit CrossEntropyGpu(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

Status ComputeCrossEntropyZLossGpu(const LogitsView& logits,
                                   const CrossEntropyOptions& options,
                                   cudaStream_t stream,
                                   CrossEntropyResult* out);

}  // namespace trainwatch::kernels

#endif  // TRAINWATCH_KERNELS_CUDA_H_
