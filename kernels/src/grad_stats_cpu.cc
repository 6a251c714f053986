// ComputeGradStats on the host: validation, path selection, the walk over
// tensors and pieces, and the portable scalar kernels.

#include <algorithm>
#include <cstdint>
#include <string>

#include "cpu_kernels.h"
#include "trainwatch/kernels/grad_stats.h"

namespace trainwatch::kernels {
namespace internal {
namespace {

// Four fp32 accumulators, element i into lane i % 4: the scalar analogue of
// the SIMD lanes, so that the scalar path has the same error profile.
template <DType D>
RangeStats ScalarRangeImpl(const void* data, int64_t n) {
  RangeStats r;
  for (int64_t start = 0; start < n; start += kGradPieceElems) {
    const int64_t end = std::min(n, start + kGradPieceElems);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t nonfinite = 0;
    float max_abs = r.max_abs;
    for (int64_t i = start; i < end; ++i) {
      bool finite;
      float a = ElemTraits<D>::Abs(data, i, &finite);
      a = finite ? a : 0.0f;
      nonfinite += finite ? 0 : 1;
      max_abs = std::max(max_abs, a);
      acc[i & 3] += a * a;
    }
    double piece = 0.0;
    bool overflow = false;
    for (float lane : acc) {
      overflow |= !(lane <= 3.4028234663852886e38f);
      piece += static_cast<double>(lane);
    }
    if (overflow) piece = SumSquaresFp64<D>(data, start, end);
    r.sum_squares += piece;
    r.nonfinite += nonfinite;
    r.max_abs = max_abs;
  }
  return r;
}

}  // namespace

GradRangeFn ScalarGradRange(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &ScalarRangeImpl<DType::kFloat32>;
    case DType::kBFloat16:
      return &ScalarRangeImpl<DType::kBFloat16>;
    case DType::kFloat16:
      return &ScalarRangeImpl<DType::kFloat16>;
  }
  return nullptr;
}

}  // namespace internal

Status ValidateTensorViews(const TensorView* tensors, size_t count) {
  if (count > 0 && tensors == nullptr) {
    return InvalidArgumentError("tensors is null but count is " +
                                std::to_string(count));
  }
  for (size_t i = 0; i < count; ++i) {
    const TensorView& t = tensors[i];
    const std::string where = "tensor " + std::to_string(i) + ": ";
    if (!IsValidDType(t.dtype)) {
      return InvalidArgumentError(
          where + "unknown dtype " +
          std::to_string(static_cast<int>(t.dtype)));
    }
    if (t.numel < 0) {
      return InvalidArgumentError(where + "negative numel " +
                                  std::to_string(t.numel));
    }
    if (t.numel > 0 && t.data == nullptr) {
      return InvalidArgumentError(where + "null data with numel " +
                                  std::to_string(t.numel));
    }
    if (reinterpret_cast<uintptr_t>(t.data) % DTypeSize(t.dtype) != 0) {
      return InvalidArgumentError(where + "data not aligned to its " +
                                  DTypeName(t.dtype) + " element size");
    }
  }
  return OkStatus();
}

Status ComputeGradStats(const TensorView* tensors, size_t count,
                        const GradStatsOptions& options, GradStats* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateTensorViews(tensors, count));
  CpuPath path = options.cpu_path;
  if (!CpuPathSupported(path)) {
    return UnavailableError(std::string("CPU path ") + CpuPathName(path) +
                            " is not supported by this processor or build");
  }
  if (path == CpuPath::kAuto) path = BestCpuPath();

  out->sum_squares = 0.0;
  out->nonfinite = 0;
  out->numel = 0;
  out->max_abs = 0.0;
  const size_t per_tensor = options.per_tensor ? count : 0;
  out->tensor_sum_squares.assign(per_tensor, 0.0);
  out->tensor_nonfinite.assign(per_tensor, 0);
  out->tensor_max_abs.assign(per_tensor, 0.0);

  float max_abs = 0.0f;
  for (size_t i = 0; i < count; ++i) {
    const TensorView& t = tensors[i];
    out->numel += t.numel;
    if (t.numel == 0) continue;
    const internal::GradRangeFn fn = path == CpuPath::kAvx2
                                         ? internal::Avx2GradRange(t.dtype)
                                         : internal::ScalarGradRange(t.dtype);
    const internal::RangeStats r = fn(t.data, t.numel);
    out->sum_squares += r.sum_squares;
    out->nonfinite += r.nonfinite;
    max_abs = std::max(max_abs, r.max_abs);
    if (options.per_tensor) {
      out->tensor_sum_squares[i] = r.sum_squares;
      out->tensor_nonfinite[i] = r.nonfinite;
      out->tensor_max_abs[i] = r.max_abs;
    }
  }
  out->max_abs = max_abs;
  return OkStatus();
}

}  // namespace trainwatch::kernels
