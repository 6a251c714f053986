#include "step_message.h"

#include "trainwatch/wire/event.h"
#include "trainwatch/wire/step_report.h"
#include "trainwatch/wire/time.h"

namespace trainwatch::agent::internal {

namespace {

// Enough to name the culprits without making a failure report large.
constexpr size_t kMaxReportedTensors = 64;

// The report's address: who sends it (the step is the record's).
v1::StepReport* NewStepReport(const Origin& origin, v1::AgentMessage* m, bool rank_scope) {
  v1::StepReport* r = m->mutable_step_report();
  r->set_run_id(origin.run_id);
  r->set_rank(origin.rank);
  r->set_world_size(origin.world_size);
  r->set_scope(rank_scope ? v1::REPORT_SCOPE_RANK : v1::REPORT_SCOPE_GLOBAL);
  return r;
}

}  // namespace

v1::AgentMessage StepMessage(const Origin& origin, const Slot& s) {
  v1::AgentMessage m;
  v1::StepReport* r = NewStepReport(origin, &m, s.rank_scope);
  wire::ReportedStep rep;
  static_cast<core::Step&>(rep) = s;
  rep.shards = !s.gathered_shards.empty() ? absl::MakeConstSpan(s.gathered_shards)
                                          : absl::MakeConstSpan(s.shards, s.shard_count);
  rep.shard_names = s.shard_names;
  rep.update_skipped = s.update_skipped;
  wire::StepToProto(rep, r);
  if (s.decided) wire::VerdictToProto(s.verdict, r);
  if (s.verdict_event.has_value()) wire::EventToProto(*s.verdict_event, r->mutable_verdict_reason());
  r->set_rules_hash(s.rules_hash);
  wire::SetTime(s.time_ms, r->mutable_time());
  return m;
}

std::unique_ptr<v1::AgentMessage> TensorReportMessage(const Origin& origin, const StepInput& in,
                                                      int64_t nonfinite, int64_t elements) {
  auto m = std::make_unique<v1::AgentMessage>();
  wire::ReportedStep rep;
  rep.step = in.step;
  rep.nonfinite = static_cast<uint64_t>(nonfinite);
  rep.elements = static_cast<uint64_t>(elements);
  rep.Set(core::Signal::kNanFrac, elements > 0 ? static_cast<double>(nonfinite) /
                                                     static_cast<double>(elements)
                                               : 0.0);
  for (const core::TensorStat& t : in.tensors) {
    if (t.nonfinite <= 0) continue;
    if (rep.tensors.size() == kMaxReportedTensors) break;
    rep.tensors.push_back(t);
  }
  wire::StepToProto(rep, NewStepReport(origin, m.get(), /*rank_scope=*/true));
  return m;
}

}  // namespace trainwatch::agent::internal
