// The state of one run's rule engine, and the rule families that read and
// update it. Private to core: RuleEngine::Judge (rule_engine.cc) calls the
// families in a fixed order, each family has its own file (the per-record
// triggers of the cheapest are inline below), and the unit tests drive one
// family at a time over a hand-made state.
//
// The order matters and is Judge's: tier 3 first (a broken step feeds no
// window), then tier 1 (the skip), the spike and tier 2 (the page), the end
// of an episode, the transient, and the early warnings last.

#ifndef TRAINWATCH_CORE_SRC_ENGINE_STATE_H_
#define TRAINWATCH_CORE_SRC_ENGINE_STATE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/event.h"
#include "trainwatch/core/rule_engine.h"
#include "trainwatch/core/step_record.h"
#include "trainwatch/core/windows.h"

namespace trainwatch::core {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

inline bool Finite(double v) { return std::isfinite(v); }

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

struct NamedShardEntry {
  int64_t step;
  std::vector<std::string> names;
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
  int64_t records = 0;      // loss records judged since it opened
};

struct EngineState {
  // REQUIRES: Validate(config).ok().
  explicit EngineState(const RuleConfig& config);

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
  // Named shards of recent steps, oldest first: a deque of owned strings,
  // not a preallocated ring like the ids, since names vary in length;
  // shard_name_bytes (as config.h counts them) stays within
  // shard_name_history_bytes.
  std::deque<NamedShardEntry> shard_name_steps;
  size_t shard_name_bytes = 0;
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
  int64_t above_records = 0;  // loss records of the spike so far
  int64_t below_records = 0;
  int64_t prev_loss_step = -1;
  // Consecutive records with loss_ema_ratio above the tier 2 threshold.
  int64_t high_ratio_records = 0;
  int64_t high_ratio_start = -1;
  // Warm-up divergence (warmup_rules.cc): the lowest finite loss so far, the
  // current run of records far above it, and whether it has paged.
  double warm_min_loss = std::numeric_limits<double>::infinity();
  int64_t warm_high_records = 0;
  int64_t warm_high_start = -1;
  bool warm_paged = false;

  Episode ep;
  uint64_t next_episode = 1;

  bool t3_active = false;
  int64_t t3_clean = 0;
  // Loss-scale overflow steps in a row, up to this record.
  int64_t overflow_run = 0;

  bool warn_active[kNumWarn] = {};

  // Scratch, kept to avoid allocating per step.
  std::vector<std::string> reasons;

  // ---- per step: inline, they run on every record

  void RecordShards(const StepRecord& r) {
    if (!r.shard_names.empty()) RecordShardNames(r);
    if (r.shards.empty() || shard_steps.empty()) return;
    const size_t cap = shard_steps.size();
    // Wrapped by a compare, not %: a division on every record was a few
    // percent of Judge.
    size_t slot;
    if (shard_count == cap) {
      slot = shard_head;
      shard_head = shard_head + 1 == cap ? 0 : shard_head + 1;
    } else {
      slot = shard_head + shard_count;
      if (slot >= cap) slot -= cap;
      ++shard_count;
    }
    const size_t per = static_cast<size_t>(c.max_shards_per_step);
    const size_t n = std::min(per, r.shards.size());
    // The first id by hand: most steps name one shard, and a memmove call
    // for eight bytes was a few percent of Judge.
    uint64_t* const ids = shard_ids.data() + slot * per;
    if (n > 0) ids[0] = r.shards[0];
    if (n > 1) std::copy_n(r.shards.begin() + 1, n - 1, ids + 1);
    shard_steps[slot] = ShardEntry{r.step, static_cast<uint32_t>(n), r.shards.size() > n};
  }

  // The noise scale learns from (loss - EMA) of calm steps.
  void LearnNoise(int64_t step, double dev) {
    dev_mean.Add(step, dev);
    dev_sq.Add(step, dev * dev);
  }

  void OpenEpisode(int64_t onset, double pre_level) {
    ep = Episode{};
    ep.active = true;
    ep.id = next_episode++;
    ep.onset = onset;
    ep.pre_level = pre_level;
  }

  // ---- when an event is written (engine_state.cc)

