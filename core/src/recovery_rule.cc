// The end of an episode: a tier 1 confirmed (the loss returning toward its
// baseline within tier1_confirm_steps), or the loss back at its pre-spike
// level. Either closes the episode when the loss is fully back.

#include <algorithm>

#include "absl/strings/str_format.h"
#include "engine_state.h"

namespace trainwatch::core {

namespace {

void CloseEpisode(EngineState& s, Event* e) {
  e->closes_episode = true;
  s.ep.active = false;
  s.above_start = -1;
}

}  // namespace

void CheckRecovery(EngineState& s, const StepFacts& f, uint64_t episode_before,
                   StepOutcome* out) {
  // An episode opened by this very step has nothing to recover from yet.
  if (episode_before == 0 || !s.ep.active || s.ep.id != episode_before) return;
  const RuleConfig& c = s.c;
  const StepRecord& r = f.r;
  Episode& ep = s.ep;
  const double sl = s.smooth_loss.empty() ? f.loss : s.smooth_loss.Value();
  const double ex = sl - ep.pre_level;
  ep.peak_excess = std::max(ep.peak_excess, ex);
  const bool logz_active = f.rise_short > c.logz_rise || (f.rise_long > c.logz_rise && ep.paged);
  // Both the smoothed and this step's loss must be back: the smoothed one
  // alone lags a level shift by ~10 steps.
  const bool recovered = ex < c.spike_delta_nats &&
                         f.loss - ep.pre_level < c.spike_delta_nats && !logz_active;
  const bool in_confirm = ep.tier1 && r.step - ep.tier1_step <= c.tier1_confirm_steps;
  if (ep.tier1 && !ep.confirmed && in_confirm &&
      (recovered || (ep.peak_excess > 0.0 && ex <= c.tier1_confirm_fraction * ep.peak_excess))) {
    ep.confirmed = true;
    Event& e = s.NewEvent(out, r, 1, Action::kNone, EventKind::kTier1Confirmed, ep.id, ep.onset);
    e.reason = recovered
                   ? absl::StrFormat(
                         "data anomaly confirmed: the loss is back at its baseline %.3f "
                         "%d steps after step %d",
                         ep.pre_level, r.step - ep.tier1_step, ep.tier1_step)
                   : absl::StrFormat(
                         "data anomaly confirmed: the loss is returning toward its "
                         "baseline %d steps after step %d (excess %+.3f nats, peak %+.3f)",
                         r.step - ep.tier1_step, ep.tier1_step, ex, ep.peak_excess);
    s.RecommendCheckpoint(&e);
    if (recovered) CloseEpisode(s, &e);
  } else if (recovered) {
    Event& e =
        s.NewEvent(out, r, ep.tier, Action::kNone, EventKind::kRecovered, ep.id, ep.onset);
    e.reason = absl::StrFormat(
        "recovered: the smoothed loss %.3f is back within %.2f nats of its pre-spike "
        "level %.3f after %d steps",
        sl, c.spike_delta_nats, ep.pre_level, r.step - ep.onset);
    CloseEpisode(s, &e);
  }
}

}  // namespace trainwatch::core
