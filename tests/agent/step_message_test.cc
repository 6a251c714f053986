// The agent's step and tensor reports, byte for byte the messages the agent
// sent before they were written through trainwatch::wire.

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "step_message.h"

namespace trainwatch::agent::internal {
namespace {

namespace v1 = trainwatch::v1;
using core::Signal;

const Origin kOrigin{"run-a", 2, 4};

v1::StepReport* Address(v1::AgentMessage* m, int64_t step, v1::ReportScope scope) {
  v1::StepReport* r = m->mutable_step_report();
  r->set_run_id("run-a");
  r->set_rank(2);
  r->set_world_size(4);
  r->set_step(step);
  r->set_scope(scope);
  return r;
}

TEST_CASE("step message: a skipped step's report is the one always sent", "[agent][wire]") {
  Slot s;
  s.step = 77;
  s.Set(Signal::kLoss, 3.5).Set(Signal::kGradNorm, std::nan(""));
  s.Set(Signal::kAttentionLogitP99, 12.0);
  s.loss_ema_ratio = std::nan("");  // not sent
  s.nonfinite = 1;
  s.elements = 1000;
  s.verdict = core::Verdict{core::Decision::kSkipUpdate, 1, core::EventKind::kLossRatioSkip};
  s.update_skipped = true;
  s.shard_count = 2;
  s.shards[0] = (uint64_t{1} << 60) + 5;
  s.shards[1] = 6;
  s.time_ms = 1'700'000'000'123;
  v1::AgentMessage want;
  v1::StepReport* r = Address(&want, 77, v1::REPORT_SCOPE_GLOBAL);
  r->mutable_metrics()->set_loss(3.5);
  r->mutable_metrics()->set_grad_norm(std::nan(""));
  r->add_attention_logit_p99(12.0);
  r->set_nonfinite_count(1);
  r->set_element_count(1000);
  r->add_shard_ids((uint64_t{1} << 60) + 5);
  r->add_shard_ids(6);
  r->set_verdict(v1::VERDICT_SKIP);
  r->set_update_skipped(true);
  r->set_skip_rule(v1::RULE_LOSS_EMA_RATIO_SKIP);
  r->set_skip_tier(v1::TIER_DATA_ANOMALY);
  r->mutable_time()->set_seconds(1'700'000'000);
  r->mutable_time()->set_nanos(123'000'000);
  CHECK(StepMessage(kOrigin, s).SerializeAsString() == want.SerializeAsString());

  // Every rank's gathered shards replace this rank's own.
  s.gathered_shards = {9, 10, 11};
  r->clear_shard_ids();
  for (uint64_t id : s.gathered_shards) r->add_shard_ids(id);
  CHECK(StepMessage(kOrigin, s).SerializeAsString() == want.SerializeAsString());
}

TEST_CASE("step message: a tensor report names at most 64 nonfinite tensors", "[agent][wire]") {
  std::vector<std::string> names;
  std::vector<core::TensorStat> tensors;
  for (int i = 0; i < 70; ++i) names.push_back("t" + std::to_string(i));
  tensors.push_back({"finite", 1.0, 0, 10});
  for (const std::string& n : names) tensors.push_back({n, 2.0, 1, 10});
  StepInput in;
  in.step = 5;
  in.tensors = tensors;
  v1::AgentMessage want;
  v1::StepReport* r = Address(&want, 5, v1::REPORT_SCOPE_RANK);
  r->set_nonfinite_count(70);
  r->set_element_count(710);
  r->mutable_metrics()->set_nan_frac(70.0 / 710.0);
  for (int i = 0; i < 64; ++i) {
    v1::TensorStats* t = r->add_tensors();
    t->set_name(names[static_cast<size_t>(i)]);
    t->set_sum_squares(2.0);
    t->set_nonfinite_count(1);
    t->set_element_count(10);
  }
  CHECK(TensorReportMessage(kOrigin, in, 70, 710)->SerializeAsString() == want.SerializeAsString());
}

}  // namespace
}  // namespace trainwatch::agent::internal
