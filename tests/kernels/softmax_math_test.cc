// The softmax exponent the CUDA kernels use (softmax_math.h), on the host:
// the formula is plain arithmetic, so its behaviour at the ends of fp32's
// range is checked without a GPU.

#include "softmax_math.h"

#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>

namespace trainwatch::kernels::internal {
namespace {

TEST_CASE("softmax exponent stays finite for logits near FLT_MAX",
          "[logit_stats][softmax]") {
  // Beyond FLT_MAX / log2(e) ~ 2.36e38, max * log2(e) overflows; the old
  // fmaf(x, log2e, -(max * log2e)) gave -inf for x == max, so exp gave 0 and
  // a finite row a log Z of -inf.
  for (const float m : {1.0f, 1e30f, 2.4e38f, 3e38f, FLT_MAX}) {
    INFO("max " << m);
    CHECK(SoftmaxExp2Arg(m, m) == 0.0f);
    CHECK(std::exp2(SoftmaxExp2Arg(m, m)) == 1.0f);
    const float below = std::nextafter(m, 0.0f);
    const float arg = SoftmaxExp2Arg(below, m);
    CHECK(std::isfinite(arg));
    CHECK(arg <= 0.0f);
    CHECK(std::fabs(std::exp2(arg) - std::exp(double(below) - double(m))) <
          1e-6);
    // Far below the max: exp is 0 (x - m may even overflow to -inf).
    CHECK((m < 100.0f || std::exp2(SoftmaxExp2Arg(-m, m)) == 0.0f));
  }
  // Ordinary values agree with exp(x - m).
  CHECK(std::fabs(std::exp2(SoftmaxExp2Arg(1.5f, 4.0f)) - std::exp(-2.5)) <
        1e-6);
}

}  // namespace
}  // namespace trainwatch::kernels::internal
