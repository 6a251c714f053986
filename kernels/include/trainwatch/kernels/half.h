// Bit-exact conversions between float and the two 16-bit float formats, for
// code that produces or inspects bf16 / fp16 buffers on the host (tests,
// the reference code) and for the CUDA kernels (they compile on both sides).
// Rounding is to nearest, ties to even; NaN stays NaN, overflow becomes inf.

#ifndef TRAINWATCH_KERNELS_HALF_H_
#define TRAINWATCH_KERNELS_HALF_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TRAINWATCH_KERNELS_HD __host__ __device__ __forceinline__
#else
#define TRAINWATCH_KERNELS_HD inline
#endif

namespace trainwatch::kernels {

TRAINWATCH_KERNELS_HD uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TRAINWATCH_KERNELS_HD float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// A bf16 is the top half of a float: widening is exact.
TRAINWATCH_KERNELS_HD float BFloat16BitsToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

TRAINWATCH_KERNELS_HD uint16_t FloatToBFloat16Bits(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

TRAINWATCH_KERNELS_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in float.
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

TRAINWATCH_KERNELS_HD uint16_t FloatToHalfBits(float f) {
  uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (u >= 0x38800000u) {                       // normal in fp16
    u += 0xc8000fffu + ((u >> 13) & 1u);        // rebias by -112, round
    return static_cast<uint16_t>(sign | (u >> 13));
  }
  // Subnormal in fp16: units of 2^-24.
  const uint32_t e = u >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero
  const uint32_t m = (u & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

}  // namespace trainwatch::kernels

#endif  // TRAINWATCH_KERNELS_HALF_H_
