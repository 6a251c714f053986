// Test data for the kernels: host buffers of every dtype filled with random
// gradients or logits plus the values that break naive kernels (NaN, +-inf,
// denormals, the largest finite value of each type, huge fp32 values whose
// square overflows fp32, negative zero), and comparisons against the
// reference with the tolerances the headers promise.

#ifndef TRAINWATCH_TESTS_KERNELS_TEST_DATA_H_
#define TRAINWATCH_TESTS_KERNELS_TEST_DATA_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"

#include "trainwatch/kernels/grad_stats.h"
#include "trainwatch/kernels/half.h"
#include "trainwatch/kernels/logit_stats.h"
#include "trainwatch/kernels/reference.h"
#include "trainwatch/kernels/tensor_view.h"

namespace trainwatch::kernels::testing {

// splitmix64: fast enough to fill 16M elements in a blink, and the same
// sequence on every platform (unlike std:: distributions).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  int64_t Below(int64_t n) {
    return static_cast<int64_t>(Next() % static_cast<uint64_t>(n));
  }
  // Roughly normal (sum of four uniforms), cheap.
  double Normalish() {
    return (Uniform() + Uniform() + Uniform() + Uniform() - 2.0) * 1.7320508;
  }

 private:
  uint64_t s_;
};

inline uint32_t ToBits(DType dtype, float f) {
  switch (dtype) {
    case DType::kFloat32:
      return FloatBits(f);
    case DType::kBFloat16:
      return FloatToBFloat16Bits(f);
    case DType::kFloat16:
      return FloatToHalfBits(f);
  }
  return 0;
}

// A host buffer of `numel` elements of `dtype`, 64-byte aligned storage
// plus an optional element offset (to test unaligned starts).
class HostTensor {
 public:
  HostTensor(DType dtype, int64_t numel, int64_t offset_elems = 0)
      : dtype_(dtype),
        numel_(numel),
        offset_(offset_elems),
        storage_((static_cast<size_t>(numel + offset_elems) * DTypeSize(dtype) +
                  63) /
                     8 +
                 8) {}

  void SetBits(int64_t i, uint32_t bits) {
    if (dtype_ == DType::kFloat32) {
      std::memcpy(base() + i * 4, &bits, 4);
    } else {
      const uint16_t h = static_cast<uint16_t>(bits);
      std::memcpy(base() + i * 2, &h, 2);
    }
  }
  void Set(int64_t i, float f) { SetBits(i, ToBits(dtype_, f)); }

  TensorView view() const {
    return TensorView{numel_ == 0 ? nullptr : cbase(), dtype_, numel_};
  }
  const void* data() const { return cbase(); }
  void* mutable_data() { return base(); }
  size_t bytes() const {
    return static_cast<size_t>(numel_) * DTypeSize(dtype_);
  }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }

 private:
  char* base() {
    char* p = reinterpret_cast<char*>(storage_.data());
    p += (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
    return p + offset_ * DTypeSize(dtype_);
  }
  const char* cbase() const { return const_cast<HostTensor*>(this)->base(); }

  DType dtype_;
  int64_t numel_;
  int64_t offset_;
  std::vector<uint64_t> storage_;
};

// One special value of `dtype`, as bits: NaN (several payloads), +-inf,
// denormals, the largest finite value, huge fp32 values, -0.
inline uint32_t SpecialBits(DType dtype, Rng& rng) {
  const uint32_t sign32 = (rng.Next() & 1) ? 0x80000000u : 0u;
  const uint32_t sign16 = sign32 >> 16;
  const int kind = static_cast<int>(rng.Below(7));
  if (dtype == DType::kFloat32) {
    switch (kind) {
      case 0:
        return sign32 | 0x7fc00000u;  // NaN
      case 1:
        return sign32 | (0x7f800001u + static_cast<uint32_t>(
                                           rng.Below(1000)));  // NaN payload
      case 2:
        return sign32 | 0x7f800000u;  // inf
      case 3:
        return sign32 |
               static_cast<uint32_t>(1 + rng.Below(0x7fffff));  // denormal
      case 4:
        return sign32 | 0x7f7fffffu;  // FLT_MAX
      case 5:
        return FloatBits(sign32 ? -1e30f : 1e30f);  // square overflows fp32
      default:
        return 0x80000000u;  // -0
    }
  }
  const bool bf16 = dtype == DType::kBFloat16;
  switch (kind) {
    case 0:
      return sign16 | (bf16 ? 0x7fc0u : 0x7e00u);
    case 1:
      return sign16 | ((bf16 ? 0x7f81u : 0x7c01u) +
                       static_cast<uint32_t>(rng.Below(60)));
    case 2:
      return sign16 | (bf16 ? 0x7f80u : 0x7c00u);
    case 3:
      return sign16 | static_cast<uint32_t>(1 + rng.Below(bf16 ? 0x7f : 0x3ff));
    case 4:
      return sign16 | (bf16 ? 0x7f7fu : 0x7bffu);  // bf16 max, 65504
    case 5:
      return bf16 ? (sign16 | FloatToBFloat16Bits(1e30f)) : (sign16 | 0x7bfeu);
    default:
      return 0x8000u;
  }
}

