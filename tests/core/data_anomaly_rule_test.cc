// Tier 1 alone: CheckDataAnomaly over a fresh EngineState and hand-made step
// facts, without RuleEngine::Judge.

#include <catch2/catch.hpp>

#include "engine_state.h"

namespace trainwatch::core {
namespace {

// A warm step at `step` with the given loss over an EMA of 2.0 and the given
// grad norm over a median of 1.0; the noise scale is known and small.
StepFacts Facts(const StepRecord& r, double loss, double grad) {
  StepFacts f{r};
  f.warm = true;
  f.loss = loss;
  f.grad = grad;
  f.ema = 2.0;
  f.grad_median = 1.0;
  f.ratio = loss / 2.0;
  f.dev = loss - 2.0;
  f.sigma = 0.01;
  f.sigma_ok = true;
  return f;
}

TEST_CASE("data anomaly rule: a grad outlier with a loss jump skips and opens an episode",
          "[core][tier1][family]") {
  EngineState s{RuleConfig()};
  const uint64_t shard = 4242;
  StepRecord r;
  r.step = 3000;
  r.shards = absl::MakeConstSpan(&shard, 1);
  s.RecordShards(r);
  s.AddCheckpoint(2000, "ckpt://2000");
  StepOutcome out;
  // Ratio 1.6 > 1.5 and grad 10x its median.
  REQUIRE(CheckDataAnomaly(s, Facts(r, 3.2, 10.0), &out));
  CHECK(out.verdict.decision == Decision::kSkipUpdate);
  CHECK(out.verdict.tier == 1);
  CHECK(out.verdict.rule == EventKind::kDataAnomaly);
  REQUIRE(out.events.size() == 1);
  const Event& e = out.events[0];
  CHECK(e.action == Action::kSkipUpdate);
  CHECK(e.onset_step == 3000);
  CHECK(e.shards == std::vector<uint64_t>{4242});
  CHECK(e.recommended_checkpoint_step == 2000);
  CHECK(s.ep.active);
  CHECK(s.ep.tier1);
  CHECK(s.ep.pre_level == 2.0);
  CHECK(e.episode == s.ep.id);
}

TEST_CASE("data anomaly rule: a grad outlier alone - no loss jump - does not fire",
          "[core][tier1][family]") {
  EngineState s{RuleConfig()};
  StepRecord r;
  r.step = 3000;
  StepOutcome out;
  // Grad 10x its median, but the loss is +0.05 nats (below spike_delta).
  CHECK_FALSE(CheckDataAnomaly(s, Facts(r, 2.05, 10.0), &out));
  CHECK(out.events.empty());
  CHECK(out.verdict.decision == Decision::kContinue);
  CHECK_FALSE(s.ep.active);
}

TEST_CASE("data anomaly rule: a loss ratio above 2 skips without a grad outlier",
          "[core][tier1][family]") {
  EngineState s{RuleConfig()};
  StepRecord r;
  r.step = 3000;
  StepOutcome out;
  REQUIRE(CheckDataAnomaly(s, Facts(r, 4.2, 1.0), &out));
  CHECK(out.verdict.rule == EventKind::kLossRatioSkip);
  REQUIRE(out.events.size() == 1);
  CHECK(out.events[0].reason.find("without a grad-norm outlier") != std::string::npos);
}

TEST_CASE("data anomaly rule: without skip-on-trigger a tier 1 is recorded - update kept",
          "[core][tier1][family]") {
  RuleConfig c;
  c.tier1_skip_on_trigger = false;
  EngineState s{c};
  StepRecord r;
  r.step = 3000;
  StepOutcome out;
  CHECK_FALSE(CheckDataAnomaly(s, Facts(r, 3.2, 10.0), &out));
  CHECK(out.verdict.decision == Decision::kContinue);
  REQUIRE(out.events.size() == 1);
  CHECK(out.events[0].action == Action::kRecord);
  CHECK(s.ep.tier1);
}

}  // namespace
}  // namespace trainwatch::core
