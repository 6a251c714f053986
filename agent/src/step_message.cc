#include "step_message.h"

#include <cmath>
#include <string>

namespace trainwatch::agent::internal {

using core::Signal;

namespace {

v1::Rule RuleOf(core::EventKind k) {
  switch (k) {
    case core::EventKind::kDataAnomaly: return v1::RULE_GRAD_NORM_SPIKE;
    case core::EventKind::kLossRatioSkip: return v1::RULE_LOSS_EMA_RATIO_SKIP;
    case core::EventKind::kNonfiniteGradients: return v1::RULE_NONFINITE_GRADIENT;
    case core::EventKind::kNonfiniteValue: return v1::RULE_NONFINITE_METRIC;
    case core::EventKind::kLossExplosion: return v1::RULE_LOSS_ABOVE_LIMIT;
    default: return v1::RULE_UNSPECIFIED;
  }
}

v1::StepReport* NewStepReport(const Origin& origin, v1::AgentMessage* m, int64_t step,
                              bool rank_scope) {
  v1::StepReport* r = m->mutable_step_report();
  r->set_run_id(origin.run_id);
  r->set_rank(origin.rank);
  r->set_world_size(origin.world_size);
  r->set_step(step);
  r->set_scope(rank_scope ? v1::REPORT_SCOPE_RANK : v1::REPORT_SCOPE_GLOBAL);
  return r;
}

}  // namespace

v1::AgentMessage StepMessage(const Origin& origin, const Slot& s) {
  v1::AgentMessage m;
  v1::StepReport* r = NewStepReport(origin, &m, s.step, s.rank_scope);
  auto* mt = r->mutable_metrics();
  const core::StepValues& v = s.values;
  if (v.Has(Signal::kLoss)) mt->set_loss(v.Get(Signal::kLoss));
  if (v.Has(Signal::kGradNorm)) mt->set_grad_norm(v.Get(Signal::kGradNorm));
  if (v.Has(Signal::kLogZ)) mt->set_log_z(v.Get(Signal::kLogZ));
  if (v.Has(Signal::kNanFrac)) mt->set_nan_frac(v.Get(Signal::kNanFrac));
  if (!std::isnan(s.loss_ema_ratio)) mt->set_loss_ema_ratio(s.loss_ema_ratio);
  if (v.Has(Signal::kLearningRate)) r->set_learning_rate(v.Get(Signal::kLearningRate));
  if (v.Has(Signal::kZLossAlpha)) r->set_z_loss_alpha(v.Get(Signal::kZLossAlpha));
  if (v.Has(Signal::kActivationMax)) r->set_activation_max(v.Get(Signal::kActivationMax));
  if (v.Has(Signal::kAttentionLogitP99)) {
    r->add_attention_logit_p99(v.Get(Signal::kAttentionLogitP99));
  }
  r->set_nonfinite_count(s.nonfinite);
  r->set_element_count(s.elements);
  if (!s.gathered_shards.empty()) {
    for (uint64_t id : s.gathered_shards) r->add_shard_ids(id);
  } else {
    for (uint16_t i = 0; i < s.shard_count; ++i) r->add_shard_ids(s.shards[i]);
  }
  const Decision d = s.verdict.decision;
  r->set_verdict(d == Decision::kHalt         ? v1::VERDICT_HALT
                 : d == Decision::kSkipUpdate ? v1::VERDICT_SKIP
                                              : v1::VERDICT_CONTINUE);
  r->set_update_skipped(d == Decision::kSkipUpdate);
  if (d != Decision::kContinue) {
    r->set_skip_rule(RuleOf(s.verdict.rule));
    r->set_skip_tier(s.verdict.tier == 3 ? v1::TIER_NUMERICAL_FAILURE : v1::TIER_DATA_ANOMALY);
  }
  r->mutable_time()->set_seconds(s.time_ms / 1000);
  r->mutable_time()->set_nanos(static_cast<int32_t>(s.time_ms % 1000) * 1000000);
  return m;
}

std::unique_ptr<v1::AgentMessage> TensorReportMessage(const Origin& origin,
                                                      const StepInput& in) {
  auto m = std::make_unique<v1::AgentMessage>();
  v1::StepReport* r = NewStepReport(origin, m.get(), in.step, /*rank_scope=*/true);
  r->set_nonfinite_count(static_cast<uint64_t>(in.grad_nonfinite));
  r->set_element_count(static_cast<uint64_t>(in.grad_elements));
  r->mutable_metrics()->set_nan_frac(in.grad_elements > 0
                                         ? static_cast<double>(in.grad_nonfinite) /
                                               static_cast<double>(in.grad_elements)
                                         : 0.0);
  int kept = 0;
  for (const core::TensorStat& t : in.tensors) {
    if (t.nonfinite <= 0 || kept++ >= 64) continue;
    auto* ts = r->add_tensors();
    ts->set_name(std::string(t.name));
    ts->set_sum_squares(t.sum_squares);
    ts->set_nonfinite_count(static_cast<uint64_t>(t.nonfinite));
    ts->set_element_count(static_cast<uint64_t>(t.elements));
  }
  return m;
}

}  // namespace trainwatch::agent::internal
