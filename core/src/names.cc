// Wire and file names of the core enums. They appear in replay output, the
// store and the API: renaming one is a breaking change.

#include "trainwatch/core/event.h"
#include "trainwatch/core/step_record.h"

namespace trainwatch::core {

absl::string_view SignalName(Signal s) {
  switch (s) {
    case Signal::kLoss: return "loss";
    case Signal::kGradNorm: return "grad_norm";
    case Signal::kLogZ: return "log_z";
    case Signal::kNanFrac: return "nan_frac";
    case Signal::kLearningRate: return "lr";
    case Signal::kZLossAlpha: return "z_loss_alpha";
    case Signal::kActivationMax: return "activation_max";
    case Signal::kAttentionLogitP99: return "attention_logit_p99";
  }
  return "unknown";
}

absl::string_view DecisionName(Decision d) {
  switch (d) {
    case Decision::kContinue: return "continue";
    case Decision::kSkipUpdate: return "skip_update";
    case Decision::kHalt: return "halt";
  }
  return "unknown";
}

absl::string_view ActionName(Action a) {
  switch (a) {
    case Action::kNone: return "none";
    case Action::kRecord: return "record";
    case Action::kSkipUpdate: return "skip_update";
    case Action::kPage: return "page";
    case Action::kHalt: return "halt";
    case Action::kWarn: return "warn";
  }
  return "unknown";
}

absl::string_view EventKindName(EventKind k) {
  switch (k) {
    case EventKind::kDataAnomaly: return "data_anomaly";
    case EventKind::kLossRatioSkip: return "loss_ratio_skip";
    case EventKind::kSpike: return "spike";
    case EventKind::kTier1Confirmed: return "tier1_confirmed";
    case EventKind::kRecovered: return "recovered";
    case EventKind::kNonRecovering: return "non_recovering";
    case EventKind::kLossRatioHigh: return "loss_ratio_high";
    case EventKind::kLogZRise: return "log_z_rise";
    case EventKind::kLogZDrift: return "log_z_drift";
    case EventKind::kNonfiniteGradients: return "nonfinite_gradients";
    case EventKind::kNonfiniteValue: return "nonfinite_value";
    case EventKind::kLossExplosion: return "loss_explosion";
    case EventKind::kWarnLogZ: return "warn_log_z";
    case EventKind::kWarnGradMedian: return "warn_grad_median";
    case EventKind::kWarnAttentionLogits: return "warn_attention_logits";
    case EventKind::kWarnActivations: return "warn_activations";
    case EventKind::kTransient: return "transient";
    case EventKind::kLossScaleOverflow: return "loss_scale_overflow";
    case EventKind::kLossScaleCollapse: return "loss_scale_collapse";
    case EventKind::kStall: return "stall";
    case EventKind::kRankLost: return "rank_lost";
    case EventKind::kStraggler: return "straggler";
  }
  return "unknown";
}

absl::string_view RecommendedActionKindName(RecommendedAction::Kind k) {
  switch (k) {
    case RecommendedAction::Kind::kQuarantineShards: return "quarantine_shards";
    case RecommendedAction::Kind::kInspectShards: return "inspect_shards";
    case RecommendedAction::Kind::kSetZLossAlpha: return "set_z_loss_alpha";
    case RecommendedAction::Kind::kWidenPrecision: return "widen_precision";
  }
  return "unknown";
}

}  // namespace trainwatch::core
