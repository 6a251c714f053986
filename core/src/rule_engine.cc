#include "trainwatch/core/rule_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainwatch/core/windows.h"

namespace trainwatch::core {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool Finite(double v) { return std::isfinite(v); }

// Warning kinds, indexes into the edge-trigger state.
enum WarnIndex { kWarnLogZIdx = 0, kWarnGradIdx, kWarnAttnIdx, kWarnActIdx, kNumWarn };

struct Checkpoint {
  int64_t step;
  std::string uri;
};

struct ShardEntry {
  int64_t step;
  uint32_t count;
  bool truncated;
};

// One loss episode: a data anomaly, a spike, a drift. Tier 1 and tier 2 share
// it, so that a tier 1 that does not recover escalates within one episode
// (one incident) instead of opening a second one.
struct Episode {
  bool active = false;
  uint64_t id = 0;
  int64_t onset = 0;
  double pre_level = 0.0;  // EMA at onset: "the pre-spike level"
  int tier = 0;
  bool tier1 = false;       // opened by a tier 1 trigger or skip
  int64_t tier1_step = 0;
  bool spike = false;       // a confirmed spike is part of it
  bool paged = false;
  bool confirmed = false;
  double peak_excess = 0.0;
};

}  // namespace

struct RuleEngine::State {
  explicit State(const RuleConfig& config)
      : c(config),
        ema(config.ema_span_steps),
        dev_mean(config.ema_span_steps),
        dev_sq(config.ema_span_steps),
        smooth_loss(config.smoothing_span_steps),
        smooth_logz(config.smoothing_span_steps),
        grad_median(config.median_window_steps),
        logz_min_short(config.logz_rise_window_steps),
        logz_min_long(config.logz_drift_window_steps),
        logz_buckets(config.logz_bucket_steps,
                     static_cast<size_t>(config.warn_logz_rising_steps /
                                         config.logz_bucket_steps) + 2),
        grad_hist(std::max<int64_t>(1, config.warn_grad_median_window_steps / 10), 12),
        attn_hist(std::max<int64_t>(1, config.warn_logz_rising_steps / 5), 7),
        act_hist(std::max<int64_t>(1, config.warn_logz_rising_steps / 5), 7),
        transient_base(config.transient_baseline_records),
        transient_dev(config.transient_baseline_records),
        transient_short(static_cast<size_t>(config.transient_window_records)),
        shard_ids(static_cast<size_t>(config.shard_history_steps *
                                      config.max_shards_per_step)),
        shard_steps(static_cast<size_t>(config.shard_history_steps)) {
    checkpoints.reserve(static_cast<size_t>(config.checkpoints_retained) + 1);
  }

  RuleConfig c;
  DecayingMean ema;       // of the loss, previous steps only
  DecayingMean dev_mean;  // of loss - EMA on calm steps: the noise scale
  DecayingMean dev_sq;
  DecayingMean smooth_loss;
  DecayingMean smooth_logz;
  SlidingMedian grad_median;
  SlidingMin logz_min_short;
  SlidingMin logz_min_long;
  BucketSeries logz_buckets;
  BucketSeries grad_hist;  // the median itself, over time
  BucketSeries attn_hist;
  BucketSeries act_hist;

  // Transient detection, keyed by record index (not step): the local level
  // (median), the local noise (median absolute deviation), and the last few
  // losses with their steps.
  SlidingMedian transient_base;
  SlidingMedian transient_dev;
  std::vector<std::pair<int64_t, double>> transient_short;  // ring
  size_t transient_head = 0;
  size_t transient_count = 0;
  double transient_sum = 0.0;
  int64_t transient_records = 0;
  bool transient_active = false;

  std::vector<uint64_t> shard_ids;
  std::vector<ShardEntry> shard_steps;
  size_t shard_head = 0;
  size_t shard_count = 0;
  std::vector<Checkpoint> checkpoints;

  int64_t first_step = -1;
  int64_t last_step = -1;
  // This step's grad norm, pushed into the median at the next step (the
  // median is over the prior steps only).
  int64_t pending_grad_step = -1;
  double pending_grad = 0.0;
  uint32_t ever_present = 0;

  // Spike tracking: the current run of steps >= delta above the EMA.
  int64_t above_start = -1;
  double above_start_level = 0.0;
  int64_t above_steps = 0;
  int64_t below_records = 0;
  int64_t prev_loss_step = -1;
  // Consecutive records with loss_ema_ratio above the tier 2 threshold.
  int64_t high_ratio_records = 0;
  int64_t high_ratio_start = -1;

  Episode ep;
  uint64_t next_episode = 1;

  bool t3_active = false;
  int64_t t3_clean = 0;

  bool warn_active[kNumWarn] = {};

  // Scratch, kept to avoid allocating per step.
  std::vector<std::string> reasons;

  // ---------------------------------------------------------------- helpers

