#include "trainwatch/wire/enums.h"

namespace trainwatch::wire {

namespace v1 = trainwatch::v1;
using core::Decision;
using core::EventKind;
using ActionKind = core::RecommendedAction::Kind;

namespace {

// The readers invert the writers by search, so that each mapping is written
// once: the first of the values 0..`last` that `to_proto` maps to `p`.
template <typename Core, typename Proto, typename ToProto>
std::optional<Core> Invert(ToProto to_proto, Core last, Proto p) {
  for (int i = 0; i <= static_cast<int>(last); ++i) {
    if (to_proto(static_cast<Core>(i)) == p) return static_cast<Core>(i);
  }
  return std::nullopt;
}

}  // namespace

v1::Tier TierToProto(int tier) {
  switch (tier) {
    case 1: return v1::TIER_DATA_ANOMALY;
    case 2: return v1::TIER_LOGIT_DRIFT;
    case 3: return v1::TIER_NUMERICAL_FAILURE;
    default: return v1::TIER_EARLY_WARNING;
  }
}

int TierFromProto(v1::Tier tier) { return Invert(TierToProto, 3, tier).value_or(-1); }

v1::Rule RuleToProto(EventKind kind) {
  switch (kind) {
    case EventKind::kDataAnomaly: return v1::RULE_GRAD_NORM_SPIKE;
    case EventKind::kLossRatioSkip: return v1::RULE_LOSS_EMA_RATIO_SKIP;
    case EventKind::kSpike: return v1::RULE_LOSS_SPIKE;
    case EventKind::kTier1Confirmed: return v1::RULE_GRAD_NORM_SPIKE;
    case EventKind::kRecovered: return v1::RULE_LOSS_SPIKE;
    case EventKind::kNonRecovering: return v1::RULE_LOSS_NOT_RECOVERED;
    case EventKind::kLossRatioHigh: return v1::RULE_LOSS_EMA_RATIO_ROLLBACK;
    case EventKind::kLogZRise: return v1::RULE_LOG_Z_RISE;
    case EventKind::kLogZDrift: return v1::RULE_LOG_Z_DRIFT;
    case EventKind::kNonfiniteGradients: return v1::RULE_NONFINITE_GRADIENT;
    case EventKind::kNonfiniteValue: return v1::RULE_NONFINITE_METRIC;
    case EventKind::kLossExplosion: return v1::RULE_LOSS_ABOVE_LIMIT;
    case EventKind::kWarnLogZ: return v1::RULE_LOG_Z_HIGH_RISING;
    case EventKind::kWarnGradMedian: return v1::RULE_GRAD_NORM_MEDIAN_RISING;
    case EventKind::kWarnAttentionLogits: return v1::RULE_ATTENTION_LOGIT_RISING;
    case EventKind::kWarnActivations: return v1::RULE_ACTIVATION_MAX_RISING;
    case EventKind::kTransient: return v1::RULE_LOSS_TRANSIENT;
    case EventKind::kLossScaleOverflow: return v1::RULE_LOSS_SCALE_OVERFLOW;
    case EventKind::kLossScaleCollapse: return v1::RULE_LOSS_SCALE_COLLAPSE;
    case EventKind::kStall: return v1::RULE_STALL;
    case EventKind::kRankLost: return v1::RULE_RANK_LOST;
    case EventKind::kStraggler: return v1::RULE_STRAGGLER;
  }
  return v1::RULE_UNSPECIFIED;
}

std::optional<EventKind> RuleFromProto(v1::Rule rule) {
  return Invert(RuleToProto, EventKind::kStraggler, rule);  // the last kind
}

v1::Verdict DecisionToProto(Decision d) {
  switch (d) {
    case Decision::kSkipUpdate: return v1::VERDICT_SKIP;
    case Decision::kHalt: return v1::VERDICT_HALT;
    case Decision::kContinue: break;
  }
  return v1::VERDICT_CONTINUE;
}

Decision DecisionFromProto(v1::Verdict v) {
  return Invert(DecisionToProto, Decision::kHalt, v).value_or(Decision::kContinue);
}

v1::ActionKind ActionKindToProto(ActionKind k) {
  switch (k) {
    case ActionKind::kQuarantineShards: return v1::ACTION_KIND_QUARANTINE_SHARDS;
    case ActionKind::kInspectShards: return v1::ACTION_KIND_INSPECT_SHARDS;
    case ActionKind::kSetZLossAlpha: return v1::ACTION_KIND_SET_Z_LOSS_ALPHA;
    case ActionKind::kWidenPrecision: return v1::ACTION_KIND_SET_LAYER_PRECISION;
  }
  return v1::ACTION_KIND_UNSPECIFIED;
}

std::optional<ActionKind> ActionKindFromProto(v1::ActionKind k) {
  return Invert(ActionKindToProto, ActionKind::kWidenPrecision, k);  // the last kind
}

}  // namespace trainwatch::wire
