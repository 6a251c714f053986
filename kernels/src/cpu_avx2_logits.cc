// The AVX2 (+FMA, +F16C) logit kernels: the logsumexp state of a row
// (cpu_kernels.h, RowLse). Same scheme as cpu_avx2.cc: per-function target
// attributes, run only after CpuHasAvx2().
//
// What limits them is exp, not memory: ~20 vector instructions per 8 logits
// for ExpNonPositive and the sum, against 1-2 for a plain read of the same
// bytes, so they run at a fraction of the read's speed (0.3-0.45x for fp32,
// ~0.25x for the 16-bit types, whose 8 logits are half the bytes).

#include "cpu_avx2.h"
#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace trainwatch::kernels::internal {

#if defined(TRAINWATCH_KERNELS_X86)

namespace {

// exp(x) for x <= 0, with exp(x) = 0 below -87.3 (where fp32 stops being
// normal) and for x = -inf or NaN (max_ps returns its second operand for a
// NaN, and the compare fails). Range reduction x = n ln2 + r with ln2 split
// in two parts, then a degree-6 minimax polynomial on |r| <= ln2 / 2; about
// 2 ulp over the range used here. n is rounded by adding 1.5 * 2^23 (+127,
// the exponent bias) in the multiply-add: the sum's low mantissa bits are
// then n + 127, ready to be shifted into an exponent, which saves the round
// and convert instructions (3 of ~20 per vector). Always inlined: as a call
// its constants were reloaded and the callers' accumulators spilled.
TW_AVX2 inline __attribute__((always_inline)) __m256 ExpNonPositive(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 shift = _mm256_set1_ps(12582912.0f + 127.0f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 t =
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shift);
  const __m256 n = _mm256_sub_ps(t, shift);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r),
                      _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // n + 127 is in [1, 127]: the bits of 1.5 * 2^23 above it shift out.
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
  return _mm256_and_ps(keep, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// sum(exp(u - m)) over [start, vec_end) (a multiple of 8 long) in two fp32
// accumulators, summed in a fixed order into fp64. ExpNonPositive already
// maps NaN and -inf to 0; only +inf needs a mask (u - m = +inf would make
// garbage), and that mask costs three of the loop's instructions per
// vector, so it is taken only for a chunk where pass 1 counted a +inf.
template <typename L, bool kMaskPosInf>
TW_AVX2 inline __attribute__((always_inline)) double SumExp(const void* row,
                                                            int64_t start,
                                                            int64_t vec_end,
                                                            float max) {
  const __m256 m = _mm256_set1_ps(max);
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  const auto term = [&](int64_t at) TW_AVX2 {
    const __m256 x = L::Load(row, at);
    const __m256 e = ExpNonPositive(_mm256_sub_ps(x, m));
    if constexpr (kMaskPosInf) {
      return _mm256_and_ps(_mm256_cmp_ps(x, inf, _CMP_NEQ_UQ), e);
    } else {
      return e;
    }
  };
  int64_t i = start;
  for (; i + 16 <= vec_end; i += 16) {
    s0 = _mm256_add_ps(s0, term(i));
    s1 = _mm256_add_ps(s1, term(i + 8));
  }
  if (i < vec_end) s0 = _mm256_add_ps(s0, term(i));
  alignas(32) float lanes[16];
  _mm256_store_ps(lanes, s0);
  _mm256_store_ps(lanes + 8, s1);
  double sum = 0.0;
  for (float v : lanes) sum += v;
  return sum;
}

// Eight logits widened to fp32.
struct F32Load {
  TW_AVX2 static __m256 Load(const void* p, int64_t i) {
    return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  }
};
struct Bf16Load {
  TW_AVX2 static __m256 Load(const void* p, int64_t i) {
    const __m128i h = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};
struct Fp16Load {
  TW_AVX2 static __m256 Load(const void* p, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
  }
};

// One row in chunks: pass 1 over a chunk finds its finite max and counts NaN
// and +inf; pass 2 sums exp(u - max) over the chunk, which is still in L1.
// The row is read from memory once. Pass 1 is itself a fast pass (a max that
// skips NaNs, and whether any lane was a NaN: 3 instructions per vector),
// redone with the counts and the finite mask (8 per vector) only for a chunk
// that holds a NaN or a +inf.
template <DType D, typename L>
TW_AVX2 RowLse RowLseImpl(const void* row, int64_t vocab) {
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  RowLse st;
  st.max = -std::numeric_limits<float>::infinity();
  for (int64_t start = 0; start < vocab; start += kLogitChunkElems) {
    const int64_t end = std::min(vocab, start + kLogitChunkElems);
    const int64_t vec_end = start + ((end - start) & ~int64_t{7});
    // max_ps returns its second operand when either is a NaN: x first.
    __m256 cmax = ninf, cmax1 = ninf, unord = _mm256_setzero_ps();
    int64_t i = start;
    for (; i + 16 <= vec_end; i += 16) {
      const __m256 x0 = L::Load(row, i), x1 = L::Load(row, i + 8);
      cmax = _mm256_max_ps(x0, cmax);
      cmax1 = _mm256_max_ps(x1, cmax1);
      // Unordered: x0 or x1 is a NaN, one compare for both.
      unord = _mm256_or_ps(unord, _mm256_cmp_ps(x0, x1, _CMP_UNORD_Q));
    }
    for (; i < vec_end; i += 8) {
      const __m256 x = L::Load(row, i);
      cmax = _mm256_max_ps(x, cmax);
      unord = _mm256_or_ps(unord, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    cmax = _mm256_max_ps(cmax, cmax1);
    __m256i nan = _mm256_setzero_si256();
    __m256i pinf = _mm256_setzero_si256();
    const bool special =
        !_mm256_testz_ps(unord, unord) ||
        _mm256_movemask_ps(_mm256_cmp_ps(cmax, inf, _CMP_EQ_OQ)) != 0;
    if (special) {
      cmax = ninf;
      for (i = start; i < vec_end; i += 8) {
        const __m256 x = L::Load(row, i);
        const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
        const __m256 is_pinf = _mm256_cmp_ps(x, inf, _CMP_EQ_OQ);
        const __m256 fin =
            _mm256_cmp_ps(_mm256_and_ps(x, abs_mask), inf, _CMP_LT_OQ);
        nan = _mm256_sub_epi32(nan, _mm256_castps_si256(is_nan));
        pinf = _mm256_sub_epi32(pinf, _mm256_castps_si256(is_pinf));
        cmax = _mm256_max_ps(cmax, _mm256_blendv_ps(ninf, x, fin));
      }
    }
    float chunk_max = -std::numeric_limits<float>::infinity();
    {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, cmax);
      for (float v : lanes) chunk_max = std::max(chunk_max, v);
    }
    for (i = vec_end; i < end; ++i) {
      const float x = ElemTraits<D>::Value(row, i);
      if (std::isnan(x)) {
        ++st.nan;
      } else if (x == std::numeric_limits<float>::infinity()) {
        ++st.posinf;
      } else if (std::isfinite(x)) {
        chunk_max = std::max(chunk_max, x);
      }
    }
    st.nan += SumI32(nan);
    st.posinf += SumI32(pinf);
    if (chunk_max == -std::numeric_limits<float>::infinity()) continue;
    if (chunk_max > st.max) {
      // st.max may be -inf: exp(-inf) = 0 and st.sum is 0 then.
      st.sum *= std::exp(static_cast<double>(st.max) - chunk_max);
      st.max = chunk_max;
    }
    const bool chunk_has_pinf = !_mm256_testz_si256(pinf, pinf);
    double chunk_sum = chunk_has_pinf
                           ? SumExp<L, true>(row, start, vec_end, st.max)
                           : SumExp<L, false>(row, start, vec_end, st.max);
    for (i = vec_end; i < end; ++i) {
      const float x = ElemTraits<D>::Value(row, i);
      if (std::isfinite(x))
        chunk_sum += std::exp(static_cast<double>(x) - st.max);
    }
    st.sum += chunk_sum;
  }
  return st;
}

RowLse RowLseF32(const void* row, int64_t vocab) {
  return RowLseImpl<DType::kFloat32, F32Load>(row, vocab);
}
RowLse RowLseBf16(const void* row, int64_t vocab) {
  return RowLseImpl<DType::kBFloat16, Bf16Load>(row, vocab);
}
RowLse RowLseFp16(const void* row, int64_t vocab) {
  return RowLseImpl<DType::kFloat16, Fp16Load>(row, vocab);
}

}  // namespace

RowLseFn Avx2RowLse(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &RowLseF32;
    case DType::kBFloat16:
      return &RowLseBf16;
    case DType::kFloat16:
      return &RowLseFp16;
  }
  return nullptr;
}

#else  // !TRAINWATCH_KERNELS_X86

RowLseFn Avx2RowLse(DType) { return nullptr; }

#endif

}  // namespace trainwatch::kernels::internal