// Random gradients: normal-ish values with a per-tensor scale, and a special
// value with probability `special_p`.
inline void FillGrad(HostTensor* t, Rng& rng, double special_p) {
  const double scale = std::pow(10.0, -3.0 + 4.0 * rng.Uniform());
  for (int64_t i = 0; i < t->numel(); ++i) {
    if (special_p > 0 && rng.Uniform() < special_p) {
      t->SetBits(i, SpecialBits(t->dtype(), rng));
    } else {
      t->Set(i, static_cast<float>(rng.Normalish() * scale));
    }
  }
}

inline double LoadAsDoubleForTest(const HostTensor& t, int64_t i) {
  return LoadAsDouble(t.data(), t.dtype(), i);
}

inline bool SameDouble(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// |got - want| <= rel * |want| + abs_floor. The floor covers squares below
// fp32's range (denormal inputs), which fp32 accumulation flushes to ~0.
inline bool Near(double got, double want, double rel,
                 double abs_floor = 1e-35) {
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= rel * std::fabs(want) + abs_floor;
}

constexpr double kSumRelTol = 1e-5;

// "" when `got` matches `want` (counts and maxima exactly, sums to `rel`),
// else what differs first.
inline std::string GradStatsMismatch(const GradStats& got,
                                     const GradStats& want,
                                     double rel = kSumRelTol) {
  std::ostringstream os;
  if (got.numel != want.numel) {
    os << "numel " << got.numel << " want " << want.numel << "; ";
  }
  if (got.nonfinite != want.nonfinite) {
    os << "nonfinite " << got.nonfinite << " want " << want.nonfinite << "; ";
  }
  if (got.max_abs != want.max_abs) {
    os << "max_abs " << got.max_abs << " want " << want.max_abs << "; ";
  }
  if (!Near(got.sum_squares, want.sum_squares, rel)) {
    os.precision(17);
    os << "sum_squares " << got.sum_squares << " want " << want.sum_squares
       << "; ";
  }
  if (got.tensor_sum_squares.size() != want.tensor_sum_squares.size() ||
      got.tensor_nonfinite.size() != want.tensor_nonfinite.size() ||
      got.tensor_max_abs.size() != want.tensor_max_abs.size()) {
    os << "per-tensor sizes " << got.tensor_sum_squares.size() << "/"
       << got.tensor_nonfinite.size() << "/" << got.tensor_max_abs.size()
       << " want " << want.tensor_sum_squares.size();
    return os.str();
  }
  size_t bad = 0;
  for (size_t t = 0; t < want.tensor_sum_squares.size(); ++t) {
    const bool ok =
        Near(got.tensor_sum_squares[t], want.tensor_sum_squares[t], rel) &&
        got.tensor_nonfinite[t] == want.tensor_nonfinite[t] &&
        got.tensor_max_abs[t] == want.tensor_max_abs[t];
    if (!ok && bad++ == 0) {
      os.precision(17);
      os << "tensor " << t << ": sum " << got.tensor_sum_squares[t] << " want "
         << want.tensor_sum_squares[t] << ", nonfinite "
         << got.tensor_nonfinite[t] << " want " << want.tensor_nonfinite[t]
         << ", max " << got.tensor_max_abs[t] << " want "
         << want.tensor_max_abs[t] << "; ";
    }
  }
  if (bad > 0) os << bad << " tensors differ";
  return os.str();
}

inline void CheckGradStats(const GradStats& got, const GradStats& want,
                           double rel = kSumRelTol) {
  TW_NO_MISMATCH(GradStatsMismatch(got, want, rel));
}

inline bool BitIdentical(const GradStats& a, const GradStats& b) {
  if (!SameDouble(a.sum_squares, b.sum_squares) || a.nonfinite != b.nonfinite ||
      !SameDouble(a.max_abs, b.max_abs) || a.numel != b.numel) {
    return false;
  }
  if (a.tensor_sum_squares.size() != b.tensor_sum_squares.size()) return false;
  for (size_t t = 0; t < a.tensor_sum_squares.size(); ++t) {
    if (!SameDouble(a.tensor_sum_squares[t], b.tensor_sum_squares[t]) ||
        a.tensor_nonfinite[t] != b.tensor_nonfinite[t] ||
        !SameDouble(a.tensor_max_abs[t], b.tensor_max_abs[t])) {
      return false;
    }
  }
  return true;
}

// Many tiny tensors (0..17 elements, some empty, some misaligned) of mixed
// dtypes, and a few that span several pieces.
inline std::vector<HostTensor> ManySmallTensors(Rng& rng, size_t n,
                                                double special_p) {
  std::vector<HostTensor> out;
  out.reserve(n + 3);
  const DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  for (size_t i = 0; i < n; ++i) {
    const DType d = kDTypes[rng.Below(3)];
    out.emplace_back(d, rng.Below(18), rng.Below(3));
    FillGrad(&out.back(), rng, special_p);
  }
  for (int64_t numel : {4097, 70001, 131073}) {
    out.emplace_back(kDTypes[rng.Below(3)], numel, rng.Below(2));
    FillGrad(&out.back(), rng, special_p / 10);
  }
  return out;
}

inline std::vector<TensorView> Views(const std::vector<HostTensor>& ts) {
  std::vector<TensorView> v;
  v.reserve(ts.size());
  for (const auto& t : ts) v.push_back(t.view());
  return v;
}

// Random logits: normal-ish around a per-row offset (so log Z drifts from
// row to row), rising within the row so the running max is rescaled often.
inline void FillLogits(HostTensor* t, int64_t rows, int64_t vocab,
                       int64_t stride, Rng& rng) {
  for (int64_t r = 0; r < rows; ++r) {
    const double offset = 20.0 * rng.Normalish();
    const double scale = 0.5 + 4.0 * rng.Uniform();
    for (int64_t j = 0; j < vocab; ++j) {
      const double trend =
          3.0 * static_cast<double>(j) / static_cast<double>(vocab);
      t->Set(r * stride + j,
             static_cast<float>(offset + trend + scale * rng.Normalish()));
    }
  }
}

inline std::string LogitStatsMismatch(const LogitStats& got,
                                      const LogitStats& want,
                                      double abs_tol_per_row) {
  std::ostringstream os;
  os.precision(17);
  if (got.rows_counted != want.rows_counted) {
    os << "rows_counted " << got.rows_counted << " want " << want.rows_counted
       << "; ";
  }
  if (got.nonfinite_rows != want.nonfinite_rows) {
    os << "nonfinite_rows " << got.nonfinite_rows << " want "
       << want.nonfinite_rows << "; ";
  }
  if (got.max_logit != want.max_logit) {
    os << "max_logit " << got.max_logit << " want " << want.max_logit << "; ";
  }
  const double n = static_cast<double>(want.rows_counted);
  if (!(std::fabs(got.sum_log_z - want.sum_log_z) <=
        abs_tol_per_row * n + 1e-6 * std::fabs(want.sum_log_z))) {
    os << "sum_log_z " << got.sum_log_z << " want " << want.sum_log_z;
  }
  return os.str();
}

inline void CheckLogitStats(const LogitStats& got, const LogitStats& want,
                            double abs_tol_per_row) {
  TW_NO_MISMATCH(LogitStatsMismatch(got, want, abs_tol_per_row));
}

// Row log Z's agree: both NaN, equal infinities, or within tolerance.
inline size_t RowLogZMismatches(const std::vector<float>& got,
                                const std::vector<float>& want, double tol) {
  size_t bad = 0;
  for (size_t r = 0; r < want.size(); ++r) {
    const double g = got[r], w = want[r];
    if (std::isnan(w)) {
      bad += std::isnan(g) ? 0 : 1;
    } else if (std::isinf(w)) {
      bad += g == w ? 0 : 1;
    } else {
      bad += std::fabs(g - w) <= tol * std::max(1.0, std::fabs(w)) ? 0 : 1;
    }
  }
  return bad;
}

}  // namespace trainwatch::kernels::testing

#endif  // TRAINWATCH_TESTS_KERNELS_TEST_DATA_H_
