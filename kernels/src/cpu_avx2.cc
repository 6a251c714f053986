// The AVX2 (+FMA, +F16C) gradient kernels and the processor check (the
// logit kernels are in cpu_avx2_logits.cc). Each function carries its own
// target attribute, so this file compiles with the baseline flags and the
// code only runs after CpuHasAvx2() said yes: one binary serves every x86-64
// machine.
//
// Gradient kernels: see "fast pass" below. bf16 and fp16 are maxed as
// 16-bit integers before they are widened (for non-negative floats the bit
// order is the value order), and widening costs a shuffle and a mask (bf16)
// or one F16C convert from memory (fp16) per 8 values.

#include "cpu_avx2.h"
#include "cpu_kernels.h"

#if defined(TRAINWATCH_KERNELS_X86)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace trainwatch::kernels::internal {

#if defined(TRAINWATCH_KERNELS_X86)

namespace {

constexpr float kFloatMax = std::numeric_limits<float>::max();

// Folds four fp32 accumulators (32 lanes) into an fp64 sum, plus a scalar
// tail accumulator. The lanes are widened to fp64 and added as a fixed tree
// (the same order on every call, so results are deterministic): a serial
// chain of 32 fp64 adds would cost ~130 cycles of latency per piece, a third
// of a 16-bit piece's loop. Sets *overflow when a lane is inf: lanes are
// non-negative and nonfinite inputs never reach them, so the fp64 sum of 33
// finite floats is finite exactly when no lane overflowed.
TW_AVX2 __m256d WidenSum(__m256 a) {
  return _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)),
                       _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
}

TW_AVX2 double FoldLanes(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float tail,
                         bool* overflow) {
  const __m256d s = _mm256_add_pd(_mm256_add_pd(WidenSum(a0), WidenSum(a1)),
                                  _mm256_add_pd(WidenSum(a2), WidenSum(a3)));
  __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  h = _mm_add_sd(h, _mm_unpackhi_pd(h, h));
  const double sum = _mm_cvtsd_f64(h) + static_cast<double>(tail);
  *overflow = !(sum <= std::numeric_limits<double>::max());
  return sum;
}

// The same for eight accumulators (64 lanes): each half is folded as above
// and the halves are added.
TW_AVX2 double FoldLanes8(__m256 a0, __m256 a1, __m256 a2, __m256 a3,
                          __m256 a4, __m256 a5, __m256 a6, __m256 a7,
                          float tail, bool* overflow) {
  bool of_lo, of_hi;
  const double lo = FoldLanes(a0, a1, a2, a3, tail, &of_lo);
  const double hi = FoldLanes(a4, a5, a6, a7, 0.0f, &of_hi);
  *overflow = of_lo || of_hi;
  return lo + hi;
}

// Horizontal maxima in a few shuffles (they run once per piece, on the
// critical path between the loop and the fold).
TW_AVX2 uint16_t MaxU16(__m256i v) {
  const __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v),
                                  _mm256_extracti128_si256(v, 1));
  // minpos finds the unsigned minimum; the max of m is the min of ~m.
  const __m128i inv = _mm_xor_si128(m, _mm_set1_epi32(-1));
  return static_cast<uint16_t>(~_mm_cvtsi128_si32(_mm_minpos_epu16(inv)));
}

TW_AVX2 float MaxF32(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  float m = 0.0f;
  for (float x : lanes) m = std::max(m, x);
  return m;
}

// The fast passes ask for the data kPrefetchBytes ahead of where they read,
// two cache lines per 128 bytes consumed. The hardware prefetcher alone kept
// too few lines in flight: with it only, the 16-bit passes read slower than a
// plain read of the same bytes from memory, with the prefetch faster
// (bench/kernels/cpu_stats_bench.py; distances of 2-8 KiB alike). 4 KiB is
// half a 16-bit piece. A prefetch never faults, so reading past the end is harmless.
constexpr int kPrefetchBytes = 4096;

TW_AVX2 inline void PrefetchAhead(const void* at) {
  // Through an integer: the address may lie past the end of the tensor.
  const char* c = reinterpret_cast<const char*>(
      reinterpret_cast<uintptr_t>(at) + kPrefetchBytes);
  _mm_prefetch(c, _MM_HINT_T0);
  _mm_prefetch(c + 64, _MM_HINT_T0);
}

// Each piece is first reduced by a fast pass that assumes every element is
// finite: per vector only a load, a sign mask, an integer max of the
// magnitude bits and the fused multiply-adds (squares do not need the sign).
// The piece's max magnitude then tells whether the assumption held: bits at
// or above the infinity pattern mean the piece holds a NaN or an inf, and
// only then is the piece reduced again by the masked pass, which counts the
// nonfinite elements and leaves them out. The second pass reads the piece
// from L1 and happens only in a step that is failing anyway.

