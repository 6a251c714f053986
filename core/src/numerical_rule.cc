// Tier 3: numerical failure. Halt at once and name the source tensors; never
// held back by the warm-up, a NaN is never benign.
//
// One exception, fp16 dynamic loss scaling: on a step the loss scaler marks
// as an overflow (StepValues::loss_scale_overflow), inf gradients are the
// scaler's normal probe for a too-high scale; it skips the update and lowers
// the scale. Such a step is a tier 0 record (one event per run of overflows),
// and only its gradient signals (grad_norm, nan_frac) are excused: a nonfinite
// loss still halts, as do persisting overflows and a scale below its floor
// (RuleConfig's loss_scale_*).

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine_state.h"

namespace trainwatch::core {

namespace {

RecommendedAction WidenPrecision(std::string tensor, std::string text) {
  RecommendedAction a;
  a.kind = RecommendedAction::Kind::kWidenPrecision;
  a.tensor = std::move(tensor);
  a.text = std::move(text);
  return a;
}

// Names the tensors with nonfinite elements, worst first, and recommends a
// wider precision for the worst three.
void NameSourceTensors(const StepRecord& r, Event* e) {
  std::vector<const TensorStat*> bad;
  for (const TensorStat& t : r.tensors) {
    if (t.nonfinite > 0) bad.push_back(&t);
  }
  std::sort(bad.begin(), bad.end(), [](const TensorStat* a, const TensorStat* b) {
    return a->nonfinite > b->nonfinite;
  });
  if (bad.empty()) {
    e->recommended_actions.push_back(WidenPrecision(
        "", "locate the source tensor (per-layer nan_frac or activation "
            "monitoring) and run it in a wider precision"));
    return;
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < bad.size() && i < 8; ++i) {
    names.push_back(absl::StrFormat("%s (%d of %d nonfinite)", bad[i]->name,
                                    bad[i]->nonfinite, bad[i]->elements));
  }
  absl::StrAppend(&e->reason, "; source tensors: ", absl::StrJoin(names, ", "));
  for (size_t i = 0; i < bad.size() && i < 3; ++i) {
    e->recommended_actions.push_back(WidenPrecision(
        std::string(bad[i]->name),
        absl::StrFormat("run %s in a wider precision (fp8->bf16, bf16->fp32)",
                        bad[i]->name)));
  }
}

// The loss-scale rules' reasons, and whether there are any.
bool LossScaleCollapse(const EngineState& s, const StepRecord& r, std::vector<std::string>* reasons) {
  const RuleConfig& c = s.c;
  const size_t before = reasons->size();
  if (c.loss_scale_max_overflow_steps > 0 && s.overflow_run >= c.loss_scale_max_overflow_steps) {
    reasons->push_back(absl::StrFormat(
        "%d loss-scale overflow steps in a row (loss_scale_max_overflow_steps = %d): the "
        "scaler is not recovering",
        s.overflow_run, c.loss_scale_max_overflow_steps));
  }
  const double scale = r.loss_scale();
  if (!Finite(scale) || scale < c.loss_scale_floor) {
    reasons->push_back(absl::StrFormat("loss scale %g is below its floor %g (loss_scale_floor)",
                                       scale, c.loss_scale_floor));
  }
  return reasons->size() > before;
}

}  // namespace

bool CheckNumericalFailure(EngineState& s, const StepFacts& f, StepOutcome* out) {
  const RuleConfig& c = s.c;
  const StepRecord& r = f.r;
  std::vector<std::string>& reasons = s.reasons;
  reasons.clear();
  const bool overflow = r.loss_scale_overflow();
  s.overflow_run = overflow ? s.overflow_run + 1 : 0;
  // The nonfinite signals as a mask first, without a branch per signal:
  // on almost every record it is empty.
  uint32_t nonfinite = 0;
  for (int i = 0; i < kNumSignals; ++i) {
    const Signal sig = static_cast<Signal>(i);
    nonfinite |= Finite(r.Get(sig)) ? 0u : Bit(sig);
  }
  nonfinite &= r.present();
  // The inf gradients of an overflow step are the scaler's, not a failure.
  if (overflow) nonfinite &= ~(Bit(Signal::kGradNorm) | Bit(Signal::kNanFrac));
  for (int i = 0; nonfinite != 0 && i < kNumSignals; ++i) {
    const Signal sig = static_cast<Signal>(i);
    if (nonfinite & Bit(sig)) {
      reasons.push_back(absl::StrCat(SignalName(sig), " is ", r.Get(sig)));
    }
  }
  const double nan_frac = overflow ? 0.0 : r.Get(Signal::kNanFrac);
  bool nonfinite_grads = !reasons.empty() && r.Has(Signal::kNanFrac) && !Finite(nan_frac);
  if (Finite(nan_frac) && nan_frac > 0.0) {
    nonfinite_grads = true;
    reasons.push_back(absl::StrFormat("nan_frac = %g (nonfinite gradient elements)", nan_frac));
  }
  EventKind kind = nonfinite_grads ? EventKind::kNonfiniteGradients
                                   : EventKind::kNonfiniteValue;
  if (reasons.empty() && r.HasLossScale() && LossScaleCollapse(s, r, &reasons)) {
    kind = EventKind::kLossScaleCollapse;
  }
  const double loss = f.loss, g = f.grad, med = f.grad_median, ratio = f.ratio;
  if (reasons.empty() && f.warm && Finite(loss) && loss > c.tier3_loss_nats &&
      Finite(ratio) && ratio > c.tier1_loss_ratio && Finite(g) && Finite(med) &&
      g <= c.tier1_grad_ratio * med) {
    kind = EventKind::kLossExplosion;
    reasons.push_back(absl::StrFormat(
        "loss %.3f nats is above %.1f (ratio %.2f to its EMA) while grad_norm "
        "%.3g is within %.1fx its median %.3g: no gradient explanation",
        loss, c.tier3_loss_nats, ratio, g, c.tier1_grad_ratio, med));
  }
  // No baseline needed: a loss no language model reaches short of a
  // numerical failure, from the first record.
  if (reasons.empty() && c.vocab_size > 1 && Finite(loss) &&
      loss > c.tier3_vocab_factor * std::log(static_cast<double>(c.vocab_size))) {
    kind = EventKind::kLossExplosion;
    const double ln_vocab = std::log(static_cast<double>(c.vocab_size));
    reasons.push_back(absl::StrFormat(
        "loss %.4g nats is %.1fx ln(vocab_size %d) = %.3f, an untrained model's loss: above "
        "%.1fx it no training reaches short of a numerical failure (tier3_vocab_factor)",
        loss, loss / ln_vocab, c.vocab_size, ln_vocab, c.tier3_vocab_factor));
  }
  if (reasons.empty() && overflow) {
    // Tier 0: the scaler skipped the step. One event per run of overflows,
    // resolved on arrival; every overflow step is counted from its record.
    if (s.overflow_run == 1) {
      Event& e = s.NewEvent(out, r, 0, Action::kRecord, EventKind::kLossScaleOverflow,
                            s.next_episode++, r.step);
      e.reason = absl::StrFormat(
          "loss-scale overflow at scale %g: the scaler skipped the update and lowers the scale",
          r.loss_scale());
    }
    return true;
  }
  if (reasons.empty()) {
    if (s.t3_active && ++s.t3_clean >= c.tier3_clear_steps) s.t3_active = false;
    return false;
  }
  s.t3_clean = 0;
  out->verdict = Verdict{Decision::kHalt, 3, kind};
  if (s.t3_active) return true;  // same episode: the halt stands, no new event
  s.t3_active = true;
  Event& e = s.NewEvent(out, r, 3, Action::kHalt, kind, s.next_episode++, r.step);
  e.reason = absl::StrCat("numerical failure: ", absl::StrJoin(reasons, "; "));
  NameSourceTensors(r, &e);
  s.AddEvidence(r.step - c.shard_steps_before_onset, r.step,
                RecommendedAction::Kind::kInspectShards, &e);
  return true;
}

}  // namespace trainwatch::core
