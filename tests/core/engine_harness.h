// A small harness for driving the rule engine through synthetic runs in
// tests: a stable baseline with seeded noise, a hook to shape each step, and
// the events and verdicts collected per step.

#ifndef TRAINWATCH_TESTS_CORE_ENGINE_HARNESS_H_
#define TRAINWATCH_TESTS_CORE_ENGINE_HARNESS_H_

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainwatch/core/rule_engine.h"

namespace trainwatch::core::testing {

struct Values {
  double loss = 2.5;
  double grad_norm = 1.0;
  double log_z = 8.0;
  double nan_frac = 0.0;
  bool has_grad = true;
  bool has_log_z = true;
  bool has_nan_frac = true;
  // Extra signals, set only when finite-or-nonfinite values are wanted.
  std::map<Signal, double> extra;
  std::vector<TensorStat> tensors;
  // fp16 runs: the loss scale (NaN: no loss scale, a bf16/fp32 run) and
  // whether the scaler overflowed on the step.
  double loss_scale = std::nan("");
  bool overflow = false;
};

class Harness {
 public:
  explicit Harness(RuleConfig config = RuleConfig(), uint64_t seed = 7)
      : engine_(config), rng_(seed) {}

  // Feeds steps [from, to) with the baseline (loss 2.5 +- 0.01, grad 1.0 with
  // 5% multiplicative noise, log_z 8 +- 0.1), shaped by `shape`.
  void Run(int64_t from, int64_t to,
           const std::function<void(int64_t, Values&)>& shape = nullptr) {
    std::normal_distribution<double> n(0.0, 1.0);
    for (int64_t step = from; step < to; ++step) {
      Values v;
      v.loss = 2.5 + 0.01 * n(rng_);
      v.grad_norm = std::exp(0.05 * n(rng_));
      v.log_z = 8.0 + 0.1 * n(rng_);
      if (shape) shape(step, v);
      Feed(step, v);
    }
  }

  void Feed(int64_t step, const Values& v) {
    StepRecord r;
    r.step = step;
    r.Set(Signal::kLoss, v.loss);
    if (v.has_grad) r.Set(Signal::kGradNorm, v.grad_norm);
    if (v.has_log_z) r.Set(Signal::kLogZ, v.log_z);
    if (v.has_nan_frac) r.Set(Signal::kNanFrac, v.nan_frac);
    for (const auto& [s, x] : v.extra) r.Set(s, x);
    if (!std::isnan(v.loss_scale)) r.SetLossScale(v.loss_scale, v.overflow);
    const uint64_t shard = 1000000 + static_cast<uint64_t>(step);
    r.shards = absl::MakeConstSpan(&shard, 1);
    const std::string uri = absl::StrFormat("ckpt://test/%d", step);
    if (step % 1000 == 0) r.checkpoint_uri = uri;
    r.tensors = v.tensors;
    REQUIRE(engine_.Judge(r, &out_).ok());
    if (out_.verdict.decision != Decision::kContinue) verdicts_[step] = out_.verdict;
    for (const Event& e : out_.events) events_.push_back(e);
  }

  const std::vector<Event>& events() const { return events_; }
  std::vector<Event> Where(const std::function<bool(const Event&)>& pred) const {
    std::vector<Event> out;
    for (const Event& e : events_) {
      if (pred(e)) out.push_back(e);
    }
    return out;
  }
  std::vector<Event> OfTier(int tier) const {
    return Where([tier](const Event& e) { return e.tier == tier; });
  }
  std::vector<Event> OfKind(EventKind k) const {
    return Where([k](const Event& e) { return e.kind == k; });
  }
  Decision DecisionAt(int64_t step) const {
    auto it = verdicts_.find(step);
    return it == verdicts_.end() ? Decision::kContinue : it->second.decision;
  }
  size_t Decisions(Decision d) const {
    size_t n = 0;
    for (const auto& [s, v] : verdicts_) n += v.decision == d;
    return n;
  }
  RuleEngine& engine() { return engine_; }
  const StepOutcome& last() const { return out_; }

  // All events, one per line, for failure messages.
  std::string Dump() const {
    std::string s;
    for (const Event& e : events_) {
      absl::StrAppendFormat(&s, "%d t%d %s %s onset=%d: %s\n", e.step, e.tier,
                            ActionName(e.action), EventKindName(e.kind), e.onset_step, e.reason);
    }
    return s.empty() ? "(no events)" : s;
  }

 private:
  RuleEngine engine_;
  std::mt19937_64 rng_;
  StepOutcome out_;
  std::vector<Event> events_;
  std::map<int64_t, Verdict> verdicts_;
};

}  // namespace trainwatch::core::testing

#endif  // TRAINWATCH_TESTS_CORE_ENGINE_HARNESS_H_
