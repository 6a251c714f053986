// RuleEngine::Judge: one step through the rule families (engine_state.h),
// in their order, over the baseline of the previous steps.

#include "trainwatch/core/rule_engine.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine_state.h"
#include "trainwatch/core/windows.h"

namespace trainwatch::core {

namespace {

// Past the warm-up at `step`: warmup_steps since the first record, and the
// EMA and (for a run that reports grad_norm) the median hold enough records.
bool Warm(const EngineState& s, int64_t step, int64_t grad_samples) {
  const RuleConfig& c = s.c;
  const bool needs_grad = (s.ever_present & Bit(Signal::kGradNorm)) != 0;
  return step - s.first_step >= c.warmup_steps && s.ema.count() >= c.warmup_min_records &&
         (!needs_grad || grad_samples >= c.warmup_min_grad_samples);
}

absl::Status Admit(EngineState& s, const StepRecord& r) {
  if (r.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", r.step, " is negative"));
  }
  if (s.last_step >= 0 && r.step <= s.last_step) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", r.step, " does not follow step ", s.last_step,
        ": steps of a run must strictly increase"));
  }
  if (s.first_step < 0) s.first_step = r.step;
  s.last_step = r.step;
  s.ever_present |= r.present() & kCoreSignals;
  s.RecordShards(r);
  if (!r.checkpoint_uri.empty()) s.AddCheckpoint(r.step, r.checkpoint_uri);
  return absl::OkStatus();
}

// The baseline, from previous steps only, and this step's numbers against it.
StepFacts ReadBaseline(EngineState& s, const StepRecord& r, StepOutcome* out) {
  const RuleConfig& c = s.c;
  StepFacts f{r};
  f.ema = s.ema.Value();
  // The previous step's grad norm joins the window now, taking the slot of
  // the one that leaves it. The window holds the samples of the last
  // median_window_steps steps, and at least warmup_min_grad_samples of them
  // (a log written every 500 steps has 10 in 5,000 steps).
  const auto keep = static_cast<size_t>(c.warmup_min_grad_samples);
  if (s.pending_grad_step >= 0) {
    s.grad_median.PushAndEvict(s.pending_grad_step, s.pending_grad,
                               r.step - c.median_window_steps, keep);
    s.pending_grad_step = -1;
  } else {
    s.grad_median.EvictBefore(r.step - c.median_window_steps, keep);
  }
  f.grad_median = s.grad_median.Median();
  f.loss = r.Get(Signal::kLoss);
  f.grad = r.Get(Signal::kGradNorm);
  f.ratio = Finite(f.loss) && Finite(f.ema) && f.ema > 0.0 ? f.loss / f.ema : kNaN;
  out->loss_ema = f.ema;
  out->loss_ema_ratio = f.ratio;
  out->grad_norm_median = f.grad_median;
  f.warm = Warm(s, r.step, static_cast<int64_t>(s.grad_median.size()));
  out->warming_up = !f.warm;
  return f;
}

// The smoothed log_z and its rise over the short and the long window.
void FeedLogZ(EngineState& s, StepFacts* f) {
  const RuleConfig& c = s.c;
  const double logz = f->r.Get(Signal::kLogZ);
  if (!Finite(logz)) return;
  const int64_t step = f->r.step;
  s.smooth_logz.Add(step, logz);
  s.logz_buckets.Add(step, logz);
  const double sl = s.smooth_logz.Value();
  f->rise_short = sl - s.logz_min_short.MinSince(step - c.logz_rise_window_steps);
  f->rise_long = sl - s.logz_min_long.MinSince(step - c.logz_drift_window_steps);
  s.logz_min_short.Push(step, sl);
  s.logz_min_long.Push(step, sl);
}

// A warm step with a loss and an EMA: every rule decides.
void Decide(EngineState& s, StepFacts* f, StepOutcome* out) {
  const int64_t step = f->r.step;
  ReadNoise(s, f);
  const uint64_t episode_before = s.ep.active ? s.ep.id : 0;

  const bool skip = CheckDataAnomaly(s, *f, out);
  // The smoothed loss follows the steps whose update was applied: a
  // skipped batch's loss says nothing about the model's trajectory.
  if (!skip) s.smooth_loss.Add(step, f->loss);
  const bool spike = TrackSpike(s, *f, out);
  CheckPage(s, *f, spike, out);
  if (skip) return;

  CheckRecovery(s, *f, episode_before, out);
  // A transient inside an episode, or beside this step's tier 1 or 2
  // event, would only repeat it.
  bool quiet = s.ep.active;
  for (const Event& e : out->events) quiet |= e.tier >= 1;
  FeedTransient(s, f->r, f->loss, quiet, out);
  // The noise scale learns from calm steps only.
  if (!s.ep.active) {
    double d = f->dev;
    if (Finite(f->sigma)) {
      const double m = s.dev_mean.Value();
      d = std::clamp(d, m - 5.0 * f->sigma, m + 5.0 * f->sigma);
    }
    s.LearnNoise(step, d);
  }
}