struct PieceResult {
  double sum = 0.0;
  int64_t nonfinite = 0;
  float max_abs = 0.0f;
};

// The end of a masked pass over [start, end), whatever the element type:
// the elements past the last full block one at a time, then the lanes folded
// (in fp64 again when the float lanes overflowed). The caller adds its
// vector counters and maximum.
template <DType D>
TW_AVX2 PieceResult FinishMaskedPiece(const void* p, int64_t i, int64_t start, int64_t end,
                                      __m256 acc0, __m256 acc1, __m256 acc2, __m256 acc3) {
  PieceResult r;
  float tail = 0.0f;
  for (; i < end; ++i) {
    bool finite;
    float a = ElemTraits<D>::Abs(p, i, &finite);
    a = finite ? a : 0.0f;
    r.nonfinite += finite ? 0 : 1;
    r.max_abs = std::max(r.max_abs, a);
    tail += a * a;
  }
  bool overflow;
  r.sum = FoldLanes(acc0, acc1, acc2, acc3, tail, &overflow);
  if (overflow) r.sum = SumSquaresFp64<D>(p, start, end);
  return r;
}

// ----------------------------------------------------------------- fp32

TW_AVX2 uint32_t MaxU32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v),
                            _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

// The masked pass over [start, end) of fp32 data.
TW_AVX2 PieceResult MaskedPieceF32(const uint32_t* p, int64_t start,
                                   int64_t end) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i max_finite = _mm256_set1_epi32(0x7f7fffff);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  __m256 vmax = _mm256_setzero_ps();
  __m256i cnt = _mm256_setzero_si256();
#define TW_F32_MASKED(acc, off)                                              \
  {                                                                          \
    const __m256i x =                                                        \
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + (off))); \
    const __m256i a = _mm256_and_si256(x, abs_mask);                         \
    const __m256i bad = _mm256_cmpgt_epi32(a, max_finite);                   \
    cnt = _mm256_sub_epi32(cnt, bad);                                        \
    const __m256 f = _mm256_castsi256_ps(_mm256_andnot_si256(bad, a));       \
    vmax = _mm256_max_ps(vmax, f);                                           \
    acc = _mm256_fmadd_ps(f, f, acc);                                        \
  }
  int64_t i = start;
  for (; i + 32 <= end; i += 32) {
    TW_F32_MASKED(acc0, 0)
    TW_F32_MASKED(acc1, 8)
    TW_F32_MASKED(acc2, 16)
    TW_F32_MASKED(acc3, 24)
  }
#undef TW_F32_MASKED
  PieceResult r = FinishMaskedPiece<DType::kFloat32>(p, i, start, end, acc0, acc1, acc2, acc3);
  r.nonfinite += SumI32(cnt);
  r.max_abs = std::max(MaxF32(vmax), r.max_abs);
  return r;
}

TW_AVX2 RangeStats GradRangeF32(const void* data, int64_t n) {
  const uint32_t* p = static_cast<const uint32_t*>(data);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  RangeStats r;
#define TW_F32_FAST(acc, vmax, off)                                          \
  {                                                                          \
    const __m256i x =                                                        \
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + (off))); \
    vmax = _mm256_max_epu32(vmax, _mm256_and_si256(x, abs_mask));            \
    const __m256 f = _mm256_castsi256_ps(x);                                 \
    acc = _mm256_fmadd_ps(f, f, acc);                                        \
  }
  for (int64_t start = 0; start < n; start += kGradPieceElems) {
    const int64_t end = std::min(n, start + kGradPieceElems);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    __m256i vmax0 = _mm256_setzero_si256(), vmax1 = _mm256_setzero_si256();
    int64_t i = start;
    for (; i + 32 <= end; i += 32) {
      PrefetchAhead(p + i);
      TW_F32_FAST(acc0, vmax0, 0)
      TW_F32_FAST(acc1, vmax1, 8)
      TW_F32_FAST(acc2, vmax0, 16)
      TW_F32_FAST(acc3, vmax1, 24)
    }
    uint32_t max_bits = MaxU32(_mm256_max_epu32(vmax0, vmax1));
    float tail = 0.0f;
    for (; i < end; ++i) {
      const uint32_t b = p[i] & 0x7fffffffu;
      max_bits = std::max(max_bits, b);
      const float a = BitsToFloat(b);
      tail += a * a;
    }
    PieceResult piece;
    if (max_bits >= 0x7f800000u) {
      piece = MaskedPieceF32(p, start, end);
    } else {
      bool overflow;
      piece.sum = FoldLanes(acc0, acc1, acc2, acc3, tail, &overflow);
      if (overflow) piece.sum = SumSquaresFp64<DType::kFloat32>(p, start, end);
      piece.max_abs = BitsToFloat(max_bits);
    }
    r.sum_squares += piece.sum;
    r.nonfinite += piece.nonfinite;
    r.max_abs = std::max(r.max_abs, piece.max_abs);
  }
