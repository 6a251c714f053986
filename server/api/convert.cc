#include "api/convert.h"

#include "absl/strings/str_cat.h"
#include "trainwatch/wire/step_report.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;
using wire::RuleToProto;
using wire::SetTime;
using wire::TierToProto;

void StepToProto(const StepRow& s, v1::StepMetrics* out) {
  out->set_step(s.step);
  wire::MetricsToProto(s, s.loss_ema_ratio, out->mutable_metrics());
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
  out->set_observed(r.observed);
}

void AttemptToProto(const AttemptRow& a, v1::AttemptInfo* out) {
  out->set_attempt(a.attempt);
  switch (a.start) {
    case AttemptStart::kFirst:
      out->set_start(v1::ATTEMPT_START_FIRST);
      break;
    case AttemptStart::kRollback:
      out->set_start(v1::ATTEMPT_START_ROLLBACK);
      break;
    case AttemptStart::kResume:
      out->set_start(v1::ATTEMPT_START_RESUME);
      break;
  }
  if (a.incident_id > 0) out->set_incident_id(absl::StrCat("I-", a.incident_id));
  out->set_incarnation_id(a.incarnation);
  out->set_from_step(a.from_step);
  out->set_first_step(a.first_step);
  out->set_last_step(a.last_step);
  if (a.started_ms > 0) SetTime(a.started_ms, out->mutable_started_at());
}

void RunToProto(const RunView& s, int32_t ranks_connected, int64_t now_ms, v1::RunInfo* out) {
  out->set_run_id(s.row.run_id);
  out->set_world_size(s.row.world_size);
  out->set_latest_step(s.row.last_step);
  out->set_attempt(s.row.attempt);
  out->set_ranks_connected(ranks_connected);
  out->set_rules_source(s.row.rules_source);  // rules_json: GetRunStatus's alone
  out->set_agent_decisions(s.agent_decisions_total);
  out->set_decision_divergences(s.decision_divergences_total);
  out->set_rebuilding(s.rebuilding);
  int open = 0;
  for (int t = 0; t < 4; ++t) open += static_cast<int>(s.open_incidents[t]);
  out->set_open_incidents(open);
  SetTime(s.row.created_ms, out->mutable_first_seen());
  SetTime(s.row.last_seen_ms, out->mutable_last_seen());
  out->set_observed(s.row.observed);
  if (s.warm_up.has_value()) {
    v1::RunWarmUp* w = out->mutable_warm_up();
    w->set_active(s.warm_up->active);
    w->set_until_step(s.warm_up->until_step);
    w->set_loss_records(s.warm_up->loss_records);
    w->set_grad_samples(s.warm_up->grad_samples);
    w->set_needs_grad(s.warm_up->needs_grad);
  }
  out->set_attachment(s.row.attachment);
  if (const LivenessView& l = s.liveness; l.ranks_alive > 0) {
    v1::RunLiveness* live = out->mutable_liveness();
    live->set_seconds_since_step(static_cast<double>(now_ms - l.last_step_ms) / 1000.0);
    live->set_stall_bound_seconds(static_cast<double>(l.bound_ms) / 1000.0);
    live->set_stalled(l.stalled);
    live->set_ranks_alive(l.ranks_alive);
    live->set_ranks_lost(l.ranks_lost);
    live->set_step_seconds(static_cast<double>(l.step_ms_median) / 1000.0);
    live->set_goodput(l.goodput);
    for (const RankTiming& t : l.slowest) {
      v1::RankPace* p = live->add_slowest();
      p->set_rank(t.rank);
      p->set_host_name(t.host);
      p->set_ratio(t.ratio);
      p->set_lead_seconds(static_cast<double>(t.lead_ms) / 1000.0);
    }
  }
  // A followed run's trainer cannot be halted: its halt verdict is a
  // recommendation, and the run trains on.
  const bool halted = !s.row.observed && s.has_latest &&
                      s.latest.decision == static_cast<int>(core::Decision::kHalt);
  out->set_state(halted                ? v1::RUN_STATE_HALTED
                 : ranks_connected > 0 ? v1::RUN_STATE_RUNNING
                 : s.liveness.ended    ? v1::RUN_STATE_FINISHED
                                       : v1::RUN_STATE_STALE);
}

}  // namespace trainwatch::server