  void AddCheckpoint(int64_t step, absl::string_view uri);
  // Keeps the record's shard names, dropping the oldest within the bounds.
  void RecordShardNames(const StepRecord& r);
  // An event of this step, carrying the step's numbers; the caller sets the
  // reason and the recommendations.
  Event& NewEvent(StepOutcome* out, const StepRecord& r, int tier, Action action,
                  EventKind kind, uint64_t episode, int64_t onset) const;
  // Puts the shards of steps [from, to] on the event, sorted and capped.
  void CollectShards(int64_t from, int64_t to, Event* e) const;
  void RecommendCheckpoint(Event* e) const;
  // An inspect or quarantine action over the event's shard range, if any.
  void AddShardAction(RecommendedAction::Kind kind, Event* e) const;
  void AddZLossAction(double current_alpha, Event* e) const;
  // The evidence most events carry: the shards of [from, to], the action
  // over them and the checkpoint to return to.
  void AddEvidence(int64_t from, int64_t to, RecommendedAction::Kind kind, Event* e) const {
    CollectShards(from, to, e);
    AddShardAction(kind, e);
    RecommendCheckpoint(e);
  }
  size_t MemoryBytes() const;
};

// What the rules read about one step: the record, and what Judge derived
// from it and from the baseline of the previous steps.
struct StepFacts {
  const StepRecord& r;
  double loss = kNaN;
  double grad = kNaN;
  double ema = kNaN;           // of the previous steps' losses
  double grad_median = kNaN;   // of the previous steps' grad norms
  double ratio = kNaN;         // loss / ema
  bool warm = false;
  // The smoothed log_z over its minimum in the short and the long window.
  double rise_short = kNaN;
  double rise_long = kNaN;
  // Set on warm steps with a loss and an EMA only (the deciding steps).
  double dev = 0.0;       // loss - ema
  double sigma = kNaN;    // the noise scale of dev, NaN while unknown
  bool sigma_ok = false;  // the noise scale has seen enough calm steps
};

// ---- the rule families, in the order Judge calls them

// Warm-up (warmup_rules.cc), on the steps before the baseline exists: a bad
// batch is recorded (tier 0), a divergence far above the lowest loss so far
// pages (tier 2). Never a skip.
void CheckWarmUp(EngineState& s, const StepFacts& f, StepOutcome* out);

// Tier 3, numerical failure (numerical_rule.cc): a nonfinite value, nonfinite
// gradients, a loss explosion without a gradient explanation, or a collapsing
// fp16 loss scale. True when this step is one (the verdict is a halt) or a
// loss-scale overflow the scaler skipped (tier 0, the verdict continue): either
// way the step feeds no window.
bool CheckNumericalFailure(EngineState& s, const StepFacts& f, StepOutcome* out);

// Tier 1, data anomaly: a grad-norm outlier with a loss jump, or a loss
// ratio past the skip threshold. True when the optimizer update must be
// skipped (the verdict says so). The trigger is here, inline, because it
// runs on every record (out of line, it and the spike's and tier 2's cost
// Judge measurably more instructions); data_anomaly_rule.cc writes the
// event.
bool ReportDataAnomaly(EngineState& s, const StepFacts& f, bool tier1, double grad_ratio,
                       StepOutcome* out);
// The step's deviation from the EMA and the run's noise scale (f.dev,
// f.sigma, f.sigma_ok), from the calm steps so far.
inline void ReadNoise(const EngineState& s, StepFacts* f) {
  f->dev = f->loss - f->ema;
  const double sigma_sq = s.dev_sq.Value() - s.dev_mean.Value() * s.dev_mean.Value();
  f->sigma_ok = s.dev_sq.count() >= s.c.warmup_min_records;
  f->sigma = f->sigma_ok && sigma_sq > 0.0 ? std::sqrt(sigma_sq) : kNaN;
}
// The local level: the median of the transient's baseline (the records
// before its short window) and its noise, 1.4826 x their median absolute
// deviation; known once both windows are full. Unlike the EMA it does not
// lag a loss that is still falling. The transient and the tier 1 trigger
// read it.
struct LocalLevel {
  bool known = false;
  double level = kNaN;
  double noise = kNaN;
};
inline LocalLevel ReadLocalLevel(const EngineState& s) {
  const int64_t full = s.c.transient_baseline_records;
  LocalLevel l;
  l.known = static_cast<int64_t>(s.transient_base.size()) >= full &&
            static_cast<int64_t>(s.transient_dev.size()) >= full / 2;
  if (l.known) {
    l.level = s.transient_base.Median();
    l.noise = 1.4826 * s.transient_dev.Median();
  }
  return l;
}
// grad_norm / its median, NaN when either is unknown.
inline double GradRatio(const StepFacts& f) {
  return Finite(f.grad) && Finite(f.grad_median) && f.grad_median > 0.0 ? f.grad / f.grad_median
                                                                         : kNaN;
}
// The loss jump over the EMA: the ratio, or spike-sized and clear of the
// run's noise.
inline bool EmaJump(const RuleConfig& c, const StepFacts& f) {
  const bool clear = f.dev >= c.spike_delta_nats && f.sigma_ok &&
                     (!Finite(f.sigma) || f.dev >= c.tier1_loss_z * f.sigma);
  return f.ratio > c.tier1_loss_ratio || clear;
}
// A spike-sized jump clear of the local noise: the EMA lags a loss that is
// still falling (the 1,000-step EMA of a run at step 1,800 can sit 0.3 nats
// above it), which hides a bad batch's jump from the EMA's test and widens
// its noise; the local level does not lag.
inline bool LocalJump(const RuleConfig& c, const LocalLevel& l, double loss) {
  const double dev = loss - l.level;
  return l.known && dev >= c.spike_delta_nats && dev >= c.tier1_loss_z * l.noise;
}
// The tier 1 trigger: a grad-norm outlier with a loss jump, over the EMA or
// the local level (read only after a grad-norm outlier: rare). Also what
// warm-up records.
inline bool Tier1Trigger(const EngineState& s, const StepFacts& f, double grad_ratio) {
  const RuleConfig& c = s.c;
  if (!(grad_ratio > c.tier1_grad_ratio)) return false;
  return EmaJump(c, f) || LocalJump(c, ReadLocalLevel(s), f.loss);
}
inline bool CheckDataAnomaly(EngineState& s, const StepFacts& f, StepOutcome* out) {
  const double grad_ratio = GradRatio(f);
  const bool tier1 = Tier1Trigger(s, f, grad_ratio);
  if (!tier1 && !(f.ratio > s.c.skip_loss_ratio)) return false;
  return ReportDataAnomaly(s, f, tier1, grad_ratio, out);
}

// The loss spike: tracks the run of steps >= spike_delta above the EMA and,
// when it lasts, opens an episode (page_rules.cc writes the event). True
// while a spike is in progress.
void ReportSpike(EngineState& s, const StepFacts& f, StepOutcome* out);
inline bool TrackSpike(EngineState& s, const StepFacts& f, StepOutcome* out) {
  const RuleConfig& c = s.c;
  const int64_t step = f.r.step;
  // A few quiet records inside a spike (noise) neither end it nor count
  // toward its length.
  if (f.dev >= c.spike_delta_nats) {
    if (s.above_start < 0) {
      s.above_start = step;
      s.above_start_level = f.ema;
      s.above_steps = 0;
      s.above_records = 0;
    }
    // A record stands for the steps since the previous one (logs that
    // report every K steps), a dip record for none.
    s.above_steps += s.above_start == step || s.prev_loss_step < 0 ? 1 : step - s.prev_loss_step;
    ++s.above_records;
    s.below_records = 0;
  } else if (s.above_start >= 0 && ++s.below_records > c.spike_gap_records) {
    s.above_start = -1;
  }
  const bool spike = s.above_start >= 0 && s.above_steps > c.spike_min_steps &&
                     s.above_records >= c.min_window_records;
  if (!spike) return false;
  if (s.ep.active) {
    s.ep.spike = true;
  } else {
    ReportSpike(s, f, out);
  }
  return true;
}

// Tier 2, page a human: a lasting high loss ratio, a log_z rise, a log_z
// drift during a spike, or an episode that does not recover. Pages once per
// episode (page_rules.cc writes the page).
struct PageCauses {
  bool ratio, logz_fast, logz_drift, nonrecovering;
  double excess;  // of the smoothed loss over the episode's pre-spike level
};
void Page(EngineState& s, const StepFacts& f, const PageCauses& causes, StepOutcome* out);
inline void CheckPage(EngineState& s, const StepFacts& f, bool spike, StepOutcome* out) {
  const RuleConfig& c = s.c;
  if (f.ratio > c.tier2_loss_ratio) {
    if (s.high_ratio_records++ == 0) s.high_ratio_start = f.r.step;
  } else {
    s.high_ratio_records = 0;
  }
  if (s.ep.active) ++s.ep.records;
  PageCauses why;
  why.ratio = s.high_ratio_records >= c.tier2_loss_ratio_records;
  why.logz_fast = f.rise_short > c.logz_rise;
  why.logz_drift = f.rise_long > c.logz_rise && spike;
  why.excess =
      s.ep.active ? (s.smooth_loss.empty() ? f.dev : s.smooth_loss.Value()) - s.ep.pre_level
                  : 0.0;
  why.nonrecovering = s.ep.active && (s.ep.tier1 || s.ep.spike) &&
                      f.r.step - s.ep.onset >= c.escalate_steps &&
                      s.ep.records >= c.min_window_records && why.excess >= c.spike_delta_nats;
  if (!(why.ratio || why.logz_fast || why.logz_drift || why.nonrecovering) ||
      (s.ep.active && s.ep.paged)) {
    return;
  }
  Page(s, f, why, out);
}

// The end of an episode (recovery_rule.cc): tier 1 confirmed, or the loss
// back at its pre-spike level. Only for the episode `episode_before` that was
// open before this step (0: none), on a step whose update was applied.
void CheckRecovery(EngineState& s, const StepFacts& f, uint64_t episode_before,
                   StepOutcome* out);

// The transient (transient_rule.cc): feeds one applied step's loss to the
// local windows and reports a short excursion on its rising edge. `quiet`
// suppresses the report, not the feed.
void FeedTransient(EngineState& s, const StepRecord& r, double loss, bool quiet,
                   StepOutcome* out);

// The early warnings (warning_rules.cc) are evaluated once per completed
// bucket; this marks where each history stood before the step.
struct WarningMarks {
  int64_t logz, grad, attn, act;
};
inline WarningMarks MarkWarnings(const EngineState& s) {
  return {s.logz_buckets.newest_index(), s.grad_hist.newest_index(),
          s.attn_hist.newest_index(), s.act_hist.newest_index()};
}
void CheckWarnings(EngineState& s, const StepRecord& r, const WarningMarks& before,
                   StepOutcome* out);

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_SRC_ENGINE_STATE_H_
