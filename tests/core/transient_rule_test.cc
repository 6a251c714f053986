// The transient alone: FeedTransient over a fresh EngineState and hand-made
// losses, without RuleEngine::Judge.

#include <catch2/catch.hpp>

#include "engine_state.h"

namespace trainwatch::core {
namespace {

// A loss of 2.5 with a deterministic +-0.02 wobble, so the local noise is
// known and nonzero.
double Calm(int64_t i) { return 2.5 + 0.01 * static_cast<double>(i % 5 - 2); }

class TransientFeed {
 public:
  // Feeds `n` records of `loss(i)` and returns the transients reported.
  template <typename F>
  std::vector<Event> Feed(int n, F loss, bool quiet = false) {
    std::vector<Event> events;
    for (int k = 0; k < n; ++k, ++step_) {
      StepRecord r;
      r.step = step_;
      out_.events.clear();
      FeedTransient(s_, r, loss(step_), quiet, &out_);
      events.insert(events.end(), out_.events.begin(), out_.events.end());
    }
    return events;
  }
  int64_t step() const { return step_; }

 private:
  EngineState s_{RuleConfig()};
  StepOutcome out_;
  int64_t step_ = 0;
};

TEST_CASE("transient rule: a calm loss reports nothing", "[core][transient][family]") {
  TransientFeed t;
  CHECK(t.Feed(400, Calm).empty());
}

TEST_CASE("transient rule: a short excursion is reported once - at its onset",
          "[core][transient][family]") {
  TransientFeed t;
  REQUIRE(t.Feed(200, Calm).empty());
  const int64_t onset = t.step();
  const auto events = t.Feed(8, [](int64_t) { return 2.9; });
  REQUIRE(events.size() == 1);
  CHECK(events[0].kind == EventKind::kTransient);
  CHECK(events[0].tier == 0);
  CHECK(events[0].action == Action::kRecord);
  CHECK(events[0].onset_step == onset);
  // Still high: no second report while the condition holds.
  CHECK(t.Feed(4, [](int64_t) { return 2.9; }).empty());
}

TEST_CASE("transient rule: quiet suppresses the report - the rising edge is spent",
          "[core][transient][family]") {
  TransientFeed t;
  REQUIRE(t.Feed(200, Calm).empty());
  CHECK(t.Feed(8, [](int64_t) { return 2.9; }, /*quiet=*/true).empty());
  // The excursion goes on after the quiet steps: it is the same one.
  CHECK(t.Feed(4, [](int64_t) { return 2.9; }).empty());
}

}  // namespace
}  // namespace trainwatch::core