  void RecordShards(const StepRecord& r) {
    if (r.shards.empty() || shard_steps.empty()) return;
    const size_t cap = shard_steps.size();
    size_t slot;
    if (shard_count == cap) {
      slot = shard_head;
      shard_head = (shard_head + 1) % cap;
    } else {
      slot = (shard_head + shard_count) % cap;
      ++shard_count;
    }
    const size_t per = static_cast<size_t>(c.max_shards_per_step);
    const size_t n = std::min(per, r.shards.size());
    std::copy_n(r.shards.begin(), n, shard_ids.begin() + slot * per);
    shard_steps[slot] = ShardEntry{r.step, static_cast<uint32_t>(n), r.shards.size() > n};
  }

  void CollectShards(int64_t from, int64_t to, Event* e) const {
    const size_t ring = shard_steps.size();
    const size_t per = static_cast<size_t>(c.max_shards_per_step);
    for (size_t i = 0; i < shard_count; ++i) {
      const size_t slot = (shard_head + i) % ring;
      const ShardEntry& se = shard_steps[slot];
      if (se.step < from || se.step > to) continue;
      e->shards.insert(e->shards.end(), shard_ids.begin() + slot * per,
                       shard_ids.begin() + slot * per + se.count);
      if (se.truncated) e->shards_truncated = true;
    }
    std::sort(e->shards.begin(), e->shards.end());
    e->shards.erase(std::unique(e->shards.begin(), e->shards.end()), e->shards.end());
    const size_t cap = static_cast<size_t>(c.max_event_shards);
    if (e->shards.size() > cap) {
      // Keep both ends, so that front() and back() still bound the range a
      // quarantine covers.
      const size_t head = cap / 2, tail = cap - head;
      e->shards.erase(e->shards.begin() + static_cast<std::ptrdiff_t>(head),
                      e->shards.end() - static_cast<std::ptrdiff_t>(tail));
      e->shards_truncated = true;
    }
  }

  void AddCheckpoint(int64_t step, absl::string_view uri) {
    // Kept in step order; a repeated notice for a step replaces its uri.
    auto it = std::lower_bound(
        checkpoints.begin(), checkpoints.end(), step,
        [](const Checkpoint& c, int64_t s) { return c.step < s; });
    if (it != checkpoints.end() && it->step == step) {
      it->uri = std::string(uri);
      return;
    }
    checkpoints.insert(it, Checkpoint{step, std::string(uri)});
    if (checkpoints.size() > static_cast<size_t>(c.checkpoints_retained)) {
      checkpoints.erase(checkpoints.begin());
    }
  }

