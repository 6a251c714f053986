// What the rule engine decides: a per-step verdict for the trainer, and events
// for everything a person or the server should know about. An event belongs
// to an episode (one data anomaly, one drift, one numerical failure): the
// server opens one incident per episode, not one per step.

#ifndef TRAINWATCH_CORE_EVENT_H_
#define TRAINWATCH_CORE_EVENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace trainwatch::core {

// What the trainer must do before optimizer.step() of this step.
enum class Decision : uint8_t { kContinue = 0, kSkipUpdate, kHalt };

enum class Action : uint8_t {
  kNone = 0,     // a state change worth recording (confirmed, recovered)
  kRecord,       // record the batch's shards for inspection, no intervention
  kSkipUpdate,   // the optimizer update of this step is skipped
  kPage,         // a human decides on a rollback
  kHalt,         // the run stops at once
  kWarn,         // early warning: an alert, not a page
};

enum class EventKind : uint8_t {
  kDataAnomaly = 0,      // tier 1: single-step grad-norm outlier with a loss jump
  kLossRatioSkip,        // tier 1: loss_ema_ratio above the skip threshold
  kSpike,                // tier 0: loss >= delta above its EMA for > N steps
  kTier1Confirmed,       // tier 1: the loss is returning toward baseline
  kRecovered,            // the episode's loss is back at its pre-spike level
  kNonRecovering,        // tier 2: no recovery within the escalation window
  kLossRatioHigh,        // tier 2: loss_ema_ratio above the tier 2 threshold
  kLogZRise,             // tier 2: log_z rose fast (the 300-step rule)
  kLogZDrift,            // tier 2: log_z drift corroborated by a loss spike
  kNonfiniteGradients,   // tier 3: nan_frac > 0
  kNonfiniteValue,       // tier 3: a reported signal is NaN or Inf
  kLossExplosion,        // tier 3: loss above the ceiling, grads not explaining it
  kWarnLogZ,             // early warning: log_z high and rising for long
  kWarnGradMedian,       // early warning: grad-norm median rising steadily
  kWarnAttentionLogits,  // early warning: attention logit p99 rising
  kWarnActivations,      // early warning: activation max trending to the limit
  kTransient,            // tier 0: a short loss excursion over its local level
  kLossScaleOverflow,    // tier 0: the fp16 loss scaler skipped an overflow step
  kLossScaleCollapse,    // tier 3: overflows persist or the loss scale is below its floor
  // Raised by trainwatchd from the agents' heartbeats, never by the engine:
  kStall,                // tier 2: no step for longer than the run's learned bound
  kRankLost,             // tier 2: a rank's heartbeats stopped, the others' did not
  kStraggler,            // tier 2, a warning page: one rank sets the job's pace
};

absl::string_view DecisionName(Decision d);
absl::string_view ActionName(Action a);
absl::string_view EventKindName(EventKind k);

struct RecommendedAction {
  enum class Kind : uint8_t {
    kQuarantineShards = 0,  // drop shard ids [shard_first, shard_last]
    kInspectShards,         // look at [shard_first, shard_last] offline
    kSetZLossAlpha,         // set the z-loss coefficient to z_loss_alpha
    kWidenPrecision,        // run `tensor` in a wider precision
  };
  Kind kind = Kind::kQuarantineShards;
  uint64_t shard_first = 0;
  uint64_t shard_last = 0;
  // For the shard kinds: false when the event had named shards only, so
  // [shard_first, shard_last] means nothing (0..0 is a real range).
  bool has_shard_range = true;
  // For the shard kinds: the named shards, besides the range.
  std::vector<std::string> shard_names;
  double z_loss_alpha = 0.0;
  std::string tensor;
  // The same in words, e.g. "quarantine shards 1042100..1042180".
  std::string text;
};

absl::string_view RecommendedActionKindName(RecommendedAction::Kind k);

struct Event {
  int64_t step = 0;         // detection step
  int64_t onset_step = 0;   // where the episode began
  int tier = 0;             // 0 for early warnings and spike notices
  Action action = Action::kNone;
  EventKind kind = EventKind::kSpike;
  uint64_t episode = 0;     // engine-local episode number, from 1
  std::string reason;       // what fired and why, in words, with the numbers
  std::vector<uint64_t> shards;  // sorted, unique, around onset..detection
  // The named shards of the same steps, sorted and unique; max_event_shards
  // bounds them apart from the ids.
  std::vector<std::string> shard_names;
  bool shards_truncated = false;  // ids or names were left out
  int64_t recommended_checkpoint_step = -1;  // -1: none retained qualifies
  std::string recommended_checkpoint_uri;
  std::vector<RecommendedAction> recommended_actions;
  // True on the event that ends its episode (recovered, or a tier 1
  // confirmed with the loss back at baseline): the incident can resolve.
  bool closes_episode = false;
  // Core signals (see kCoreSignals) this run never reported, so the rules
  // that need them could not take part in this decision.
  uint32_t lacked_signals = 0;

  // The numbers at detection, for summaries; NaN where unknown.
  double loss = 0.0;
  double loss_ema = 0.0;
  double loss_ema_ratio = 0.0;
  double grad_norm = 0.0;
  double grad_norm_median = 0.0;
  double log_z = 0.0;
};

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_EVENT_H_
