// The engine-snapshot property, shared by the core tests (random traces) and
// the cli tests (the real logs): an engine saved after any prefix of a trace
// and restored (RuleEngine::SaveState / FromState) decides on the rest of the
// trace exactly as the engine that was never saved, event for event and bit
// for bit, and ends in the same state.

#ifndef TRAINWATCH_TESTS_TESTING_ENGINE_ROUNDTRIP_H_
#define TRAINWATCH_TESTS_TESTING_ENGINE_ROUNDTRIP_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "trainwatch/core/rule_engine.h"

namespace trainwatch::testing {

inline void AppendBits(std::string* out, double v) {
  char b[sizeof v];
  std::memcpy(b, &v, sizeof v);
  out->append(b, sizeof v);
}

// Everything an outcome says, as bytes: two outcomes are equal when these are.
inline std::string Fingerprint(const core::StepOutcome& o) {
  std::string s = absl::StrCat(static_cast<int>(o.verdict.decision), "/", o.verdict.tier, "/",
                               static_cast<int>(o.verdict.rule), "/", o.warming_up, "|");
  AppendBits(&s, o.loss_ema_ratio);
  AppendBits(&s, o.loss_ema);
  AppendBits(&s, o.grad_norm_median);
  for (const core::Event& e : o.events) {
    absl::StrAppend(&s, "|", e.step, ",", e.onset_step, ",", e.tier, ",",
                    static_cast<int>(e.action), ",", static_cast<int>(e.kind), ",", e.episode, ",",
                    e.reason, ",", e.shards_truncated, ",", e.recommended_checkpoint_step, ",",
                    e.recommended_checkpoint_uri, ",", e.closes_episode, ",", e.lacked_signals);
    for (uint64_t id : e.shards) absl::StrAppend(&s, ";", id);
    for (const std::string& n : e.shard_names) absl::StrAppend(&s, ";", n);
    for (const core::RecommendedAction& a : e.recommended_actions) {
      absl::StrAppend(&s, ";", static_cast<int>(a.kind), ":", a.text);
    }
    for (double v : {e.loss, e.loss_ema, e.loss_ema_ratio, e.grad_norm, e.grad_norm_median,
                     e.log_z}) {
      AppendBits(&s, v);
    }
  }
  return s;
}

struct RoundTripResult {
  size_t events_after_cut = 0;  // so a caller can insist the comparison saw some
};

// Feeds records [0, n) (record(i) gives the i-th) to one engine, and to a
// second one that is saved and restored before record `cut`; REQUIREs that
// every outcome from `cut` on and the final states are identical.
inline RoundTripResult CheckRoundTrip(const core::RuleConfig& config, size_t n, size_t cut,
                                      const std::function<core::StepRecord(size_t)>& record) {
  RoundTripResult result;
  core::RuleEngine lived(config);
  auto saved = std::make_unique<core::RuleEngine>(config);
  core::StepOutcome a, b;
  for (size_t i = 0; i < n; ++i) {
    if (i == cut) {
      const std::string blob = saved->SaveState();
      absl::StatusOr<std::unique_ptr<core::RuleEngine>> restored =
          core::RuleEngine::FromState(config, blob);
      REQUIRE(restored.ok());
      // The restored engine saves to the same bytes: nothing was lost.
      REQUIRE((*restored)->SaveState() == blob);
      REQUIRE((*restored)->last_step() == saved->last_step());
      saved = *std::move(restored);
    }
    const core::StepRecord r = record(i);
    const bool took_a = lived.Judge(r, &a).ok();
    const bool took_b = saved->Judge(r, &b).ok();
    REQUIRE(took_a == took_b);
    if (!took_a || i < cut) continue;
    INFO("record " << i << " (step " << r.step << "), cut at " << cut);
    REQUIRE(Fingerprint(a) == Fingerprint(b));
    result.events_after_cut += a.events.size();
  }
  REQUIRE(lived.SaveState() == saved->SaveState());
  return result;
}

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_TESTING_ENGINE_ROUNDTRIP_H_