  // The last retained checkpoint at or before the onset. A numerical failure
  // takes one strictly before it: a checkpoint written at the failing step
  // may already hold the NaN.
  void RecommendCheckpoint(Event* e) const {
    const int64_t limit = e->tier == 3 ? e->onset_step - 1 : e->onset_step;
    for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
      if (it->step <= limit) {
        e->recommended_checkpoint_step = it->step;
        e->recommended_checkpoint_uri = it->uri;
        return;
      }
    }
  }

  void AddShardAction(RecommendedAction::Kind kind, Event* e) const {
    if (e->shards.empty()) return;
    RecommendedAction a;
    a.kind = kind;
    a.shard_first = e->shards.front();
    a.shard_last = e->shards.back();
    a.text = absl::StrFormat(
        "%s shards %d..%d", kind == RecommendedAction::Kind::kQuarantineShards
                                ? "quarantine"
                                : "inspect",
        a.shard_first, a.shard_last);
    e->recommended_actions.push_back(std::move(a));
  }

  void AddZLossAction(double current_alpha, Event* e) const {
    RecommendedAction a;
    a.kind = RecommendedAction::Kind::kSetZLossAlpha;
    if (Finite(current_alpha) && current_alpha > 0.0) {
      // Already on: raise it tenfold, but stay at or below 1e-3, past which
      // the chapter reports a visible loss penalty.
      a.z_loss_alpha = std::min(current_alpha * 10.0, 1e-3);
      a.text = absl::StrFormat("raise z-loss alpha %g -> %g", current_alpha,
                               a.z_loss_alpha);
    } else {
      a.z_loss_alpha = c.z_loss_alpha_recommended;
      a.text = absl::StrFormat("add z-loss alpha=%g", a.z_loss_alpha);
    }
    e->recommended_actions.push_back(std::move(a));
  }

  Event& NewEvent(StepOutcome* out, const StepRecord& r, int tier, Action action,
                  EventKind kind, uint64_t episode, int64_t onset) {
    out->events.emplace_back();
    Event& e = out->events.back();
    e.step = r.step;
    e.onset_step = onset;
    e.tier = tier;
    e.action = action;
    e.kind = kind;
    e.episode = episode;
    e.lacked_signals = kCoreSignals & ~ever_present;
    e.loss = r.Get(Signal::kLoss);
    e.loss_ema = out->loss_ema;
    e.loss_ema_ratio = out->loss_ema_ratio;
    e.grad_norm = r.Get(Signal::kGradNorm);
    e.grad_norm_median = out->grad_norm_median;
    e.log_z = r.Get(Signal::kLogZ);
    return e;
  }

  void OpenEpisode(int64_t onset, double pre_level) {
    ep = Episode{};
    ep.active = true;
    ep.id = next_episode++;
    ep.onset = onset;
    ep.pre_level = pre_level;
  }

  // Where the current log_z rise began: the step after the last bucket whose
  // mean sat within the tolerance of the lowest bucket of the trend history.
  // Returns `now` when log_z is at its minimum (no rise).
  int64_t LogZOnset(int64_t now, double* rise_from_min) const {
    const size_t n = logz_buckets.capacity();
    double lo = std::numeric_limits<double>::infinity();
    for (size_t b = 0; b < n; ++b) {
      const auto& bk = logz_buckets.Back(b);
      if (bk.index < 0) break;
      if (bk.count > 0) lo = std::min(lo, bk.mean());
    }
    *rise_from_min = Finite(lo) ? smooth_logz.Value() - lo : 0.0;
    if (!Finite(lo)) return now;
    for (size_t b = 0; b < n; ++b) {
      const auto& bk = logz_buckets.Back(b);
      if (bk.index < 0) break;
      if (bk.count > 0 && bk.mean() <= lo + c.logz_onset_tolerance) {
        return b == 0 ? now : (bk.index + 1) * logz_buckets.width();
      }
    }
    return now;
  }

  // Mean of `len` consecutive buckets ending `back` buckets before the
  // newest; false if any of them is empty or missing.
  static bool SegmentMean(const BucketSeries& s, size_t back, size_t len, double* mean) {
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

  // ------------------------------------------------------------ the rules

  // Feeds one applied step's loss to the transient windows and reports a
  // transient on its rising edge. `quiet` (an episode is open, or this step
  // already produced a tier 1/2 event) suppresses the report, not the feed.
  void Transient(const StepRecord& r, double loss, bool quiet, StepOutcome* out) {
    const size_t m = transient_short.size();
    if (m == 0) return;
    const int64_t idx = transient_records++;
    if (transient_count == m) {
      // The oldest of the short window moves into the baseline.
      const double y = transient_short[transient_head].second;
      transient_sum -= y;
      transient_head = (transient_head + 1) % m;
      --transient_count;
      const double b = transient_base.Median();
      if (transient_base.size() >= 8) transient_dev.Push(idx, std::fabs(y - b));
      transient_base.Push(idx, y);
    }
    transient_short[(transient_head + transient_count) % m] = {r.step, loss};
    ++transient_count;
    transient_sum += loss;
    const int64_t full = c.transient_baseline_records;
    if (transient_count < m || static_cast<int64_t>(transient_base.size()) < full ||
        static_cast<int64_t>(transient_dev.size()) < full / 2) {
      return;
    }
    const double b = transient_base.Median();
    const double sd = 1.4826 * transient_dev.Median();
    const double excess = transient_sum / static_cast<double>(m) - b;
    const bool cond = excess >= c.spike_delta_nats && excess >= c.transient_z * sd;
    const bool edge = cond && !transient_active;
    transient_active = cond;
    if (!edge || quiet) return;
    int64_t onset = r.step;
    for (size_t i = 0; i < m; ++i) {
      const auto& [step, x] = transient_short[(transient_head + i) % m];
      if (x - b >= c.spike_delta_nats) {
        onset = step;
        break;
      }
    }
    Event& e = NewEvent(out, r, 0, Action::kRecord, EventKind::kTransient, next_episode++, onset);
    e.reason = absl::StrFormat(
        "transient: the last %d loss records average %+.3f nats over the median %.3f of the "
        "%d before them (%.1fx the local noise %.3f); recorded for inspection",
        m, excess, b, c.transient_baseline_records, sd > 0 ? excess / sd : 0.0, sd);
    CollectShards(onset, r.step, &e);
    AddShardAction(RecommendedAction::Kind::kInspectShards, &e);
    RecommendCheckpoint(&e);
  }

  // Tier 3. Returns true when this step is a numerical failure.
  bool CheckNumerical(const StepRecord& r, bool warm, double ratio, double med,
                      StepOutcome* out) {
    reasons.clear();
    for (int i = 0; i < kNumSignals; ++i) {
      const Signal s = static_cast<Signal>(i);
      if (r.Has(s) && !Finite(r.Get(s))) {
        reasons.push_back(absl::StrCat(SignalName(s), " is ", r.Get(s)));
      }
    }
    const double nan_frac = r.Get(Signal::kNanFrac);
    bool nonfinite_grads = !reasons.empty() && r.Has(Signal::kNanFrac) && !Finite(nan_frac);
    if (Finite(nan_frac) && nan_frac > 0.0) {
      nonfinite_grads = true;
      reasons.push_back(absl::StrFormat("nan_frac = %g (nonfinite gradient elements)", nan_frac));
    }
    EventKind kind = nonfinite_grads ? EventKind::kNonfiniteGradients
                                     : EventKind::kNonfiniteValue;
    const double loss = r.Get(Signal::kLoss);
    const double g = r.Get(Signal::kGradNorm);
    if (reasons.empty() && warm && Finite(loss) && loss > c.tier3_loss_nats &&
        Finite(ratio) && ratio > c.tier1_loss_ratio && Finite(g) && Finite(med) &&
        g <= c.tier1_grad_ratio * med) {
      kind = EventKind::kLossExplosion;
      reasons.push_back(absl::StrFormat(
          "loss %.3f nats is above %.1f (ratio %.2f to its EMA) while grad_norm "
          "%.3g is within %.1fx its median %.3g: no gradient explanation",
          loss, c.tier3_loss_nats, ratio, g, c.tier1_grad_ratio, med));
    }
    if (reasons.empty()) {
      if (t3_active && ++t3_clean >= c.tier3_clear_steps) t3_active = false;
      return false;
    }
    t3_clean = 0;
    out->verdict = Verdict{Decision::kHalt, 3, kind};
    if (t3_active) return true;  // same episode: the halt stands, no new event
    t3_active = true;
    const uint64_t id = next_episode++;
    Event& e = NewEvent(out, r, 3, Action::kHalt, kind, id, r.step);
    e.reason = absl::StrCat("numerical failure: ", absl::StrJoin(reasons, "; "));
    // Name the source tensors, worst first.
    std::vector<const TensorStat*> bad;
    for (const TensorStat& t : r.tensors) {
      if (t.nonfinite > 0) bad.push_back(&t);
    }
    std::sort(bad.begin(), bad.end(), [](const TensorStat* a, const TensorStat* b) {
      return a->nonfinite > b->nonfinite;
    });
    if (!bad.empty()) {
      std::vector<std::string> names;
      for (size_t i = 0; i < bad.size() && i < 8; ++i) {
        names.push_back(absl::StrFormat("%s (%d of %d nonfinite)", bad[i]->name,
                                        bad[i]->nonfinite, bad[i]->elements));
      }
      absl::StrAppend(&e.reason, "; source tensors: ", absl::StrJoin(names, ", "));
      for (size_t i = 0; i < bad.size() && i < 3; ++i) {
        RecommendedAction a;
        a.kind = RecommendedAction::Kind::kWidenPrecision;
        a.tensor = std::string(bad[i]->name);
        a.text = absl::StrFormat("run %s in a wider precision (fp8->bf16, bf16->fp32)",
                                 bad[i]->name);
        e.recommended_actions.push_back(std::move(a));
      }
    } else {
      RecommendedAction a;
      a.kind = RecommendedAction::Kind::kWidenPrecision;
      a.text = "locate the source tensor (per-layer nan_frac or activation "
               "monitoring) and run it in a wider precision";
      e.recommended_actions.push_back(std::move(a));
    }
    CollectShards(r.step - c.shard_steps_before_onset, r.step, &e);
    AddShardAction(RecommendedAction::Kind::kInspectShards, &e);
    RecommendCheckpoint(&e);
    return true;
  }

  void CheckWarnings(const StepRecord& r, int64_t prev_logz_bucket,
                     int64_t prev_grad_bucket, int64_t prev_attn_bucket,
                     int64_t prev_act_bucket, StepOutcome* out) {
    // Each warning is evaluated once per completed bucket, over completed
    // buckets, and fires on the edge from false to true.
    // While a tier 2 page is open the on-call already has the story: the
    // log_z and grad-median warnings would only repeat it.
    const bool paged = ep.active && ep.paged;
    auto edge = [&](int idx, bool cond) {
      if (!cond) {
        warn_active[idx] = false;
        return false;
      }
      if (warn_active[idx]) return false;
      warn_active[idx] = true;
      return true;
    };

    if (logz_buckets.newest_index() != prev_logz_bucket && prev_logz_bucket >= 0) {
      const size_t seg = static_cast<size_t>(c.warn_logz_rising_steps / c.logz_bucket_steps / 5);
      double m[5];
      bool ok = seg > 0;
      for (int j = 0; ok && j < 5; ++j) {
        // Segment 4 is the newest complete one (it ends at Back(1)).
        ok = SegmentMean(logz_buckets, 1 + static_cast<size_t>(4 - j) * seg, seg, &m[j]);
      }
      bool cond = ok && logz_buckets.Back(1).mean() > c.warn_logz_level &&
                  m[4] - m[0] >= c.warn_logz_min_rise;
      // Steadily, for the whole window: every segment above the one before
      // by a fifth of the minimum total and by a third of the mean step, so
      // a rise that began mid-window (a flat start, then a climb) waits.
      const double step_floor = std::max(c.warn_logz_min_rise / 5.0, (m[4] - m[0]) / 12.0);
      for (int j = 1; cond && j < 5; ++j) cond = m[j] - m[j - 1] >= step_floor;
      if (edge(kWarnLogZIdx, cond) && !paged) {
        Event& e = NewEvent(out, r, 0, Action::kWarn, EventKind::kWarnLogZ, next_episode++,
                            r.step - c.warn_logz_rising_steps);
        e.reason = absl::StrFormat(
            "log_z %.2f is above %.0f and has risen for %d steps (%.2f -> %.2f by "
            "%d-step means): a leading indicator of a divergent spike",
            logz_buckets.Back(1).mean(), c.warn_logz_level, c.warn_logz_rising_steps,
            m[0], m[4], c.warn_logz_rising_steps / 5);
        AddZLossAction(r.Get(Signal::kZLossAlpha), &e);
      }
    }
    if (grad_hist.newest_index() != prev_grad_bucket && prev_grad_bucket >= 0) {
      double v[11];
      bool ok = true;
      for (int i = 0; ok && i < 11; ++i) {
        const auto& b = grad_hist.Back(static_cast<size_t>(11 - i));  // v[10] newest
        ok = b.index >= 0 && b.count > 0;
        if (ok) v[i] = b.mean();
      }
      bool cond = false;
      if (ok) {
        int rising = 0;
        for (int i = 1; i < 11; ++i) rising += v[i] >= v[i - 1];
        cond = rising >= c.warn_grad_median_steady_fraction * 10 &&
               v[10] >= c.warn_grad_median_factor * v[0];
      }
      if (edge(kWarnGradIdx, cond) && !paged) {
        Event& e = NewEvent(out, r, 0, Action::kWarn, EventKind::kWarnGradMedian,
                            next_episode++, r.step - c.warn_grad_median_window_steps);
        e.reason = absl::StrFormat(
            "grad-norm median rose steadily from %.3g to %.3g over %d steps: logit "
            "drift or an overheated learning rate",
            v[0], v[10], c.warn_grad_median_window_steps);
      }
    }
    auto rising5 = [&](const BucketSeries& s, double* first, double* last) {
      double v[5];
      for (int i = 0; i < 5; ++i) {
        const auto& b = s.Back(static_cast<size_t>(5 - i));
        if (b.index < 0 || b.count == 0) return false;
        v[i] = b.mean();
      }
      for (int i = 1; i < 5; ++i) {
        if (!(v[i] > v[i - 1])) return false;
      }
      *first = v[0];
      *last = v[4];
      return true;
    };
    if (attn_hist.newest_index() != prev_attn_bucket && prev_attn_bucket >= 0) {
      double first = 0, last = 0;
      const bool cond = rising5(attn_hist, &first, &last) &&
                        last >= first * (1.0 + c.warn_attention_min_rise_fraction);
      if (edge(kWarnAttnIdx, cond)) {
        Event& e = NewEvent(out, r, 0, Action::kWarn, EventKind::kWarnAttentionLogits,
                            next_episode++, r.step - 5 * attn_hist.width());
        e.reason = absl::StrFormat(
            "attention-logit p99 rising without plateau: %.3g -> %.3g over %d steps "
            "(consider QK-norm or soft-capping)",
            first, last, 5 * attn_hist.width());
      }
    }
    if (act_hist.newest_index() != prev_act_bucket && prev_act_bucket >= 0) {
      double first = 0, last = 0;
      bool cond = rising5(act_hist, &first, &last);
      double projected = 0;
      if (cond) {
        const double slope = (last - first) / static_cast<double>(4 * act_hist.width());
        projected = last + slope * static_cast<double>(c.warn_activation_horizon_steps);
        cond = last >= c.warn_activation_floor && projected >= c.warn_activation_target;
      }
      if (edge(kWarnActIdx, cond)) {
        Event& e = NewEvent(out, r, 0, Action::kWarn, EventKind::kWarnActivations,
                            next_episode++, r.step - 5 * act_hist.width());
        e.reason = absl::StrFormat(
            "activation max %.4g and rising (%.4g -> %.4g), on course to %.3g "
            "within %d steps",
            last, first, last, projected, c.warn_activation_horizon_steps);
      }
    }
  }
};

