// ComputeGradStats on the host: validation, path selection, the walk over
// tensors, and the portable kernels.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "cpu_kernels.h"
#include "trainwatch/kernels/grad_stats.h"

namespace trainwatch::kernels {
namespace internal {
namespace {

// The masked per-element reduction of [start, end): the fallback for a piece
// holding a NaN or an inf. Four fp32 accumulators, element i into lane i % 4.
template <DType D>
void MaskedPiece(const void* data, int64_t start, int64_t end, RangeStats* r) {
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float max_abs = 0.0f;
  for (int64_t i = start; i < end; ++i) {
    bool finite;
    float a = ElemTraits<D>::Abs(data, i, &finite);
    a = finite ? a : 0.0f;
    r->nonfinite += finite ? 0 : 1;
    max_abs = std::max(max_abs, a);
    acc[i & 3] += a * a;
  }
  double piece = 0.0;
  bool overflow = false;
  for (float lane : acc) {
    overflow |= !(lane <= std::numeric_limits<float>::max());
    piece += static_cast<double>(lane);
  }
  if (overflow) piece = SumSquaresFp64<D>(data, start, end);
  r->sum_squares += piece;
  r->max_abs = std::max(r->max_abs, max_abs);
}

// The portable path: 16-byte vectors written with the GCC / Clang vector
// extensions, which compile to SSE2 on any x86-64 and to NEON on AArch64
// (a Grace host gets this path). The same two-pass scheme as the AVX2 code:
// a fast pass that assumes finite values (magnitude mask, integer max,
// multiply-add), and the masked pass for a piece whose max shows a NaN/inf.
typedef int32_t I32x4 __attribute__((vector_size(16)));
typedef int16_t I16x8 __attribute__((vector_size(16)));
typedef float F32x4 __attribute__((vector_size(16)));

template <typename V>
inline V LoadVec(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename V>
inline V VecMax(V a, V b) {
#if defined(__clang__)
  const V gt = a > b;  // all ones where a > b
  return (a & gt) | (b & ~gt);
#else
  return a > b ? a : b;  // GCC turns this into one max instruction
#endif
}

inline F32x4 AsF32(I32x4 v) {
  F32x4 f;
  std::memcpy(&f, &v, sizeof f);
  return f;
}

inline I32x4 AsI32(I16x8 v) {
  I32x4 w;
  std::memcpy(&w, &v, sizeof w);
  return w;
}

// Sums 16 fp32 lanes in a fixed order into fp64; *overflow when any is inf.
inline double FoldLanes(const F32x4 (&acc)[4], float tail, bool* overflow) {
  double s = 0.0;
  bool of = !(tail <= std::numeric_limits<float>::max());
  for (const F32x4& v : acc) {
    for (int k = 0; k < 4; ++k) {
      of |= !(v[k] <= std::numeric_limits<float>::max());
      s += static_cast<double>(v[k]);
    }
  }
  *overflow = of;
  return s + static_cast<double>(tail);
}

// |x| bits of one element (as stored), and its fp32 square, for the tails.
template <DType D>
inline uint32_t TailElem(const void* p, int64_t i, float* sq) {
  bool finite;
  const float a = ElemTraits<D>::Abs(p, i, &finite);
  *sq += a * a;
  if constexpr (D == DType::kFloat32) {
    return static_cast<const uint32_t*>(p)[i] & 0x7fffffffu;
  } else {
    return static_cast<const uint16_t*>(p)[i] & 0x7fffu;
  }
}

template <DType D>
RangeStats PortableRangeImpl(const void* data, int64_t n) {
  constexpr uint32_t kInfBits = D == DType::kFloat32    ? 0x7f800000u
                                : D == DType::kBFloat16 ? 0x7f80u
                                                        : 0x7c00u;
  constexpr int64_t kStep = D == DType::kFloat32 ? 16 : 32;  // 4 vectors
  const char* bytes = static_cast<const char*>(data);
  const int64_t esize = D == DType::kFloat32 ? 4 : 2;
  RangeStats r;
  for (int64_t start = 0; start < n; start += kGradPieceElems) {
    const int64_t end = std::min(n, start + kGradPieceElems);
    F32x4 acc[4] = {};
    I32x4 vmax32 = {};
    I16x8 vmax16 = {};
    int64_t i = start;
    for (; i + kStep <= end; i += kStep) {
      for (int u = 0; u < 4; ++u) {
        const char* p = bytes + (i + u * (kStep / 4)) * esize;
        if constexpr (D == DType::kFloat32) {
          const I32x4 x = LoadVec<I32x4>(p);
          vmax32 = VecMax(vmax32, x & 0x7fffffff);
          const F32x4 f = AsF32(x);
          acc[u] += f * f;
        } else {
          const I16x8 x = LoadVec<I16x8>(p);
          const I16x8 a = x & static_cast<int16_t>(0x7fff);
          vmax16 = VecMax(vmax16, a);
          F32x4 lo, hi;
          if constexpr (D == DType::kBFloat16) {
            const I32x4 w = AsI32(x);
            lo = AsF32(w << 16);
            hi = AsF32(w & static_cast<int32_t>(0xffff0000u));
          } else {
            // fp16 magnitude -> fp32, exact for normals and subnormals: the
            // bits moved into fp32 position are the value times 2^-112.
            const I32x4 w = AsI32(a);
            lo = AsF32((w & 0xffff) << 13) * 0x1p112f;
            hi = AsF32((w >> 16) << 13) * 0x1p112f;
          }
          acc[u] += lo * lo + hi * hi;
        }
      }
    }
    uint32_t max_bits = 0;
    if constexpr (D == DType::kFloat32) {
      for (int k = 0; k < 4; ++k)
        max_bits = std::max(max_bits, static_cast<uint32_t>(vmax32[k]));
    } else {
      for (int k = 0; k < 8; ++k)
        max_bits = std::max(max_bits, static_cast<uint32_t>(vmax16[k]));
    }
    float tail = 0.0f;
    for (; i < end; ++i)
      max_bits = std::max(max_bits, TailElem<D>(data, i, &tail));
    if (max_bits >= kInfBits) {
      MaskedPiece<D>(data, start, end, &r);
      continue;
    }
    bool overflow;
    double piece = FoldLanes(acc, tail, &overflow);
    if (overflow) piece = SumSquaresFp64<D>(data, start, end);
    r.sum_squares += piece;
    float max_abs;
    if constexpr (D == DType::kFloat32) {
      max_abs = BitsToFloat(max_bits);
    } else if constexpr (D == DType::kBFloat16) {
      max_abs = BFloat16BitsToFloat(static_cast<uint16_t>(max_bits));
    } else {
      max_abs = HalfBitsToFloat(static_cast<uint16_t>(max_bits));
    }
    r.max_abs = std::max(r.max_abs, max_abs);
  }
  return r;
}

}  // namespace

GradRangeFn PortableGradRange(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &PortableRangeImpl<DType::kFloat32>;
    case DType::kBFloat16:
      return &PortableRangeImpl<DType::kBFloat16>;
    case DType::kFloat16:
      return &PortableRangeImpl<DType::kFloat16>;
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
      return InvalidArgumentError(where + "unknown dtype " +
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
                                         : internal::PortableGradRange(t.dtype);
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
