// The loss spike and tier 2 alone: TrackSpike and CheckPage over a fresh
// EngineState and hand-made step facts, without RuleEngine::Judge.

#include <catch2/catch.hpp>

#include "engine_state.h"

namespace trainwatch::core {
namespace {

RuleConfig Config() {
  RuleConfig c;
  c.spike_min_steps = 3;
  return c;
}

// A warm step with loss `loss` over an EMA of 2.0.
StepFacts Facts(const StepRecord& r, double loss) {
  StepFacts f{r};
  f.warm = true;
  f.loss = loss;
  f.ema = 2.0;
  f.ratio = loss / 2.0;
  f.dev = loss - 2.0;
  return f;
}

TEST_CASE("spike rule: more than spike_min_steps above the EMA opens an episode",
          "[core][spike][family]") {
  EngineState s{Config()};
  StepOutcome out;
  std::vector<int64_t> spike_steps;
  for (int64_t step = 100; step < 106; ++step) {
    StepRecord r;
    r.step = step;
    out.events.clear();
    const bool spike = TrackSpike(s, Facts(r, 2.2), &out);
    s.prev_loss_step = step;  // what Judge does after the rules
    if (spike) spike_steps.push_back(step);
    // Three steps above the EMA are not yet a spike; the fourth is.
    if (step == 103) {
      REQUIRE(out.events.size() == 1);
      CHECK(out.events[0].kind == EventKind::kSpike);
      CHECK(out.events[0].onset_step == 100);
    } else {
      CHECK(out.events.empty());
    }
  }
  CHECK(spike_steps == std::vector<int64_t>{103, 104, 105});
  CHECK(s.ep.active);
  CHECK(s.ep.spike);
  CHECK(s.ep.onset == 100);
  CHECK(s.ep.pre_level == 2.0);
}

TEST_CASE("spike rule: records below the delta end the run after the gap",
          "[core][spike][family]") {
  EngineState s{Config()};
  StepOutcome out;
  int64_t step = 100;
  auto feed = [&](double loss) {
    StepRecord r;
    r.step = step++;
    const bool spike = TrackSpike(s, Facts(r, loss), &out);
    s.prev_loss_step = r.step;
    return spike;
  };
  for (int i = 0; i < 3; ++i) CHECK_FALSE(feed(2.2));
  for (int i = 0; i < 3; ++i) CHECK_FALSE(feed(2.0));  // 3 > spike_gap_records
  for (int i = 0; i < 3; ++i) CHECK_FALSE(feed(2.2));  // a new run starts over
  CHECK(out.events.empty());
  CHECK_FALSE(s.ep.active);
}

TEST_CASE("page rule: loss_ema_ratio above 2.5 for 3 records pages once - 2 do not",
          "[core][tier2][family]") {
  EngineState s{RuleConfig()};
  StepOutcome out;
  auto page = [&](int64_t step, double loss) {
    StepRecord r;
    r.step = step;
    out.events.clear();
    CheckPage(s, Facts(r, loss), /*spike=*/false, &out);
    return out.events.size();
  };
  CHECK(page(200, 5.2) == 0);
  CHECK(page(201, 5.2) == 0);
  CHECK(page(202, 4.0) == 0);  // ratio 2.0 breaks the run
  CHECK(page(203, 5.2) == 0);
  CHECK(page(204, 5.2) == 0);
  REQUIRE(page(205, 5.2) == 1);
  const Event& e = out.events[0];
  CHECK(e.kind == EventKind::kLossRatioHigh);
  CHECK(e.tier == 2);
  CHECK(e.action == Action::kPage);
  CHECK(e.onset_step == 203);
  CHECK(s.ep.paged);
  // The episode is paged: the same condition pages no more.
  CHECK(page(206, 5.2) == 0);
}

TEST_CASE("page rule: a fast log_z rise pages with a z-loss recommendation",
          "[core][tier2][family]") {
  EngineState s{RuleConfig()};
  StepRecord r;
  r.step = 5000;
  StepFacts f = Facts(r, 2.0);
  StepOutcome out;
  SECTION("a rise of 3.5 within the short window") {
    f.rise_short = 3.5;
    CheckPage(s, f, /*spike=*/false, &out);
    REQUIRE(out.events.size() == 1);
    CHECK(out.events[0].kind == EventKind::kLogZRise);
    bool zloss = false;
    for (const auto& a : out.events[0].recommended_actions) {
      zloss |= a.kind == RecommendedAction::Kind::kSetZLossAlpha;
    }
    CHECK(zloss);
  }
  SECTION("a rise of 3.5 over the long window without a spike does not page") {
    f.rise_long = 3.5;
    CheckPage(s, f, /*spike=*/false, &out);
    CHECK(out.events.empty());
    CHECK_FALSE(s.ep.active);
  }
  SECTION("the same long rise during a spike is a drift") {
    f.rise_long = 3.5;
    CheckPage(s, f, /*spike=*/true, &out);
    REQUIRE(out.events.size() == 1);
    CHECK(out.events[0].kind == EventKind::kLogZDrift);
  }
}

}  // namespace
}  // namespace trainwatch::core
