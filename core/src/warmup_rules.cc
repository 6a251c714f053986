// Warm-up: the steps before the baseline rules may decide (warmup_steps since
// the run's first record, and enough loss and grad-norm records). Two things
// are still said there, from what needs no long baseline:
//   - a bad batch, the tier 1 trigger against the EMA and grad-norm median of
//     the records so far, is recorded (tier 0): early in a run the loss falls
//     fast and its noise is not yet known, so the update is kept rather than
//     skipped on a baseline a few dozen records old;
//   - a divergence, the loss many times its lowest value so far and well
//     above it for several records in a row, pages (tier 2): the early fall
//     of a healthy run only lowers the minimum, and a loss that climbs back
//     past twice its best and stays there is not noise (a fine-tune exploding
//     at its first steps, a learning-rate sweep point that diverges).
// Both say that the run is in warm-up, and until when.

#include <cmath>

#include "absl/strings/str_format.h"
#include "engine_state.h"

namespace trainwatch::core {

namespace {

std::string Until(const EngineState& s) {
  return absl::StrFormat("in warm-up until step %d", s.first_step + s.c.warmup_steps);
}

void CheckBadBatch(EngineState& s, const StepFacts& baseline, StepOutcome* out) {
  const RuleConfig& c = s.c;
  if (s.ema.count() < c.warmup_min_records ||
      static_cast<int64_t>(s.grad_median.size()) < c.warmup_min_grad_samples ||
      !Finite(baseline.ema)) {
    return;
  }
  StepFacts f = baseline;
  ReadNoise(s, &f);
  const double grad_ratio = GradRatio(f);
  if (!Tier1Trigger(s, f, grad_ratio)) return;
  const double dev = f.dev;
  Event& e = s.NewEvent(out, f.r, 0, Action::kRecord, EventKind::kDataAnomaly, s.next_episode++,
                        f.r.step);
  e.reason = absl::StrFormat(
      "data anomaly %s: grad_norm %.3g is %.1fx its median %.3g, and loss %.3f is %+.3f nats "
      "over its EMA %.3f; recorded, update kept (tier 1 skips once the warm-up is over)",
      Until(s), f.grad, grad_ratio, f.grad_median, f.loss, dev, f.ema);
  s.AddEvidence(f.r.step, f.r.step, RecommendedAction::Kind::kInspectShards, &e);
}

void CheckDivergence(EngineState& s, const StepFacts& f, StepOutcome* out) {
  const RuleConfig& c = s.c;
  const double low = s.warm_min_loss;
  // The ratio means something only above zero (a loss that can go
  // negative, such as a reward or a shifted objective, has the nats alone).
  const bool high = std::isfinite(low) && f.loss - low >= c.warmup_divergence_nats &&
                    (low <= 0.0 || f.loss >= c.warmup_divergence_ratio * low);
  if (!high) {
    // Back under the bound: a later divergence pages again.
    s.warm_high_records = 0;
    s.warm_high_start = -1;
    s.warm_paged = false;
    s.warm_min_loss = std::min(low, f.loss);
    return;
  }
  if (s.warm_high_records++ == 0) s.warm_high_start = f.r.step;
  if (s.warm_paged || s.warm_high_records < c.warmup_divergence_records) return;
  s.warm_paged = true;
  Event& e = s.NewEvent(out, f.r, 2, Action::kPage, EventKind::kNonRecovering, s.next_episode++,
                        s.warm_high_start);
  e.reason = absl::StrFormat(
      "non-recovering divergence %s: loss %.4g is %s its lowest value so far, %.4g (%+.4g "
      "nats), for %d records since step %d; this rule needs no baseline",
      Until(s), f.loss,
      low > 0.0 ? absl::StrFormat("%.1fx", f.loss / low) : std::string("far above"), low,
      f.loss - low, s.warm_high_records, s.warm_high_start);
  s.AddEvidence(s.warm_high_start, f.r.step, RecommendedAction::Kind::kQuarantineShards, &e);
}

}  // namespace

void CheckWarmUp(EngineState& s, const StepFacts& f, StepOutcome* out) {
  if (!Finite(f.loss)) return;
  CheckBadBatch(s, f, out);
  CheckDivergence(s, f, out);
}

}  // namespace trainwatch::core
