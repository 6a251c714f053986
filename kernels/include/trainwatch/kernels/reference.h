// Plain reference implementations: one scalar loop per statistic, every
// value widened to double, no blocking, no SIMD, no cleverness. They are the
// definitions the optimised CPU and CUDA kernels are tested against, and are
// slow on purpose. Host memory only.

#ifndef TRAINWATCH_KERNELS_REFERENCE_H_
#define TRAINWATCH_KERNELS_REFERENCE_H_

#include <cstddef>
#include <cstdint>

#include "trainwatch/kernels/cross_entropy.h"
#include "trainwatch/kernels/grad_stats.h"
#include "trainwatch/kernels/logit_stats.h"
#include "trainwatch/kernels/status.h"
#include "trainwatch/kernels/tensor_view.h"

namespace trainwatch::kernels {

// Element `i` of a buffer of `dtype`, widened exactly to double.
double LoadAsDouble(const void* data, DType dtype, int64_t i);

// The same contract as ComputeGradStats; sums are in fp64 element by element.
Status ReferenceGradStats(const TensorView* tensors, size_t count,
                          const GradStatsOptions& options, GradStats* out);

// The same contract as ComputeLogitStats; log Z = max + log(sum exp(u - max))
// in fp64, two passes per row.
Status ReferenceLogitStats(const LogitsView& logits,
                           const LogitStatsOptions& options, LogitStats* out);

// Cross entropy with z-loss (trainwatch/kernels/cross_entropy.h) in fp64.
// InvalidArgument when options.labels is null or the view is bad; labels
// outside [0, vocab) are counted, not errors.
Status ReferenceCrossEntropyZLoss(const LogitsView& logits,
                                  const CrossEntropyOptions& options,
                                  CrossEntropyResult* out);

}  // namespace trainwatch::kernels

#endif  // TRAINWATCH_KERNELS_REFERENCE_H_