RuleEngine::RuleEngine(const RuleConfig& config)
    : s_(std::make_unique<State>(config)) {}
RuleEngine::~RuleEngine() = default;

const RuleConfig& RuleEngine::config() const { return s_->c; }

void RuleEngine::NoteCheckpoint(int64_t step, absl::string_view uri) {
  s_->AddCheckpoint(step, uri);
}
int64_t RuleEngine::last_step() const { return s_->last_step; }

size_t RuleEngine::MemoryBytes() const {
  const State& s = *s_;
  auto bucket_bytes = [](const BucketSeries& b) {
    return b.capacity() * sizeof(BucketSeries::Bucket);
  };
  size_t bytes = sizeof(RuleEngine) + sizeof(State) + s.grad_median.MemoryBytes() +
                 (s.c.logz_rise_window_steps + s.c.logz_drift_window_steps + 2) *
                     (sizeof(int64_t) + sizeof(double)) +
                 bucket_bytes(s.logz_buckets) + bucket_bytes(s.grad_hist) +
                 bucket_bytes(s.attn_hist) + bucket_bytes(s.act_hist) +
                 s.shard_ids.capacity() * sizeof(uint64_t) +
                 s.shard_steps.capacity() * sizeof(ShardEntry) +
                 s.checkpoints.capacity() * sizeof(Checkpoint) +
                 s.transient_base.MemoryBytes() + s.transient_dev.MemoryBytes() +
                 s.transient_short.capacity() * sizeof(std::pair<int64_t, double>);
  for (const auto& ck : s.checkpoints) bytes += ck.uri.capacity();
  return bytes;
}

