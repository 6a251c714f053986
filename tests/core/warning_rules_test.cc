// The early warnings alone: CheckWarnings over an EngineState whose bucket
// histories are filled by hand, without RuleEngine::Judge.

#include <functional>

#include <catch2/catch.hpp>

#include "engine_state.h"

namespace trainwatch::core {
namespace {

// Histories of 10-step buckets (warn_logz_rising_steps / 5 = 10 for the
// attention and activation histories).
RuleConfig Config() {
  RuleConfig c;
  c.warn_logz_rising_steps = 50;
  return c;
}

class WarningFeed {
 public:
  // Steps [from, to): `fill` adds the step's values to the histories, then
  // the warnings are checked as Judge does. Returns the warnings raised.
  std::vector<Event> Feed(int64_t from, int64_t to,
                          const std::function<void(EngineState&, int64_t)>& fill) {
    std::vector<Event> events;
    for (int64_t step = from; step < to; ++step) {
      StepRecord r;
      r.step = step;
      out_.events.clear();
      const WarningMarks marks = MarkWarnings(s_);
      fill(s_, step);
      CheckWarnings(s_, r, marks, &out_);
      events.insert(events.end(), out_.events.begin(), out_.events.end());
    }
    return events;
  }
  EngineState& state() { return s_; }

 private:
  EngineState s_{Config()};
  StepOutcome out_;
};

// 10% higher every 10-step bucket.
double Rising(int64_t step) { return 100.0 * (1.0 + 0.1 * static_cast<double>(step / 10)); }

TEST_CASE("warning rules: attention logits rising for five buckets warn once",
          "[core][warnings][family]") {
  WarningFeed w;
  const auto events = w.Feed(0, 100, [](EngineState& s, int64_t step) {
    s.attn_hist.Add(step, Rising(step));
  });
  REQUIRE(events.size() == 1);
  CHECK(events[0].kind == EventKind::kWarnAttentionLogits);
  CHECK(events[0].action == Action::kWarn);
  // The first evaluation over five complete buckets (0..4): when step 50
  // opens bucket 5.
  CHECK(events[0].step == 50);
  CHECK(events[0].onset_step == 0);
}

TEST_CASE("warning rules: a plateau does not warn", "[core][warnings][family]") {
  WarningFeed w;
  CHECK(w.Feed(0, 100, [](EngineState& s, int64_t step) {
          s.attn_hist.Add(step, step < 30 ? Rising(step) : Rising(30));
        }).empty());
}

TEST_CASE("warning rules: activations rising below the floor do not warn - above it they do",
          "[core][warnings][family]") {
  WarningFeed low;
  CHECK(low.Feed(0, 100, [](EngineState& s, int64_t step) {
          s.act_hist.Add(step, Rising(step));  // 100 .. 200: under the 1e3 floor
        }).empty());
  WarningFeed high;
  const auto events = high.Feed(0, 100, [](EngineState& s, int64_t step) {
    s.act_hist.Add(step, 20.0 * Rising(step));  // 2e3 and on course past 1e4
  });
  REQUIRE(events.size() == 1);
  CHECK(events[0].kind == EventKind::kWarnActivations);
}

TEST_CASE("warning rules: a paged episode silences the grad-median warning",
          "[core][warnings][family]") {
  // grad_hist buckets are warn_grad_median_window_steps / 10 = 1,000 steps.
  auto fill = [](EngineState& s, int64_t step) {
    s.grad_hist.Add(step, 1.0 + 0.2 * static_cast<double>(step / 1000));
  };
  WarningFeed plain;
  const auto events = plain.Feed(0, 12001, fill);
  REQUIRE(events.size() == 1);
  CHECK(events[0].kind == EventKind::kWarnGradMedian);

  WarningFeed paged;
  paged.state().OpenEpisode(0, 2.0);
  paged.state().ep.paged = true;
  CHECK(paged.Feed(0, 12001, fill).empty());
}

}  // namespace
}  // namespace trainwatch::core