#undef TW_F32_FAST
  return r;
}

// ------------------------------------------------------------ bf16, fp16

// 16 elements per vector as 16-bit integers. kInfBits is the infinity
// pattern (magnitudes at or above it are nonfinite); Widen turns 16 values
// into two fp32 vectors in some fixed lane order (only sums of squares are
// taken, so the order and the signs do not matter), and WidenAt does the
// same from memory, which the fast pass uses: it lets the widening pick the
// cheapest instructions for the ports the loop leaves free.
struct Bf16Ops {
  static constexpr uint16_t kInfBits = 0x7f80;
  static constexpr DType kDType = DType::kBFloat16;
  TW_AVX2 static void Widen(__m256i m, __m256* lo, __m256* hi) {
    // Even elements: moved into the top half by a byte shuffle (port 5,
    // where a shift would take a slot from the multiply-adds); odd ones
    // already are, under the even element's bits, which a mask clears.
    const __m256i even_up = _mm256_setr_epi8(
        -1, -1, 0, 1, -1, -1, 4, 5, -1, -1, 8, 9, -1, -1, 12, 13,  //
        -1, -1, 0, 1, -1, -1, 4, 5, -1, -1, 8, 9, -1, -1, 12, 13);
    *lo = _mm256_castsi256_ps(_mm256_shuffle_epi8(m, even_up));
    *hi = _mm256_castsi256_ps(
        _mm256_and_si256(m, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  TW_AVX2 static void WidenAt(const uint16_t* p, __m256i x, __m256* lo,
                              __m256* hi) {
    (void)p;
    Widen(x, lo, hi);
  }
  static float BitsToFloat(uint16_t b) { return BFloat16BitsToFloat(b); }
};

struct Fp16Ops {
  static constexpr uint16_t kInfBits = 0x7c00;
  static constexpr DType kDType = DType::kFloat16;
  TW_AVX2 static void Widen(__m256i m, __m256* lo, __m256* hi) {
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(m));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(m, 1));
  }
  // The converts read memory directly: the register form of vcvtph2ps and
  // the lane extract would add three port-5 uops per 16 values.
  TW_AVX2 static void WidenAt(const uint16_t* p, __m256i x, __m256* lo,
                              __m256* hi) {
    (void)x;
    *lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    *hi = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
  static float BitsToFloat(uint16_t b) { return HalfBitsToFloat(b); }
};

template <typename Ops>
TW_AVX2 PieceResult MaskedPiece16(const uint16_t* p, int64_t start,
                                  int64_t end) {
  const __m256i abs_mask = _mm256_set1_epi16(0x7fff);
  const __m256i max_finite =
      _mm256_set1_epi16(static_cast<int16_t>(Ops::kInfBits - 1));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  __m256i vmax = _mm256_setzero_si256();
  __m256i cnt = _mm256_setzero_si256();
  // The 16-bit counters take at most kGradPieceElems / 16 = 256 per lane.
  static_assert(kGradPieceElems / 16 < 32767, "16-bit counters overflow");
#define TW_16_MASKED(acc_lo, acc_hi, off)                                    \
  {                                                                          \
    const __m256i x =                                                        \
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + (off))); \
    const __m256i a = _mm256_and_si256(x, abs_mask);                         \
    const __m256i bad = _mm256_cmpgt_epi16(a, max_finite);                   \
    cnt = _mm256_sub_epi16(cnt, bad);                                        \
    const __m256i m = _mm256_andnot_si256(bad, a);                           \
    vmax = _mm256_max_epu16(vmax, m);                                        \
    __m256 lo, hi;                                                           \
    Ops::Widen(m, &lo, &hi);                                                 \
    acc_lo = _mm256_fmadd_ps(lo, lo, acc_lo);                                \
    acc_hi = _mm256_fmadd_ps(hi, hi, acc_hi);                                \
  }
  int64_t i = start;
  for (; i + 32 <= end; i += 32) {
    TW_16_MASKED(acc0, acc1, 0)
    TW_16_MASKED(acc2, acc3, 16)
  }
#undef TW_16_MASKED
  PieceResult r = FinishMaskedPiece<Ops::kDType>(p, i, start, end, acc0, acc1, acc2, acc3);
  r.nonfinite += SumI32(_mm256_madd_epi16(cnt, ones));
  r.max_abs = std::max(Ops::BitsToFloat(MaxU16(vmax)), r.max_abs);
  return r;
}

