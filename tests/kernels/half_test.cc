// The 16-bit float conversions, exhaustively where that is cheap.

#include "trainwatch/kernels/half.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>

namespace trainwatch::kernels {
namespace {

TEST_CASE("fp16 round trips every bit pattern", "[half]") {
  int mismatches = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = HalfBitsToFloat(static_cast<uint16_t>(h));
    const uint16_t back = FloatToHalfBits(f);
    if ((h & 0x7fffu) > 0x7c00u) {
      mismatches += std::isnan(f) && (back & 0x7fffu) > 0x7c00u ? 0 : 1;
    } else {
      mismatches += back == h ? 0 : 1;
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 round trips every bit pattern", "[half]") {
  int mismatches = 0;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = BFloat16BitsToFloat(static_cast<uint16_t>(b));
    const uint16_t back = FloatToBFloat16Bits(f);
    if ((b & 0x7fffu) > 0x7f80u) {
      mismatches += std::isnan(f) && (back & 0x7fffu) > 0x7f80u ? 0 : 1;
    } else {
      mismatches += back == b ? 0 : 1;
    }
  }
  CHECK(mismatches == 0);
}

TEST_CASE("fp16 conversion rounds to nearest even", "[half]") {
  CHECK(HalfBitsToFloat(0x7bff) == 65504.0f);
  CHECK(HalfBitsToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(FloatToHalfBits(65519.0f) == 0x7bff);
  CHECK(FloatToHalfBits(65520.0f) == 0x7c00);  // ties to even: inf
  CHECK(FloatToHalfBits(1e30f) == 0x7c00);
  CHECK(FloatToHalfBits(-1e30f) == 0xfc00);
  CHECK(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie, even
  CHECK(FloatToHalfBits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  CHECK(FloatToHalfBits(std::ldexp(1.0f, -25)) == 0x0000);  // tie to 0
  CHECK(FloatToHalfBits(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(FloatToHalfBits(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 units: even
  CHECK(FloatToHalfBits(std::ldexp(1023.5f, -24)) == 0x0400);  // into normal
}

TEST_CASE("bf16 conversion rounds to nearest even", "[half]") {
  CHECK(FloatToBFloat16Bits(1.0f) == 0x3f80);
  CHECK(FloatToBFloat16Bits(BitsToFloat(0x3f808000u)) == 0x3f80);  // tie, even
  CHECK(FloatToBFloat16Bits(BitsToFloat(0x3f818000u)) == 0x3f82);  // tie, even
  CHECK(FloatToBFloat16Bits(BitsToFloat(0x3f808001u)) == 0x3f81);
  CHECK(FloatToBFloat16Bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(BFloat16BitsToFloat(0x7f7f) == BitsToFloat(0x7f7f0000u));
}

}  // namespace
}  // namespace trainwatch::kernels
