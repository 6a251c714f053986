// Tier 1: data anomaly, skip and continue. A grad-norm outlier together with
// a loss jump is a bad batch; a loss ratio past skip_loss_ratio is skipped
// even without the outlier. Either opens (or joins) the loss episode, so a
// tier 1 that does not recover escalates within the same incident. The
// trigger is inline in engine_state.h; this writes the event.

#include <algorithm>

#include "absl/strings/str_format.h"
#include "engine_state.h"

namespace trainwatch::core {

bool ReportDataAnomaly(EngineState& s, const StepFacts& f, bool tier1, double grad_ratio,
                       StepOutcome* out) {
  const RuleConfig& c = s.c;
  const StepRecord& r = f.r;
  const double g = f.grad, med = f.grad_median, dev = f.dev, sigma = f.sigma;
  const bool ratio_skip = f.ratio > c.skip_loss_ratio;
  const bool skip = ratio_skip || (tier1 && c.tier1_skip_on_trigger);
  if (!s.ep.active) s.OpenEpisode(r.step, f.ema);
  if (!s.ep.tier1) {
    s.ep.tier1 = true;
    s.ep.tier1_step = r.step;
    s.ep.tier = std::max(s.ep.tier, 1);
  }
  Event& e = s.NewEvent(out, r, 1, skip ? Action::kSkipUpdate : Action::kRecord,
                        tier1 ? EventKind::kDataAnomaly : EventKind::kLossRatioSkip,
                        s.ep.id, r.step);
  if (tier1) {
    e.reason = absl::StrFormat(
        "data anomaly: grad_norm %.3g is %.1fx its median %.3g over the prior %d "
        "steps, and loss %.3f is %+.3f nats over its EMA %.3f (ratio %.2f",
        g, grad_ratio, med, c.median_window_steps, f.loss, dev, f.ema, f.ratio);
    if (Finite(sigma)) absl::StrAppendFormat(&e.reason, ", %.1f sigma", dev / sigma);
    e.reason += ")";
    // Said when only the local level saw the jump.
    if (const LocalLevel l = ReadLocalLevel(s); !EmaJump(c, f) && LocalJump(c, l, f.loss)) {
      absl::StrAppendFormat(&e.reason,
                            ", %+.3f nats over its local level %.3f (%.1fx the local noise %.3f)",
                            f.loss - l.level, l.level,
                            l.noise > 0 ? (f.loss - l.level) / l.noise : 0.0, l.noise);
    }
  } else {
    e.reason = absl::StrFormat(
        "loss_ema_ratio %.2f is above %.1f (loss %.3f, EMA %.3f) without a "
        "grad-norm outlier",
        f.ratio, c.skip_loss_ratio, f.loss, f.ema);
  }
  e.reason += skip ? "; optimizer update skipped" : "; recorded, update kept";
  s.AddEvidence(r.step, r.step, RecommendedAction::Kind::kInspectShards, &e);
  if (skip) out->verdict = Verdict{Decision::kSkipUpdate, 1, e.kind};
  return skip;
}

}  // namespace trainwatch::core