template <typename Ops>
TW_AVX2 RangeStats GradRange16(const void* data, int64_t n) {
  const uint16_t* p = static_cast<const uint16_t*>(data);
  const __m256i abs_mask = _mm256_set1_epi16(0x7fff);
  RangeStats r;
#define TW_16_FAST(acc_lo, acc_hi, mag, off)                                 \
  const __m256i x##off =                                                     \
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + (off)));   \
  const __m256i mag = _mm256_and_si256(x##off, abs_mask);                    \
  {                                                                          \
    __m256 lo, hi;                                                           \
    Ops::WidenAt(p + i + (off), x##off, &lo, &hi);                           \
    acc_lo = _mm256_fmadd_ps(lo, lo, acc_lo);                                \
    acc_hi = _mm256_fmadd_ps(hi, hi, acc_hi);                                \
  }
  // Eight accumulators: with four, each took one multiply-add per 32
  // values and the loop waited on their 4-cycle latency (16 bytes a cycle,
  // about the memory's speed, so any stall showed). The four magnitudes of
  // an iteration are maxed as a tree, so the max chain gains one step per
  // iteration. Named variables, not an array: GCC spilled an array of
  // accumulators to the stack.
  for (int64_t start = 0; start < n; start += kGradPieceElems) {
    const int64_t end = std::min(n, start + kGradPieceElems);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m256i vmax = _mm256_setzero_si256();
    int64_t i = start;
    for (; i + 64 <= end; i += 64) {
      PrefetchAhead(p + i);
      TW_16_FAST(a0, a1, m0, 0)
      TW_16_FAST(a2, a3, m1, 16)
      TW_16_FAST(a4, a5, m2, 32)
      TW_16_FAST(a6, a7, m3, 48)
      vmax = _mm256_max_epu16(
          vmax, _mm256_max_epu16(_mm256_max_epu16(m0, m1),
                                 _mm256_max_epu16(m2, m3)));
    }
    for (; i + 16 <= end; i += 16) {
      TW_16_FAST(a0, a1, m0, 0)
      vmax = _mm256_max_epu16(vmax, m0);
    }
    uint16_t max_bits = MaxU16(vmax);
    float tail = 0.0f;
    for (; i < end; ++i) {
      const uint16_t b = p[i] & 0x7fffu;
      max_bits = std::max(max_bits, b);
      const float a = Ops::BitsToFloat(b);
      tail += a * a;
    }
    PieceResult piece;
    if (max_bits >= Ops::kInfBits) {
      piece = MaskedPiece16<Ops>(p, start, end);
    } else {
      bool overflow;
      piece.sum = FoldLanes8(a0, a1, a2, a3, a4, a5, a6, a7, tail, &overflow);
      if (overflow) piece.sum = SumSquaresFp64<Ops::kDType>(p, start, end);
      piece.max_abs = Ops::BitsToFloat(max_bits);
    }
    r.sum_squares += piece.sum;
    r.nonfinite += piece.nonfinite;
    r.max_abs = std::max(r.max_abs, piece.max_abs);
  }
#undef TW_16_FAST
  return r;
}

TW_AVX2 RangeStats GradRangeBf16(const void* data, int64_t n) {
  return GradRange16<Bf16Ops>(data, n);
}

TW_AVX2 RangeStats GradRangeFp16(const void* data, int64_t n) {
  return GradRange16<Fp16Ops>(data, n);
}

// CPUID directly (both GCC and Clang have <cpuid.h>; Clang's
// __builtin_cpu_supports does not know "f16c"): AVX, FMA, F16C and AVX2 in
// the processor, and the YMM state enabled by the OS.
bool DetectAvx2() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28);
  const bool fma = c & (1u << 12), f16c = c & (1u << 29);
  if (!(osxsave && avx && fma && f16c)) return false;
  uint32_t xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 6u) != 6u) return false;  // XMM and YMM state
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  return (b & (1u << 5)) != 0;  // AVX2
}

}  // namespace

bool CpuHasAvx2() {
  static const bool has = DetectAvx2();
  return has;
}

GradRangeFn Avx2GradRange(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &GradRangeF32;
    case DType::kBFloat16:
      return &GradRangeBf16;
    case DType::kFloat16:
      return &GradRangeFp16;
  }
  return nullptr;
}

#else  // !TRAINWATCH_KERNELS_X86

bool CpuHasAvx2() { return false; }
GradRangeFn Avx2GradRange(DType) { return nullptr; }

#endif

}  // namespace trainwatch::kernels::internal
