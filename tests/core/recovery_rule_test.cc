// The end of an episode alone: CheckRecovery over an EngineState with a
// hand-opened episode and hand-made step facts, without RuleEngine::Judge.

#include <catch2/catch.hpp>

#include "engine_state.h"

namespace trainwatch::core {
namespace {

// A tier 1 episode opened at step 100 over a pre-spike level of 2.0.
EngineState WithTier1Episode() {
  EngineState s{RuleConfig()};
  s.OpenEpisode(100, 2.0);
  s.ep.tier1 = true;
  s.ep.tier1_step = 100;
  s.ep.tier = 1;
  return s;
}

size_t Recover(EngineState& s, int64_t step, double loss, uint64_t before, StepOutcome* out) {
  StepRecord r;
  r.step = step;
  StepFacts f{r};
  f.loss = loss;  // no smoothed loss yet: the rule reads this step's
  out->events.clear();
  CheckRecovery(s, f, before, out);
  return out->events.size();
}

TEST_CASE("recovery rule: a tier 1 back at its baseline is confirmed and closes",
          "[core][recovery][family]") {
  EngineState s = WithTier1Episode();
  StepOutcome out;
  REQUIRE(Recover(s, 150, 2.05, s.ep.id, &out) == 1);
  CHECK(out.events[0].kind == EventKind::kTier1Confirmed);
  CHECK(out.events[0].closes_episode);
  CHECK(out.events[0].onset_step == 100);
  CHECK_FALSE(s.ep.active);
}

TEST_CASE("recovery rule: a tier 1 returning toward baseline is confirmed - still open",
          "[core][recovery][family]") {
  EngineState s = WithTier1Episode();
  const uint64_t id = s.ep.id;
  StepOutcome out;
  // Excess 0.5 sets the peak and is neither back nor returning.
  CHECK(Recover(s, 110, 2.5, id, &out) == 0);
  CHECK(s.ep.peak_excess == 0.5);
  // 0.4 is above 0.75 x the peak: not yet.
  CHECK(Recover(s, 120, 2.4, id, &out) == 0);
  // 0.3 is: confirmed, the episode stays open until the loss is back.
  REQUIRE(Recover(s, 130, 2.3, id, &out) == 1);
  CHECK(out.events[0].kind == EventKind::kTier1Confirmed);
  CHECK_FALSE(out.events[0].closes_episode);
  CHECK(s.ep.active);
  // Back: confirmed already, so this is the plain recovery.
  REQUIRE(Recover(s, 140, 2.05, id, &out) == 1);
  CHECK(out.events[0].kind == EventKind::kRecovered);
  CHECK(out.events[0].tier == 1);
  CHECK(out.events[0].closes_episode);
}

TEST_CASE("recovery rule: an episode opened on this step does not recover on it",
          "[core][recovery][family]") {
  EngineState s = WithTier1Episode();
  StepOutcome out;
  CHECK(Recover(s, 100, 2.0, /*before=*/0, &out) == 0);
  CHECK(s.ep.active);
  CHECK(s.ep.peak_excess == 0.0);
}

TEST_CASE("recovery rule: a rising log_z holds the recovery of a paged episode",
          "[core][recovery][family]") {
  EngineState s{RuleConfig()};
  s.OpenEpisode(100, 2.0);
  s.ep.spike = true;
  s.ep.paged = true;
  s.ep.tier = 2;
  StepRecord r;
  r.step = 700;
  StepFacts f{r};
  f.loss = 2.0;
  f.rise_long = 3.5;
  StepOutcome out;
  CheckRecovery(s, f, s.ep.id, &out);
  CHECK(out.events.empty());
  f.rise_long = 1.0;
  CheckRecovery(s, f, s.ep.id, &out);
  REQUIRE(out.events.size() == 1);
  CHECK(out.events[0].kind == EventKind::kRecovered);
  CHECK(out.events[0].tier == 2);
}

}  // namespace
}  // namespace trainwatch::core
