// The early warnings (alerts, not pages): log_z high and rising, the
// grad-norm median rising steadily, attention-logit p99 rising without
// plateau, activations on course to overflow. Each is evaluated once per
// completed bucket of its history, over completed buckets, and fires on the
// edge from false to true.

#include <algorithm>

#include "absl/strings/str_format.h"
#include "engine_state.h"

namespace trainwatch::core {

namespace {

// True when `h` completed a bucket on this step (it had one before).
bool Completed(const BucketSeries& h, int64_t newest_before) {
  return h.newest_index() != newest_before && newest_before >= 0;
}

// Mean of `len` consecutive buckets ending `back` buckets before the
// newest; false if any of them is empty or missing.
bool SegmentMean(const BucketSeries& s, size_t back, size_t len, double* mean) {
  double sum = 0.0;
  int64_t count = 0;
  for (size_t i = 0; i < len; ++i) {
    const auto& b = s.Back(back + i);
    if (b.index < 0 || b.count == 0) return false;
    sum += b.sum;
    count += b.count;
  }
  *mean = sum / static_cast<double>(count);
  return true;
}

// The means of the last `n` complete buckets, oldest first (v[n - 1] is
// Back(1)); false if any of them is empty or missing.
bool CompleteMeans(const BucketSeries& s, int n, double* v) {
  for (int i = 0; i < n; ++i) {
    const auto& b = s.Back(static_cast<size_t>(n - i));
    if (b.index < 0 || b.count == 0) return false;
    v[i] = b.mean();
  }
  return true;
}

// The last five complete buckets rise strictly, from `first` to `last`.
bool Rising5(const BucketSeries& s, double* first, double* last) {
  double v[5];
  if (!CompleteMeans(s, 5, v)) return false;
  for (int i = 1; i < 5; ++i) {
    if (!(v[i] > v[i - 1])) return false;
  }
  *first = v[0];
  *last = v[4];
  return true;
}

// Updates the edge state of warning `idx` and returns its new event on the
// rising edge, null otherwise or when `suppressed`.
Event* Warn(EngineState& s, WarnIndex idx, bool cond, bool suppressed, EventKind kind,
            int64_t onset, const StepRecord& r, StepOutcome* out) {
  const bool rising_edge = cond && !s.warn_active[idx];
  s.warn_active[idx] = cond;
  if (!rising_edge || suppressed) return nullptr;
  return &s.NewEvent(out, r, 0, Action::kWarn, kind, s.next_episode++, onset);
}

void WarnLogZ(EngineState& s, const StepRecord& r, bool paged, StepOutcome* out) {
  const RuleConfig& c = s.c;
  const size_t seg = static_cast<size_t>(c.warn_logz_rising_steps / c.logz_bucket_steps / 5);
  double m[5];
  bool ok = seg > 0;
  for (int j = 0; ok && j < 5; ++j) {
    // Segment 4 is the newest complete one (it ends at Back(1)).
    ok = SegmentMean(s.logz_buckets, 1 + static_cast<size_t>(4 - j) * seg, seg, &m[j]);
  }
  bool cond = ok && s.logz_buckets.Back(1).mean() > c.warn_logz_level &&
              m[4] - m[0] >= c.warn_logz_min_rise;
  // Steadily, for the whole window: every segment above the one before
  // by a fifth of the minimum total and by a third of the mean step, so
  // a rise that began mid-window (a flat start, then a climb) waits.
  const double step_floor = std::max(c.warn_logz_min_rise / 5.0, (m[4] - m[0]) / 12.0);
  for (int j = 1; cond && j < 5; ++j) cond = m[j] - m[j - 1] >= step_floor;
  Event* e = Warn(s, kWarnLogZIdx, cond, paged, EventKind::kWarnLogZ,
                  r.step - c.warn_logz_rising_steps, r, out);
  if (e == nullptr) return;
  e->reason = absl::StrFormat(
      "log_z %.2f is above %.0f and has risen for %d steps (%.2f -> %.2f by "
      "%d-step means): a leading indicator of a divergent spike",
      s.logz_buckets.Back(1).mean(), c.warn_logz_level, c.warn_logz_rising_steps, m[0], m[4],
      c.warn_logz_rising_steps / 5);
  s.AddZLossAction(r.Get(Signal::kZLossAlpha), e);
}

void WarnGradMedian(EngineState& s, const StepRecord& r, bool paged, StepOutcome* out) {
  const RuleConfig& c = s.c;
  double v[11];  // v[10] newest
  bool cond = false;
  if (CompleteMeans(s.grad_hist, 11, v)) {
    int rising = 0;
    for (int i = 1; i < 11; ++i) rising += v[i] >= v[i - 1];
    cond = rising >= c.warn_grad_median_steady_fraction * 10 &&
           v[10] >= c.warn_grad_median_factor * v[0];
  }
  Event* e = Warn(s, kWarnGradIdx, cond, paged, EventKind::kWarnGradMedian,
                  r.step - c.warn_grad_median_window_steps, r, out);
  if (e == nullptr) return;
  e->reason = absl::StrFormat(
      "grad-norm median rose steadily from %.3g to %.3g over %d steps: logit "
      "drift or an overheated learning rate",
      v[0], v[10], c.warn_grad_median_window_steps);
}

void WarnAttention(EngineState& s, const StepRecord& r, StepOutcome* out) {
  double first = 0, last = 0;
  const bool cond = Rising5(s.attn_hist, &first, &last) &&
                    last >= first * (1.0 + s.c.warn_attention_min_rise_fraction);
  const int64_t span = 5 * s.attn_hist.width();
  Event* e = Warn(s, kWarnAttnIdx, cond, /*suppressed=*/false,
                  EventKind::kWarnAttentionLogits, r.step - span, r, out);
  if (e == nullptr) return;
  e->reason = absl::StrFormat(
      "attention-logit p99 rising without plateau: %.3g -> %.3g over %d steps "
      "(consider QK-norm or soft-capping)",
      first, last, span);
}

void WarnActivations(EngineState& s, const StepRecord& r, StepOutcome* out) {
  const RuleConfig& c = s.c;
  double first = 0, last = 0;
  bool cond = Rising5(s.act_hist, &first, &last);
  double projected = 0;
  if (cond) {
    const double slope = (last - first) / static_cast<double>(4 * s.act_hist.width());
    projected = last + slope * static_cast<double>(c.warn_activation_horizon_steps);
    cond = last >= c.warn_activation_floor && projected >= c.warn_activation_target;
  }
  Event* e = Warn(s, kWarnActIdx, cond, /*suppressed=*/false, EventKind::kWarnActivations,
                  r.step - 5 * s.act_hist.width(), r, out);
  if (e == nullptr) return;
  e->reason = absl::StrFormat(
      "activation max %.4g and rising (%.4g -> %.4g), on course to %.3g "
      "within %d steps",
      last, first, last, projected, c.warn_activation_horizon_steps);
}

}  // namespace

void CheckWarnings(EngineState& s, const StepRecord& r, const WarningMarks& before,
                   StepOutcome* out) {
  // While a tier 2 page is open the on-call already has the story: the
  // log_z and grad-median warnings would only repeat it.
  const bool paged = s.ep.active && s.ep.paged;
  if (Completed(s.logz_buckets, before.logz)) WarnLogZ(s, r, paged, out);
  if (Completed(s.grad_hist, before.grad)) WarnGradMedian(s, r, paged, out);
  if (Completed(s.attn_hist, before.attn)) WarnAttention(s, r, out);
  if (Completed(s.act_hist, before.act)) WarnActivations(s, r, out);
}

}  // namespace trainwatch::core
