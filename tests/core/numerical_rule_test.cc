// Tier 3 alone: CheckNumericalFailure over a fresh EngineState and hand-made
// step facts, without RuleEngine::Judge.

#include <cmath>
#include <limits>

#include <catch2/catch.hpp>

#include "engine_state.h"

namespace trainwatch::core {
namespace {

RuleConfig Config() {
  RuleConfig c;
  c.tier3_clear_steps = 2;
  return c;
}

TEST_CASE("numerical rule: nan_frac halts once per episode and clears after clean steps",
          "[core][tier3][family]") {
  EngineState s{Config()};
  StepOutcome out;
  auto judge = [&](int64_t step, double nan_frac) {
    out.events.clear();
    out.verdict = Verdict{};
    StepRecord r;
    r.step = step;
    r.Set(Signal::kLoss, 2.5).Set(Signal::kNanFrac, nan_frac);
    StepFacts f{r};
    f.loss = 2.5;
    return CheckNumericalFailure(s, f, &out);
  };
  REQUIRE(judge(10, 0.01));
  CHECK(out.verdict.decision == Decision::kHalt);
  CHECK(out.verdict.rule == EventKind::kNonfiniteGradients);
  REQUIRE(out.events.size() == 1);
  CHECK(out.events[0].action == Action::kHalt);
  CHECK(out.events[0].tier == 3);
  // A source-less failure still says what to do about it.
  REQUIRE(out.events[0].recommended_actions.size() == 1);
  CHECK(out.events[0].recommended_actions[0].kind == RecommendedAction::Kind::kWidenPrecision);

  // The same episode: the halt stands, no second event.
  REQUIRE(judge(11, 0.02));
  CHECK(out.verdict.decision == Decision::kHalt);
  CHECK(out.events.empty());

  // One clean step does not end the episode (tier3_clear_steps = 2) ...
  CHECK_FALSE(judge(12, 0.0));
  CHECK(out.verdict.decision == Decision::kContinue);
  REQUIRE(judge(13, 0.5));
  CHECK(out.events.empty());
  // ... two do: the next failure is a new episode with its own event.
  CHECK_FALSE(judge(14, 0.0));
  CHECK_FALSE(judge(15, 0.0));
  REQUIRE(judge(16, 0.5));
  CHECK(out.events.size() == 1);
}

TEST_CASE("numerical rule: a loss explosion needs the warm-up and no gradient explanation",
          "[core][tier3][family]") {
  EngineState s{RuleConfig()};
  StepRecord r;
  r.step = 5000;
  r.Set(Signal::kLoss, 12.0).Set(Signal::kGradNorm, 1.2);
  StepFacts f{r};
  f.loss = 12.0;
  f.grad = 1.2;
  f.grad_median = 1.0;
  f.ema = 2.5;
  f.ratio = 12.0 / 2.5;
  StepOutcome out;

  SECTION("warm, grad within 3x its median: halt") {
    f.warm = true;
    REQUIRE(CheckNumericalFailure(s, f, &out));
    CHECK(out.verdict.rule == EventKind::kLossExplosion);
    REQUIRE(out.events.size() == 1);
    CHECK(out.events[0].reason.find("no gradient explanation") != std::string::npos);
  }
  SECTION("a grad-norm outlier explains it: no halt") {
    f.warm = true;
    f.grad = 3.5;
    CHECK_FALSE(CheckNumericalFailure(s, f, &out));
    CHECK(out.events.empty());
    CHECK(out.verdict.decision == Decision::kContinue);
  }
  SECTION("still warming up: no halt") {
    CHECK_FALSE(CheckNumericalFailure(s, f, &out));
    CHECK(out.events.empty());
  }
}

TEST_CASE("numerical rule: names the worst source tensors first", "[core][tier3][family]") {
  EngineState s{RuleConfig()};
  const TensorStat tensors[] = {{"layer.0.mlp", 0.0, 3, 100},
                                {"layer.1.attn", 0.0, 0, 100},
                                {"layer.2.mlp", 0.0, 40, 100}};
  StepRecord r;
  r.step = 7;
  r.Set(Signal::kLoss, std::numeric_limits<double>::infinity());
  r.tensors = tensors;
  StepFacts f{r};
  f.loss = r.Get(Signal::kLoss);
  StepOutcome out;
  REQUIRE(CheckNumericalFailure(s, f, &out));
  CHECK(out.verdict.rule == EventKind::kNonfiniteValue);
  REQUIRE(out.events.size() == 1);
  const Event& e = out.events[0];
  CHECK(e.reason.find("source tensors: layer.2.mlp (40 of 100 nonfinite), layer.0.mlp") !=
        std::string::npos);
  CHECK(e.reason.find("layer.1.attn") == std::string::npos);
  REQUIRE(e.recommended_actions.size() == 2);
  CHECK(e.recommended_actions[0].tensor == "layer.2.mlp");
  CHECK(e.recommended_actions[1].tensor == "layer.0.mlp");
}

}  // namespace
}  // namespace trainwatch::core
