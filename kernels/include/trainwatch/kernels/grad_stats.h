// Gradient statistics in one read pass over a list of tensors: the global sum
// of squares (grad_norm = sqrt of it), the exact number of nonfinite
// elements (nan_frac's numerator), the largest finite magnitude, and
// optionally the same per tensor (which names the tensors behind a NaN).
//
// Definitions, the same for the CPU, the CUDA and the reference code:
//   - nonfinite: elements x with !isfinite(x), judged on the stored value in
//     its own type (a bf16 NaN is a NaN; 65504 in fp16 is finite).
//   - sum_squares: the sum of x*x over the FINITE elements only; nonfinite
//     ones are counted, not summed, so one NaN does not hide the norm of the
//     rest. A finite x whose square overflows fp32 (|x| >= ~1.8e19 in fp32 or
//     bf16) is never counted as nonfinite.
//   - max_abs: max |x| over the finite elements, exact (it is one of the
//     inputs); 0 when there is none.
//
// Accumulation and determinism. The elements are cut into a fixed partition
// that depends only on the tensor sizes (never on thread counts, timing or
// the device): squares are summed in fp32 within one small piece of the
// partition, then in fp64 across pieces, tensors and threads, in a fixed
// order. So results are bit-identical from run to run on the same machine
// and code path. When a piece's fp32 sum overflows (possible only when the
// piece holds finite values near or above 1.8e19), that piece is summed
// again in fp64, element by element: huge finite gradients give the right,
// finite fp64 sum (up to 1.2e77 per element), not inf. This costs a second
// read of that piece only, which never happens in a healthy run.

#ifndef TRAINWATCH_KERNELS_GRAD_STATS_H_
#define TRAINWATCH_KERNELS_GRAD_STATS_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainwatch/kernels/status.h"
#include "trainwatch/kernels/tensor_view.h"

namespace trainwatch::kernels {

struct GradStatsOptions {
  // Fill the per-tensor vectors of GradStats.
  bool per_tensor = false;
  // CPU only; the CUDA entry points ignore it.
  CpuPath cpu_path = CpuPath::kAuto;
};

struct GradStats {
  double sum_squares = 0.0;  // over finite elements
  int64_t nonfinite = 0;
  int64_t numel = 0;     // all elements, finite or not
  double max_abs = 0.0;  // over finite elements; 0 when none
  // One entry per input tensor when GradStatsOptions::per_tensor, else empty.
  std::vector<double> tensor_sum_squares;
  std::vector<int64_t> tensor_nonfinite;
  std::vector<double> tensor_max_abs;

  double norm() const { return std::sqrt(sum_squares); }
  double nonfinite_fraction() const {
    return numel == 0
               ? 0.0
               : static_cast<double>(nonfinite) / static_cast<double>(numel);
  }
};

// Computes the statistics of `count` host tensors on the calling thread.
// `out` is overwritten (its vectors keep their capacity, so a reused
// GradStats does not allocate in the steady state). Errors: InvalidArgument
// for a bad view (null data with numel > 0, negative numel, unknown dtype,
// misaligned data) or a null `tensors` with count > 0; Unavailable when
// options.cpu_path names a path this processor lacks.
Status ComputeGradStats(const TensorView* tensors, size_t count,
                        const GradStatsOptions& options, GradStats* out);

inline Status ComputeGradStats(const std::vector<TensorView>& tensors,
                               const GradStatsOptions& options,
                               GradStats* out) {
  return ComputeGradStats(tensors.data(), tensors.size(), options, out);
}

// Checks what every entry point requires of the views: shared by the CPU and
// CUDA code so that both reject the same inputs with the same message.
Status ValidateTensorViews(const TensorView* tensors, size_t count);

}  // namespace trainwatch::kernels

#endif  // TRAINWATCH_KERNELS_GRAD_STATS_H_
