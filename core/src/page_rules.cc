// The loss spike and tier 2 (their triggers are inline, in engine_state.h). A spike (loss >= spike_delta over its EMA for
// more than spike_min_steps) opens an episode and warns; tier 2 pages a human
// once per episode, when the loss will not come back or log_z is running
// away, with the diagnosis (who led, since when) and what to roll back to.

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine_state.h"

namespace trainwatch::core {

namespace {

// Where the current log_z rise began: the step after the last bucket whose
// mean sat within the tolerance of the lowest bucket of the trend history.
// Returns `now` when log_z is at its minimum (no rise).
int64_t LogZOnset(const EngineState& s, int64_t now, double* rise_from_min) {
  const BucketSeries& buckets = s.logz_buckets;
  const size_t n = buckets.capacity();
  double lo = std::numeric_limits<double>::infinity();
  for (size_t b = 0; b < n; ++b) {
    const auto& bk = buckets.Back(b);
    if (bk.index < 0) break;
    if (bk.count > 0) lo = std::min(lo, bk.mean());
  }
  *rise_from_min = Finite(lo) ? s.smooth_logz.Value() - lo : 0.0;
  if (!Finite(lo)) return now;
  for (size_t b = 0; b < n; ++b) {
    const auto& bk = buckets.Back(b);
    if (bk.index < 0) break;
    if (bk.count > 0 && bk.mean() <= lo + s.c.logz_onset_tolerance) {
      return b == 0 ? now : (bk.index + 1) * buckets.width();
    }
  }
  return now;
}

}  // namespace

void ReportSpike(EngineState& s, const StepFacts& f, StepOutcome* out) {
  const RuleConfig& c = s.c;
  const StepRecord& r = f.r;
  s.OpenEpisode(s.above_start, s.above_start_level);
  s.ep.spike = true;
  Event& e = s.NewEvent(out, r, 0, Action::kWarn, EventKind::kSpike, s.ep.id, s.above_start);
  e.reason = absl::StrFormat(
      "loss spike: %d steps at >= %.2f nats over the EMA (loss %.3f, pre-spike "
      "level %.3f); recovery expected within %d steps",
      s.above_steps, c.spike_delta_nats, f.loss, s.above_start_level, c.escalate_steps);
  s.CollectShards(s.above_start - c.shard_steps_before_onset, r.step, &e);
  s.RecommendCheckpoint(&e);
}

void Page(EngineState& s, const StepFacts& f, const PageCauses& causes, StepOutcome* out) {
  const RuleConfig& c = s.c;
  const StepRecord& r = f.r;
  const bool t2_ratio = causes.ratio, t2_logz_fast = causes.logz_fast,
             t2_logz_drift = causes.logz_drift, t2_nonrecovering = causes.nonrecovering;
  const double excess = causes.excess;
  double logz_rise_from_min = 0.0;
  const int64_t logz_onset = (s.ever_present & Bit(Signal::kLogZ))
                                 ? LogZOnset(s, r.step, &logz_rise_from_min)
                                 : r.step;
  const int64_t loss_onset =
      s.ep.active ? s.ep.onset
                  : (t2_ratio ? s.high_ratio_start
                              : (s.above_start >= 0 ? s.above_start : r.step));
  const bool logz_led = t2_logz_fast || t2_logz_drift ||
                        (logz_rise_from_min >= c.logz_led_min_rise && logz_onset < loss_onset);
  if (!s.ep.active) s.OpenEpisode(std::min(loss_onset, r.step), f.ema);
  s.ep.paged = true;
  s.ep.tier = 2;
  const int64_t onset = logz_led ? std::min(logz_onset, s.ep.onset) : s.ep.onset;
  const EventKind kind = t2_logz_drift  ? EventKind::kLogZDrift
                         : t2_logz_fast ? EventKind::kLogZRise
                         : t2_ratio     ? EventKind::kLossRatioHigh
                                        : EventKind::kNonRecovering;
  Event& e = s.NewEvent(out, r, 2, Action::kPage, kind, s.ep.id, onset);
  std::vector<std::string> why;
  if (t2_logz_drift) {
    why.push_back(absl::StrFormat(
        "log_z rose %.2f within %d steps while the loss is in a spike (%+.3f nats "
        "over its EMA for %d steps)",
        f.rise_long, c.logz_drift_window_steps, f.dev, s.above_steps));
  }
  if (t2_logz_fast) {
    why.push_back(absl::StrFormat("log_z rose %.2f within %d steps", f.rise_short,
                                  c.logz_rise_window_steps));
  }
  if (t2_ratio) {
    why.push_back(absl::StrFormat("loss_ema_ratio %.2f above %.1f for %d records",
                                  f.ratio, c.tier2_loss_ratio, s.high_ratio_records));
  }
  if (t2_nonrecovering) {
    why.push_back(absl::StrFormat(
        "loss has not returned to its pre-spike level %.3f in %d steps (smoothed "
        "excess %+.3f nats)",
        s.ep.pre_level, r.step - s.ep.onset, excess));
  }
  e.reason = absl::StrCat(
      logz_led ? "logit drift: " : "non-recovering loss: ", absl::StrJoin(why, "; "));
  if (logz_led) {
    absl::StrAppendFormat(&e.reason, "; log_z led (rising since step %d)", logz_onset);
  }
  s.AddEvidence(s.ep.onset - c.shard_steps_before_onset, r.step,
                RecommendedAction::Kind::kQuarantineShards, &e);
  if (logz_led) s.AddZLossAction(r.Get(Signal::kZLossAlpha), &e);
}

}  // namespace trainwatch::core
