#include "stream_messages.h"

#include <cmath>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainwatch::bench {
namespace {

void SetNow(google::protobuf::Timestamp* ts) {
  const int64_t ns = absl::ToUnixNanos(absl::Now());
  ts->set_seconds(ns / 1'000'000'000);
  ts->set_nanos(static_cast<int32_t>(ns % 1'000'000'000));
}

}  // namespace

void FillHello(const StreamPlan& plan, trainwatch::v1::AgentMessage* out) {
  out->Clear();
  auto* hello = out->mutable_hello();
  hello->set_run_id(plan.run_id);
  hello->set_rank(plan.rank);
  hello->set_world_size(plan.world_size);
  hello->set_agent_version(kLoadAgentVersion);
  hello->set_host_name("127.0.0.1");
  hello->set_next_step(1);
  SetNow(hello->mutable_process_start_time());
}

void FillHeartbeat(const StreamPlan& plan, int64_t last_sent, int64_t acked,
                   uint32_t queue_capacity, trainwatch::v1::AgentMessage* out) {
  out->Clear();
  auto* hb = out->mutable_heartbeat();
  hb->set_run_id(plan.run_id);
  hb->set_rank(plan.rank);
  SetNow(hb->mutable_time());
  hb->set_agent_version(kLoadAgentVersion);
  hb->set_queue_depth(static_cast<uint32_t>(last_sent - acked));
  hb->set_queue_capacity(queue_capacity);
  hb->set_last_step(last_sent);
}

void FillStepReport(const StreamPlan& plan, int64_t step, trainwatch::v1::AgentMessage* out) {
  out->Clear();
  auto* r = out->mutable_step_report();
  r->set_run_id(plan.run_id);
  r->set_rank(plan.scope == trainwatch::v1::REPORT_SCOPE_RANK ? plan.rank : 0);
  r->set_world_size(plan.world_size);
  r->set_step(step);
  r->set_scope(plan.scope);
  const double x = static_cast<double>(step);
  const double phase = 0.37 * (plan.run_index + plan.rank);
  auto* m = r->mutable_metrics();
  m->set_loss(2.5 + std::exp(-x / 20000.0) + 0.01 * std::sin(0.37 * x + phase));
  m->set_grad_norm(1.0 + 0.05 * std::sin(0.11 * x + phase));
  m->set_log_z(4.0 + 0.02 * std::sin(0.05 * x + phase));
  m->set_nan_frac(0.0);
  r->set_nonfinite_count(0);
  r->set_element_count(1'000'000'000);
  r->add_shard_ids(static_cast<uint64_t>(2 * step));
  r->add_shard_ids(static_cast<uint64_t>(2 * step + 1));
  r->set_verdict(trainwatch::v1::VERDICT_CONTINUE);
  SetNow(r->mutable_time());
}

}  // namespace trainwatch::bench