// Warming up: learn the noise scale; only what needs no baseline decides.
void WarmUpStep(EngineState& s, const StepFacts& f, StepOutcome* out) {
  CheckWarmUp(s, f, out);
  s.smooth_loss.Add(f.r.step, f.loss);
  FeedTransient(s, f.r, f.loss, /*quiet=*/true, out);
  if (Finite(f.ema)) s.LearnNoise(f.r.step, f.loss - f.ema);
}

// This step joins the baseline windows the next step is measured against.
void LearnWindows(EngineState& s, const StepFacts& f) {
  const StepRecord& r = f.r;
  if (Finite(f.loss)) {
    s.prev_loss_step = r.step;
    s.ema.Add(r.step, f.loss);
  }
  if (Finite(f.grad)) {
    s.pending_grad_step = r.step;
    s.pending_grad = f.grad;
  }
  if (Finite(f.grad_median)) s.grad_hist.Add(r.step, f.grad_median);
  const double attn = r.Get(Signal::kAttentionLogitP99);
  if (Finite(attn)) s.attn_hist.Add(r.step, attn);
  const double act = r.Get(Signal::kActivationMax);
  if (Finite(act)) s.act_hist.Add(r.step, act);
}

}  // namespace

RuleEngine::RuleEngine(const RuleConfig& config)
    : s_(std::make_unique<EngineState>(config)) {}
RuleEngine::~RuleEngine() = default;

const RuleConfig& RuleEngine::config() const { return s_->c; }

void RuleEngine::NoteCheckpoint(int64_t step, absl::string_view uri) {
  s_->AddCheckpoint(step, uri);
}
int64_t RuleEngine::last_step() const { return s_->last_step; }
int64_t RuleEngine::first_step() const { return s_->first_step; }

WarmUpState RuleEngine::WarmUp() const {
  const EngineState& s = *s_;
  WarmUpState w;
  w.loss_records = s.ema.count();
  // The last step's grad norm joins the median at the next step.
  w.grad_samples = static_cast<int64_t>(s.grad_median.size()) + (s.pending_grad_step >= 0);
  w.needs_grad = (s.ever_present & Bit(Signal::kGradNorm)) != 0;
  if (s.first_step < 0) return w;
  w.until_step = s.first_step + s.c.warmup_steps;
  w.active = !Warm(s, s.last_step + 1, w.grad_samples);
  return w;
}

size_t RuleEngine::MemoryBytes() const { return sizeof(RuleEngine) + s_->MemoryBytes(); }

absl::Status RuleEngine::Judge(const StepRecord& r, StepOutcome* out) {
  EngineState& s = *s_;
  out->events.clear();
  out->verdict = Verdict{};
  if (absl::Status admitted = Admit(s, r); !admitted.ok()) return admitted;
  StepFacts f = ReadBaseline(s, r, out);
  const WarningMarks marks = MarkWarnings(s);
  // Tier 3 first: a broken step feeds no window.
  if (!CheckNumericalFailure(s, f, out)) {
    FeedLogZ(s, &f);
    if (f.warm && Finite(f.loss) && Finite(f.ema)) {
      Decide(s, &f, out);
    } else if (Finite(f.loss)) {
      WarmUpStep(s, f, out);
    }
    LearnWindows(s, f);
  }
  CheckWarnings(s, r, marks, out);
  return absl::OkStatus();
}

bool EngineRebuilder::Feed(const StepRecord& record) {
  if (record.step > up_to_ || !engine_->Judge(record, &scratch_).ok()) return false;
  ++fed_;
  return true;
}

void EngineRebuilder::NoteCheckpoint(int64_t step, absl::string_view uri) {
  if (step <= up_to_) engine_->NoteCheckpoint(step, uri);
}

}  // namespace trainwatch::core
