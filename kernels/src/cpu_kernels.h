// Private: the per-ISA CPU kernels behind ComputeGradStats and
// ComputeLogitStats, and the pieces of the fixed partition they share.
//
// Invariants every implementation keeps (they are what makes the results
// deterministic and path-independent in their definitions):
//   - A tensor is cut into pieces of kGradPieceElems elements from its first
//     element; the last piece may be shorter.
//   - Within a piece squares are summed in fp32 lanes; lanes are folded into
//     an fp64 piece sum in a fixed order; piece sums are added in order.
//   - A piece is first reduced by a fast pass that assumes finite values;
//     when the piece's max magnitude shows a NaN or an inf, the piece is
//     reduced again by a masked pass, which detects nonfinite elements on
//     their stored bits, counts them and leaves them out of sum and max.
//   - A piece whose fp32 lanes overflow is summed again in fp64.

#ifndef TRAINWATCH_KERNELS_SRC_CPU_KERNELS_H_
#define TRAINWATCH_KERNELS_SRC_CPU_KERNELS_H_

#include <cstdint>

#include "trainwatch/kernels/half.h"
#include "trainwatch/kernels/tensor_view.h"

namespace trainwatch::kernels::internal {

// 16 KiB of fp32, 8 KiB of bf16: small enough that fp32 lanes of at most
// 128 elements each keep ~1e-7 relative error (the AVX2 fp32 pass has 32
// lanes of 128, its 16-bit pass 64 lanes of 64), large enough that folding
// the lanes is noise.
constexpr int64_t kGradPieceElems = 4096;

struct RangeStats {
  double sum_squares = 0.0;
  int64_t nonfinite = 0;
  float max_abs = 0.0f;
};

// Statistics of `n` contiguous elements.
using GradRangeFn = RangeStats (*)(const void* data, int64_t n);

GradRangeFn PortableGradRange(DType dtype);
// Null when the AVX2 code is not compiled in (non-x86 builds).
GradRangeFn Avx2GradRange(DType dtype);

// Logsumexp state of one row: log Z = max + log(sum), where sum is
// sum(exp(u - max)) over the finite logits. nan / posinf count the NaN and
// +inf logits (which make log Z NaN / +inf).
struct RowLse {
  float max = 0.0f;  // -inf until a finite logit was seen
  double sum = 0.0;
  int64_t nan = 0;
  int64_t posinf = 0;
};

// Reduces one row of `vocab` logits; rows are cut into chunks of
// kLogitChunkElems, each reduced in fp32 lanes and added in fp64.
using RowLseFn = RowLse (*)(const void* row, int64_t vocab);
constexpr int64_t kLogitChunkElems = 2048;

RowLseFn PortableRowLse(DType dtype);
RowLseFn Avx2RowLse(DType dtype);

// True when the processor and this build support the AVX2 path (AVX2, FMA
// and F16C).
bool CpuHasAvx2();

// |x| of element i as float, and whether x is finite.
template <DType D>
struct ElemTraits;

template <>
struct ElemTraits<DType::kFloat32> {
  static float Abs(const void* p, int64_t i, bool* finite) {
    const uint32_t b = static_cast<const uint32_t*>(p)[i] & 0x7fffffffu;
    *finite = b < 0x7f800000u;
    return BitsToFloat(b);
  }
  static float Value(const void* p, int64_t i) {
    return static_cast<const float*>(p)[i];
  }
};

template <>
struct ElemTraits<DType::kBFloat16> {
  static float Abs(const void* p, int64_t i, bool* finite) {
    const uint16_t b = static_cast<const uint16_t*>(p)[i] & 0x7fffu;
    *finite = b < 0x7f80u;
    return BFloat16BitsToFloat(b);
  }
  static float Value(const void* p, int64_t i) {
    return BFloat16BitsToFloat(static_cast<const uint16_t*>(p)[i]);
  }
};

template <>
struct ElemTraits<DType::kFloat16> {
  static float Abs(const void* p, int64_t i, bool* finite) {
    const uint16_t b = static_cast<const uint16_t*>(p)[i] & 0x7fffu;
    *finite = b < 0x7c00u;
    return HalfBitsToFloat(b);
  }
  static float Value(const void* p, int64_t i) {
    return HalfBitsToFloat(static_cast<const uint16_t*>(p)[i]);
  }
};

// The fp64 sum of squares of the finite elements in [begin, end): the
// overflow fallback of every path.
template <DType D>
double SumSquaresFp64(const void* p, int64_t begin, int64_t end) {
  double s = 0.0;
  for (int64_t i = begin; i < end; ++i) {
    bool finite;
    const double a = ElemTraits<D>::Abs(p, i, &finite);
    if (finite) s += a * a;
  }
  return s;
}

}  // namespace trainwatch::kernels::internal

#endif  // TRAINWATCH_KERNELS_SRC_CPU_KERNELS_H_
