// fp16 dynamic loss scaling through RuleEngine::Judge: records carrying a
// loss scale and the scaler's overflow flag (StepValues::SetLossScale).

#include <cmath>
#include <limits>

#include <catch2/catch.hpp>

#include "engine_harness.h"

namespace trainwatch::core {
namespace {

using testing::Harness;
using testing::Values;

constexpr double kInf = std::numeric_limits<double>::infinity();

// An fp16 step: scale 65536, and on an overflow step the gradients the
// scaler saw hold inf, as torch's GradScaler reports them.
void Fp16(Values& v, bool overflow) {
  v.loss_scale = 65536.0;
  v.overflow = overflow;
  if (overflow) {
    v.grad_norm = kInf;
    v.nan_frac = 0.25;
  }
}

TEST_CASE("loss scale: single and sporadic overflows are tier 0 records and never halt",
          "[core][fp16]") {
  Harness h;
  h.Run(0, 3000, [](int64_t step, Values& v) {
    Fp16(v, step == 1500 || step % 400 == 7 || step == 2001 || step == 2002);
  });
  INFO(h.Dump());
  CHECK(h.Decisions(Decision::kHalt) == 0);
  CHECK(h.Decisions(Decision::kSkipUpdate) == 0);
  CHECK(h.OfTier(3).empty());
  CHECK(h.OfTier(1).empty());
  // One event per run of overflows: 2001 and 2002 are one.
  const std::vector<Event> overflows = h.OfKind(EventKind::kLossScaleOverflow);
  CHECK(overflows.size() == 10);  // 7, 407, ..., 2807 (8); 1500; 2001
  for (const Event& e : overflows) {
    CHECK(e.tier == 0);
    CHECK(e.action == Action::kRecord);
  }
}

TEST_CASE("loss scale: an overflow step's inf grad_norm stays out of the windows",
          "[core][fp16]") {
  Harness h;
  h.Run(0, 2000, [](int64_t step, Values& v) { Fp16(v, step % 2 == 1 && step > 1000); });
  // Half of the last 1,000 steps overflowed; the median is of the others.
  const double median = h.last().grad_norm_median;
  CHECK(std::isfinite(median));
  CHECK(median == Approx(1.0).epsilon(0.05));
  // A real grad spike on a clean step after them is still tier 1.
  Values spike;
  spike.loss = 3.5;
  spike.grad_norm = 5.0;
  Fp16(spike, false);
  h.Feed(2000, spike);
  CHECK(h.DecisionAt(2000) == Decision::kSkipUpdate);
}

TEST_CASE("loss scale: overflows persisting for the configured steps halt at tier 3",
          "[core][fp16]") {
  RuleConfig c;
  c.loss_scale_max_overflow_steps = 10;
  c.loss_scale_floor = 0.0;
  Harness h(c);
  h.Run(0, 1200, [](int64_t step, Values& v) { Fp16(v, step >= 1100); });
  INFO(h.Dump());
  CHECK(h.DecisionAt(1108) == Decision::kContinue);
  CHECK(h.DecisionAt(1109) == Decision::kHalt);
  const std::vector<Event> t3 = h.OfTier(3);
  REQUIRE(t3.size() == 1);
  CHECK(t3[0].kind == EventKind::kLossScaleCollapse);
  CHECK(t3[0].step == 1109);
  CHECK(t3[0].reason.find("10 loss-scale overflow steps in a row") != std::string::npos);
}

TEST_CASE("loss scale: the default persistence allows Megatron's start-up descent",
          "[core][fp16]") {
  // Megatron from 2^32 with hysteresis 2: 63 overflows in a row, halving every
  // second one, reach 2^1; the 64th would be its minimum of 1.
  Harness h;
  h.Run(0, 200, [](int64_t step, Values& v) {
    Fp16(v, step < 63);
    v.loss_scale = std::ldexp(1.0, 32 - static_cast<int>(std::min<int64_t>(step, 62) / 2));
  });
  INFO(h.Dump());
  CHECK(h.Decisions(Decision::kHalt) == 0);
  Harness stuck;
  stuck.Run(0, 200, [](int64_t, Values& v) { Fp16(v, true); });
  CHECK(stuck.DecisionAt(62) == Decision::kContinue);
  CHECK(stuck.DecisionAt(63) == Decision::kHalt);
}

TEST_CASE("loss scale: a scale below the floor halts at tier 3", "[core][fp16]") {
  RuleConfig c;
  c.loss_scale_floor = 1.0;
  Harness h(c);
  h.Run(0, 500, [](int64_t step, Values& v) {
    Fp16(v, false);
    if (step >= 400) v.loss_scale = 0.5;
  });
  INFO(h.Dump());
  CHECK(h.DecisionAt(399) == Decision::kContinue);
  CHECK(h.DecisionAt(400) == Decision::kHalt);
  const std::vector<Event> t3 = h.OfTier(3);
  REQUIRE(t3.size() == 1);
  CHECK(t3[0].kind == EventKind::kLossScaleCollapse);
  CHECK(t3[0].reason.find("below its floor 1") != std::string::npos);
}

TEST_CASE("loss scale: a NaN loss on an overflow step still halts", "[core][fp16]") {
  Harness h;
  h.Run(0, 100, [](int64_t step, Values& v) {
    Fp16(v, step == 50);
    if (step == 50) v.loss = std::nan("");
  });
  CHECK(h.DecisionAt(50) == Decision::kHalt);
  REQUIRE(h.OfTier(3).size() == 1);
  CHECK(h.OfTier(3)[0].kind == EventKind::kNonfiniteValue);
}

TEST_CASE("loss scale: without a loss scale inf gradients halt as before", "[core][fp16]") {
  // A bf16 run's record has no loss scale: the overflow flag cannot excuse it.
  Harness h;
  h.Run(0, 100, [](int64_t step, Values& v) {
    if (step == 50) {
      v.grad_norm = kInf;
      v.nan_frac = 0.25;
    }
  });
  CHECK(h.DecisionAt(50) == Decision::kHalt);
  REQUIRE(h.OfTier(3).size() == 1);
  CHECK(h.OfTier(3)[0].kind == EventKind::kNonfiniteGradients);
}

}  // namespace
}  // namespace trainwatch::core
