#include "trainwatch/wire/step_report.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "trainwatch/wire/enums.h"

namespace trainwatch::wire {

namespace v1 = trainwatch::v1;
using core::Signal;

void MetricsToProto(const core::StepValues& v, double loss_ema_ratio, v1::Metrics* m) {
  if (v.Has(Signal::kLoss)) m->set_loss(v.Get(Signal::kLoss));
  if (v.Has(Signal::kGradNorm)) m->set_grad_norm(v.Get(Signal::kGradNorm));
  if (v.Has(Signal::kLogZ)) m->set_log_z(v.Get(Signal::kLogZ));
  if (v.Has(Signal::kNanFrac)) m->set_nan_frac(v.Get(Signal::kNanFrac));
  if (!std::isnan(loss_ema_ratio)) m->set_loss_ema_ratio(loss_ema_ratio);
}

double MetricsFromProto(const v1::Metrics& m, core::StepValues* v) {
  if (m.has_loss()) v->Set(Signal::kLoss, m.loss());
  if (m.has_grad_norm()) v->Set(Signal::kGradNorm, m.grad_norm());
  if (m.has_log_z()) v->Set(Signal::kLogZ, m.log_z());
  if (m.has_nan_frac()) v->Set(Signal::kNanFrac, m.nan_frac());
  return m.has_loss_ema_ratio() ? m.loss_ema_ratio() : std::nan("");
}

void StepToProto(const ReportedStep& s, v1::StepReport* r) {
  r->set_step(s.step);
  MetricsToProto(s, s.loss_ema_ratio, r->mutable_metrics());
  if (s.Has(Signal::kLearningRate)) r->set_learning_rate(s.Get(Signal::kLearningRate));
  if (s.Has(Signal::kZLossAlpha)) r->set_z_loss_alpha(s.Get(Signal::kZLossAlpha));
  if (s.Has(Signal::kActivationMax)) r->set_activation_max(s.Get(Signal::kActivationMax));
  if (s.Has(Signal::kAttentionLogitP99)) {
    r->add_attention_logit_p99(s.Get(Signal::kAttentionLogitP99));
  }
  r->set_nonfinite_count(s.nonfinite);
  r->set_element_count(s.elements);
  for (uint64_t id : s.shards) r->add_shard_ids(id);
  for (const std::string& name : s.shard_names) r->add_shard_names(name);
  for (const core::TensorStat& t : s.tensors) {
    v1::TensorStats* ts = r->add_tensors();
    ts->set_name(std::string(t.name));
    ts->set_sum_squares(t.sum_squares);
    ts->set_nonfinite_count(static_cast<uint64_t>(t.nonfinite));
    ts->set_element_count(static_cast<uint64_t>(t.elements));
  }
  r->set_update_skipped(s.update_skipped);
  if (s.HasLossScale()) {
    r->set_loss_scale(s.loss_scale());
    r->set_loss_scale_overflow(s.loss_scale_overflow());
  }
}

ReportedStep StepFromProto(const v1::StepReport& r) {
  ReportedStep s;
  s.step = r.step();
  s.loss_ema_ratio = MetricsFromProto(r.metrics(), &s);
  if (r.has_learning_rate()) s.Set(Signal::kLearningRate, r.learning_rate());
  if (r.has_z_loss_alpha()) s.Set(Signal::kZLossAlpha, r.z_loss_alpha());
  if (r.has_activation_max()) s.Set(Signal::kActivationMax, r.activation_max());
  for (double v : r.attention_logit_p99()) {
    const bool first = !s.Has(Signal::kAttentionLogitP99);
    const double prev = s.Get(Signal::kAttentionLogitP99);
    s.Set(Signal::kAttentionLogitP99, first || !std::isfinite(v) ? v : std::max(prev, v));
  }
  s.nonfinite = r.nonfinite_count();
  s.elements = r.element_count();
  s.shards = absl::MakeConstSpan(r.shard_ids().data(), static_cast<size_t>(r.shard_ids_size()));
  s.shard_names.assign(r.shard_names().begin(), r.shard_names().end());
  s.tensors.reserve(static_cast<size_t>(r.tensors_size()));
  for (const v1::TensorStats& t : r.tensors()) {
    s.tensors.push_back({t.name(), t.sum_squares(), static_cast<int64_t>(t.nonfinite_count()),
                         static_cast<int64_t>(t.element_count())});
  }
  s.update_skipped = r.update_skipped();
  // An overflow flag without a scale is not fp16 loss scaling: it excuses
  // nothing (numerical_rule.cc).
  if (r.has_loss_scale()) s.SetLossScale(r.loss_scale(), r.loss_scale_overflow());
  return s;
}

void VerdictToProto(const core::Verdict& v, v1::StepReport* r) {
  r->set_verdict(DecisionToProto(v.decision));
  if (v.decision == core::Decision::kContinue) return;
  r->set_skip_rule(RuleToProto(v.rule));
  r->set_skip_tier(TierToProto(v.tier));
}

core::Verdict VerdictFromProto(const v1::StepReport& r) {
  core::Verdict v;
  v.decision = DecisionFromProto(r.verdict());
  if (v.decision == core::Decision::kContinue) return v;
  v.rule = RuleFromProto(r.skip_rule()).value_or(v.rule);
  v.tier = std::max(TierFromProto(r.skip_tier()), 0);
  return v;
}

}  // namespace trainwatch::wire
