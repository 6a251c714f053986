#include "convert.h"

#include <cmath>

namespace trainwatch::server {

namespace v1 = trainwatch::v1;
using core::EventKind;
using core::Signal;

void SetTime(int64_t ms, google::protobuf::Timestamp* t) {
  t->set_seconds(ms / 1000);
  t->set_nanos(static_cast<int32_t>((ms % 1000) * 1'000'000));
}

v1::Tier TierToProto(int tier) {
  switch (tier) {
    case 1: return v1::TIER_DATA_ANOMALY;
    case 2: return v1::TIER_LOGIT_DRIFT;
    case 3: return v1::TIER_NUMERICAL_FAILURE;
    default: return v1::TIER_EARLY_WARNING;
  }
}

int TierFromProto(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_DATA_ANOMALY: return 1;
    case v1::TIER_LOGIT_DRIFT: return 2;
    case v1::TIER_NUMERICAL_FAILURE: return 3;
    case v1::TIER_EARLY_WARNING: return 0;
    default: return -1;
  }
}

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
  }
  return v1::RULE_UNSPECIFIED;
}

void StepToProto(const StepRow& s, v1::StepMetrics* out) {
  out->set_step(s.step);
  v1::Metrics* m = out->mutable_metrics();
  if (s.Has(Signal::kLoss)) m->set_loss(s.Get(Signal::kLoss));
  if (s.Has(Signal::kGradNorm)) m->set_grad_norm(s.Get(Signal::kGradNorm));
  if (s.Has(Signal::kLogZ)) m->set_log_z(s.Get(Signal::kLogZ));
  if (s.Has(Signal::kNanFrac)) m->set_nan_frac(s.Get(Signal::kNanFrac));
  if (!std::isnan(s.loss_ema_ratio)) m->set_loss_ema_ratio(s.loss_ema_ratio);
  if (s.received_ms > 0) SetTime(s.received_ms, out->mutable_time());
}

void IncidentToProto(const IncidentRow& r, v1::Incident* out) {
  out->set_incident_id(r.public_id());
  out->set_run_id(r.run_id);
  out->set_tier(TierToProto(r.tier));
  out->set_state(static_cast<v1::IncidentState>(static_cast<int>(r.state)));
  out->set_rule(RuleToProto(r.kind));
  out->set_title(r.title);
  out->set_onset_step(r.onset_step);
  out->set_detection_step(r.detection_step);
  SetTime(r.opened_ms, out->mutable_opened_at());
  SetTime(r.updated_ms, out->mutable_updated_at());
  if (r.closed_ms > 0) SetTime(r.closed_ms, out->mutable_closed_at());
}

void RunToProto(const RunSnapshot& s, int32_t ranks_connected, v1::RunInfo* out) {
  out->set_run_id(s.row.run_id);
  out->set_world_size(s.row.world_size);
  out->set_latest_step(s.row.last_step);
  out->set_attempt(s.row.attempt);
  out->set_ranks_connected(ranks_connected);
  int open = 0;
  for (int t = 0; t < 4; ++t) open += static_cast<int>(s.open_incidents[t]);
  out->set_open_incidents(open);
  SetTime(s.row.created_ms, out->mutable_first_seen());
  SetTime(s.row.last_seen_ms, out->mutable_last_seen());
  const bool halted = s.has_latest && s.latest.decision == static_cast<int>(core::Decision::kHalt);
  out->set_state(halted ? v1::RUN_STATE_HALTED
                 : ranks_connected > 0 ? v1::RUN_STATE_RUNNING
                                       : v1::RUN_STATE_STALE);
}

}  // namespace trainwatch::server