absl::Status RuleEngine::Observe(const StepRecord& r, StepOutcome* out) {
  State& s = *s_;
  const RuleConfig& c = s.c;
  out->events.clear();
  out->verdict = Verdict{};
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

  // ---- the baseline, from previous steps only
  const double ema = s.ema.Value();
  // The previous step's grad norm joins the window now, taking the slot of
  // the one that leaves it.
  if (s.pending_grad_step >= 0) {
    s.grad_median.PushAndEvict(s.pending_grad_step, s.pending_grad,
                               r.step - c.median_window_steps);
    s.pending_grad_step = -1;
  } else {
    s.grad_median.EvictBefore(r.step - c.median_window_steps);
  }
  const double med = s.grad_median.Median();
  const double loss = r.Get(Signal::kLoss);
  const double g = r.Get(Signal::kGradNorm);
  const double logz = r.Get(Signal::kLogZ);
  const bool has_loss = Finite(loss);
  const double ratio = has_loss && Finite(ema) && ema > 0.0 ? loss / ema : kNaN;
  out->loss_ema = ema;
  out->loss_ema_ratio = ratio;
  out->grad_norm_median = med;
  const bool needs_grad = (s.ever_present & Bit(Signal::kGradNorm)) != 0;
  const bool warm =
      r.step - s.first_step >= c.warmup_steps && s.ema.count() >= c.warmup_min_records &&
      (!needs_grad || static_cast<int64_t>(s.grad_median.size()) >= c.warmup_min_grad_samples);
  out->warming_up = !warm;

  const int64_t prev_logz_bucket = s.logz_buckets.newest_index();
  const int64_t prev_grad_bucket = s.grad_hist.newest_index();
  const int64_t prev_attn_bucket = s.attn_hist.newest_index();
  const int64_t prev_act_bucket = s.act_hist.newest_index();

  // ---- tier 3 first: a broken step feeds no window
  if (s.CheckNumerical(r, warm, ratio, med, out)) {
    s.CheckWarnings(r, prev_logz_bucket, prev_grad_bucket, prev_attn_bucket,
                    prev_act_bucket, out);
    return absl::OkStatus();
  }

  // ---- log_z: smoothed level and its rise over the two windows
  double rise_short = kNaN, rise_long = kNaN;
  if (Finite(logz)) {
    s.smooth_logz.Add(r.step, logz);
    s.logz_buckets.Add(r.step, logz);
    const double sl = s.smooth_logz.Value();
    rise_short = sl - s.logz_min_short.MinSince(r.step - c.logz_rise_window_steps);
    rise_long = sl - s.logz_min_long.MinSince(r.step - c.logz_drift_window_steps);
    s.logz_min_short.Push(r.step, sl);
    s.logz_min_long.Push(r.step, sl);
  }

  const Episode before = s.ep;
  bool skip = false;
  if (warm && has_loss && Finite(ema)) {
    const double dev = loss - ema;
    const double sigma_sq = s.dev_sq.Value() - s.dev_mean.Value() * s.dev_mean.Value();
    const double sigma = s.dev_sq.count() >= c.warmup_min_records && sigma_sq > 0.0
                             ? std::sqrt(sigma_sq)
                             : kNaN;
    const bool sigma_ok = s.dev_sq.count() >= c.warmup_min_records;

    // -- tier 1
    const double grad_ratio = Finite(g) && Finite(med) && med > 0.0 ? g / med : kNaN;
    const bool jump = dev >= c.spike_delta_nats && sigma_ok &&
                      (!Finite(sigma) || dev >= c.tier1_loss_z * sigma);
    const bool loss_cond = ratio > c.tier1_loss_ratio || jump;
    const bool tier1 = grad_ratio > c.tier1_grad_ratio && loss_cond;
    const bool ratio_skip = ratio > c.skip_loss_ratio;
    skip = ratio_skip || (tier1 && c.tier1_skip_on_trigger);
    if (tier1 || ratio_skip) {
      if (!s.ep.active) s.OpenEpisode(r.step, ema);
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
            g, grad_ratio, med, c.median_window_steps, loss, dev, ema, ratio);
        if (Finite(sigma)) absl::StrAppendFormat(&e.reason, ", %.1f sigma", dev / sigma);
        e.reason += ")";
      } else {
        e.reason = absl::StrFormat(
            "loss_ema_ratio %.2f is above %.1f (loss %.3f, EMA %.3f) without a "
            "grad-norm outlier",
            ratio, c.skip_loss_ratio, loss, ema);
      }
      e.reason += skip ? "; optimizer update skipped" : "; recorded, update kept";
      s.CollectShards(r.step, r.step, &e);
      s.AddShardAction(RecommendedAction::Kind::kInspectShards, &e);
      s.RecommendCheckpoint(&e);
    }

    // The smoothed loss follows the steps whose update was applied: a
    // skipped batch's loss says nothing about the model's trajectory.
    if (!skip) s.smooth_loss.Add(r.step, loss);

    // -- spike tracking: steps >= delta above the EMA. A few quiet records
    // inside a spike (noise) neither end it nor count toward its length.
    if (dev >= c.spike_delta_nats) {
      if (s.above_start < 0) {
        s.above_start = r.step;
        s.above_start_level = ema;
        s.above_steps = 0;
      }
      // A record stands for the steps since the previous one (logs that
      // report every K steps), a dip record for none.
      s.above_steps += s.above_start == r.step || s.prev_loss_step < 0
                           ? 1
                           : r.step - s.prev_loss_step;
      s.below_records = 0;
    } else if (s.above_start >= 0 && ++s.below_records > c.spike_gap_records) {
      s.above_start = -1;
    }
    const bool spike = s.above_start >= 0 && s.above_steps > c.spike_min_steps;
    if (spike) {
      if (!s.ep.active) {
        s.OpenEpisode(s.above_start, s.above_start_level);
        s.ep.spike = true;
        Event& e = s.NewEvent(out, r, 0, Action::kWarn, EventKind::kSpike, s.ep.id,
                              s.above_start);
        e.reason = absl::StrFormat(
            "loss spike: %d steps at >= %.2f nats over the EMA (loss %.3f, pre-spike "
            "level %.3f); recovery expected within %d steps",
            s.above_steps, c.spike_delta_nats, loss, s.above_start_level,
            c.escalate_steps);
        s.CollectShards(s.above_start - c.shard_steps_before_onset, r.step, &e);
        s.RecommendCheckpoint(&e);
      } else {
        s.ep.spike = true;
      }
    }

    // -- tier 2
    if (ratio > c.tier2_loss_ratio) {
      if (s.high_ratio_records++ == 0) s.high_ratio_start = r.step;
    } else {
      s.high_ratio_records = 0;
    }
    const bool t2_ratio = s.high_ratio_records >= c.tier2_loss_ratio_records;
    const bool t2_logz_fast = rise_short > c.logz_rise;
    const bool t2_logz_drift = rise_long > c.logz_rise && spike;
    const double excess =
        s.ep.active ? (s.smooth_loss.empty() ? dev : s.smooth_loss.Value()) - s.ep.pre_level
                    : 0.0;
    const bool t2_nonrecovering = s.ep.active && (s.ep.tier1 || s.ep.spike) &&
                                  r.step - s.ep.onset >= c.escalate_steps &&
                                  excess >= c.spike_delta_nats;
    if ((t2_ratio || t2_logz_fast || t2_logz_drift || t2_nonrecovering) &&
        !(s.ep.active && s.ep.paged)) {
      double logz_rise_from_min = 0.0;
      const int64_t logz_onset = (s.ever_present & Bit(Signal::kLogZ))
                                     ? s.LogZOnset(r.step, &logz_rise_from_min)
                                     : r.step;
      const int64_t loss_onset =
          s.ep.active ? s.ep.onset
                      : (t2_ratio ? s.high_ratio_start
                                  : (s.above_start >= 0 ? s.above_start : r.step));
      const bool logz_led = t2_logz_fast || t2_logz_drift ||
                            (logz_rise_from_min >= c.logz_led_min_rise && logz_onset < loss_onset);
      if (!s.ep.active) s.OpenEpisode(std::min(loss_onset, r.step), ema);
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
            rise_long, c.logz_drift_window_steps, dev, s.above_steps));
      }
      if (t2_logz_fast) {
        why.push_back(absl::StrFormat("log_z rose %.2f within %d steps", rise_short,
                                      c.logz_rise_window_steps));
      }
      if (t2_ratio) {
        why.push_back(absl::StrFormat("loss_ema_ratio %.2f above %.1f for %d records",
                                      ratio, c.tier2_loss_ratio, s.high_ratio_records));
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
      s.CollectShards(s.ep.onset - c.shard_steps_before_onset, r.step, &e);
      s.AddShardAction(RecommendedAction::Kind::kQuarantineShards, &e);
      if (logz_led) s.AddZLossAction(r.Get(Signal::kZLossAlpha), &e);
      s.RecommendCheckpoint(&e);
    }

    // -- recovery of an episode that was open before this step
    if (before.active && s.ep.active && s.ep.id == before.id && !skip) {
      const double sl = s.smooth_loss.empty() ? loss : s.smooth_loss.Value();
      const double ex = sl - s.ep.pre_level;
      s.ep.peak_excess = std::max(s.ep.peak_excess, ex);
      const bool logz_active = t2_logz_fast || (rise_long > c.logz_rise && s.ep.paged);
      // Both the smoothed and this step's loss must be back: the smoothed one
      // alone lags a level shift by ~10 steps.
      const bool recovered = ex < c.spike_delta_nats &&
                             loss - s.ep.pre_level < c.spike_delta_nats && !logz_active;
      const bool in_confirm = s.ep.tier1 && r.step - s.ep.tier1_step <= c.tier1_confirm_steps;
      if (s.ep.tier1 && !s.ep.confirmed && in_confirm &&
          (recovered || (s.ep.peak_excess > 0.0 &&
                         ex <= c.tier1_confirm_fraction * s.ep.peak_excess))) {
        s.ep.confirmed = true;
        Event& e = s.NewEvent(out, r, 1, Action::kNone, EventKind::kTier1Confirmed, s.ep.id,
                              s.ep.onset);
        e.reason = recovered
                       ? absl::StrFormat(
                             "data anomaly confirmed: the loss is back at its baseline %.3f "
                             "%d steps after step %d",
                             s.ep.pre_level, r.step - s.ep.tier1_step, s.ep.tier1_step)
                       : absl::StrFormat(
                             "data anomaly confirmed: the loss is returning toward its "
                             "baseline %d steps after step %d (excess %+.3f nats, peak %+.3f)",
                             r.step - s.ep.tier1_step, s.ep.tier1_step, ex, s.ep.peak_excess);
        s.RecommendCheckpoint(&e);
        if (recovered) {
          e.closes_episode = true;
          s.ep.active = false;
          s.above_start = -1;
        }
      } else if (recovered) {
        Event& e = s.NewEvent(out, r, s.ep.tier, Action::kNone, EventKind::kRecovered,
                              s.ep.id, s.ep.onset);
        e.reason = absl::StrFormat(
            "recovered: the smoothed loss %.3f is back within %.2f nats of its pre-spike "
            "level %.3f after %d steps",
            sl, c.spike_delta_nats, s.ep.pre_level, r.step - s.ep.onset);
        e.closes_episode = true;
        s.ep.active = false;
        s.above_start = -1;
      }
    }

    // -- a short excursion the rules above did not explain
    if (!skip) {
      bool quiet = s.ep.active;
      for (const Event& e : out->events) quiet |= e.tier >= 1;
      s.Transient(r, loss, quiet, out);
    }

    // -- the noise scale learns from calm steps only
    if (!s.ep.active && !skip) {
      double d = dev;
      if (Finite(sigma)) {
        const double m = s.dev_mean.Value();
        d = std::clamp(d, m - 5.0 * sigma, m + 5.0 * sigma);
      }
      s.dev_mean.Add(r.step, d);
      s.dev_sq.Add(r.step, d * d);
    }
  } else if (has_loss) {
    // Warming up: learn the noise scale, decide nothing.
    s.smooth_loss.Add(r.step, loss);
    s.Transient(r, loss, /*quiet=*/true, out);
    if (Finite(ema)) {
      const double dev = loss - ema;
      s.dev_mean.Add(r.step, dev);
      s.dev_sq.Add(r.step, dev * dev);
    }
  }

  // ---- update the windows with this step
  if (has_loss) {
    s.prev_loss_step = r.step;
    s.ema.Add(r.step, loss);
  }
  if (Finite(g)) {
    s.pending_grad_step = r.step;
    s.pending_grad = g;
  }
  if (Finite(med)) s.grad_hist.Add(r.step, med);
  const double attn = r.Get(Signal::kAttentionLogitP99);
  if (Finite(attn)) s.attn_hist.Add(r.step, attn);
  const double act = r.Get(Signal::kActivationMax);
  if (Finite(act)) s.act_hist.Add(r.step, act);

  if (skip) out->verdict = Verdict{Decision::kSkipUpdate, 1,
                                   out->events.empty() ? EventKind::kLossRatioSkip
                                                       : out->events.front().kind};
  s.CheckWarnings(r, prev_logz_bucket, prev_grad_bucket, prev_attn_bucket, prev_act_bucket,
                  out);
  return absl::OkStatus();
}

}  // namespace trainwatch::core
