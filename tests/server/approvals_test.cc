// From incident to rollback, in process: a tier 2 page, a dry run, the
// approval (recorded with who and why), the command to every rank, its
// re-delivery after a reconnect, the acknowledgements, the new attempt, and
// the incident resolving once the run passes the old point; the refusals.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "server_fixture.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/cli/operator_commands.h"
#include "daemon/server.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using testing::Checkpoint;
using testing::Hello;
using testing::Step;
using testing::TempDir;
using testing::TestAgent;
using testing::Running;
using testing::StartServer;

v1::AgentMessage Ack(const std::string& run, int32_t rank, const std::string& id) {
  v1::AgentMessage m;
  auto* a = m.mutable_command_ack();
  a->set_run_id(run);
  a->set_rank(rank);
  a->set_command_id(id);
  a->set_status(v1::ACK_STATUS_APPLIED);
  a->set_resumed_step(3000);
  return m;
}

double Loss(int64_t s) { return 2.5 + 0.01 * std::sin(static_cast<double>(s) * 1.7); }

class Operator {
 public:
  explicit Operator(const std::shared_ptr<grpc::Channel>& ch)
      : stub_(v1::OperatorService::NewStub(ch)) {}
  grpc::Status Approve(const std::string& id, const std::string& key, bool dry_run,
                       v1::ApproveRollbackResponse* resp) {
    grpc::ClientContext c;
    v1::ApproveRollbackRequest req;
    req.set_incident_id(id);
    req.set_comment("logit drift; roll back with z-loss");
    req.set_idempotency_key(key);
    req.set_dry_run(dry_run);
    return stub_->ApproveRollback(&c, req, resp);
  }
  grpc::Status Reject(const std::string& id, v1::RejectRollbackResponse* resp) {
    grpc::ClientContext c;
    v1::RejectRollbackRequest req;
    req.set_incident_id(id);
    req.set_comment("transient; leave it");
    return stub_->RejectRollback(&c, req, resp);
  }
  v1::Incident Get(const std::string& id) {
    grpc::ClientContext c;
    v1::GetIncidentRequest req;
    req.set_incident_id(id);
    v1::GetIncidentResponse resp;
    REQUIRE(stub_->GetIncident(&c, req, &resp).ok());
    return resp.incident();
  }
  std::vector<v1::Incident> List(const std::string& run) {
    grpc::ClientContext c;
    v1::ListIncidentsRequest req;
    req.set_run_id(run);
    v1::ListIncidentsResponse resp;
    REQUIRE(stub_->ListIncidents(&c, req, &resp).ok());
    return {resp.incidents().begin(), resp.incidents().end()};
  }
  v1::ListQuarantinedShardsResponse Shards(const std::string& run) {
    grpc::ClientContext c;
    v1::ListQuarantinedShardsRequest req;
    req.set_run_id(run);
    v1::ListQuarantinedShardsResponse resp;
    REQUIRE(stub_->ListQuarantinedShards(&c, req, &resp).ok());
    return resp;
  }

 private:
  std::unique_ptr<v1::OperatorService::Stub> stub_;
};

TEST_CASE("rollback: approve - command every rank - acknowledge - resolve past the old point",
          "[server][rollback]") {
  TempDir dir;
  Running tw = StartServer(dir.File("tw.db"));
  auto ch = tw.channel;
  const std::string run = "run-rb";
  TestAgent r0(ch), r1(ch);
  r0.Send(Hello(run, 0, 2));
  r1.Send(Hello(run, 1, 2));
  // A healthy run with checkpoints, then a loss that does not come back.
  for (int64_t s = 0; s < 3700; ++s) {
    const double loss = s >= 3000 ? Loss(s) + 0.3 : Loss(s);
    r0.Send(Step(run, 0, 2, s, loss, 1.0));
    if (s > 0 && s % 1000 == 0) r0.Send(Checkpoint(run, s));
  }
  REQUIRE(r0.WaitDurable(0, 3699));
  // Both ranks' heartbeats: 2 s steps. A step a second later carries them
  // through the liveness check into the run's view.
  for (int rank = 0; rank < 2; ++rank) {
    v1::AgentMessage hb;
    hb.mutable_heartbeat()->set_run_id(run);
    hb.mutable_heartbeat()->set_rank(rank);
    hb.mutable_heartbeat()->set_finished_step(3699);
    hb.mutable_heartbeat()->set_step_ms_median(2000);
    hb.mutable_heartbeat()->set_window_steps(32);
    (rank == 0 ? r0 : r1).Send(hb);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  r0.Send(Step(run, 0, 2, 3700, Loss(3700) + 0.3, 1.0));
  REQUIRE(r0.WaitDurable(0, 3700));
  Operator op(ch);
  std::vector<v1::Incident> incidents = op.List(run);
  const v1::Incident* page = nullptr;
  for (const auto& i : incidents) {
    if (i.tier() == v1::TIER_LOGIT_DRIFT) page = &i;
  }
  REQUIRE(page != nullptr);
  const std::string id = page->incident_id();
  CHECK(page->state() == v1::INCIDENT_STATE_AWAITING_DECISION);
  v1::Incident full = op.Get(id);
  CHECK(full.summary().recommended_checkpoint().step() == 3000);
  CHECK(full.summary().approve_command().rfind("twctl rollback approve " + id + " --to-step 3000", 0) ==
        0);

  // A dry run says what would happen and records nothing.
  v1::ApproveRollbackResponse dry;
  REQUIRE(op.Approve(id, "", true, &dry).ok());
  CHECK(dry.decision().dry_run());
  CHECK(dry.decision().plan().target_step() == 3000);
  CHECK(op.Get(id).state() == v1::INCIDENT_STATE_AWAITING_DECISION);

  v1::ApproveRollbackResponse approved;
  REQUIRE(op.Approve(id, "key-1", false, &approved).ok());
  CHECK(approved.incident_state() == v1::INCIDENT_STATE_ROLLING_BACK);
  CHECK(approved.decision().actor().id() == "anonymous");
  CHECK(approved.decision().comment() == "logit drift; roll back with z-loss");
  const v1::RollbackPlan plan = approved.decision().plan();
  CHECK(plan.checkpoint_uri() == "ckpt://run-rb/3000");
  // Its cost: steps 3001..3700 trained again, 2 s each, on 2 ranks.
  CHECK(plan.cost().steps() == 700);
  CHECK(plan.cost().step_seconds() == 2.0);
  CHECK(plan.cost().ranks() == 2);
  CHECK(plan.cost().gpu_hours() == Approx(700 * 2.0 * 2 / 3600));
  REQUIRE(plan.quarantine().ranges_size() == 1);

  // The same request again (same key): the same decision, replayed.
  v1::ApproveRollbackResponse again;
  REQUIRE(op.Approve(id, "key-1", false, &again).ok());
  CHECK(again.replayed());
  CHECK(again.decision().decision_id() == approved.decision().decision_id());
  // Another operator's approval, or a rejection now: refused, with the reason.
  v1::ApproveRollbackResponse second;
  const grpc::Status s2 = op.Approve(id, "key-2", false, &second);
  CHECK(s2.error_code() == grpc::FAILED_PRECONDITION);
  CHECK(s2.error_message().find("already rolling back") != std::string::npos);
  v1::RejectRollbackResponse rej;
  CHECK(op.Reject(id, &rej).error_code() == grpc::FAILED_PRECONDITION);

  // Every rank gets the command.
  v1::Command c0, c1;
  REQUIRE(r0.WaitCommand(&c0));
  REQUIRE(r1.WaitCommand(&c1));
  CHECK(c0.command_id() == approved.decision().command_id());
  CHECK(c1.rollback().target_step() == 3000);
  CHECK(c1.rollback().settings_size() == 0);  // the loss led, not log_z: no z-loss change
  r0.Send(Ack(run, 0, c0.command_id()));
  // Rank 1 drops its stream before acknowledging, reconnects, and gets the
  // command again.
  CHECK(r1.Close().ok());
  TestAgent r1b(ch);
  r1b.Send(Hello(run, 1, 2));
  v1::Command again1;
  REQUIRE(r1b.WaitCommand(&again1));
  CHECK(again1.command_id() == c0.command_id());
  CHECK(r1b.quarantine().shards().ranges_size() == 1);
  CHECK(op.Get(id).state() == v1::INCIDENT_STATE_ROLLING_BACK);
  r1b.Send(Ack(run, 1, again1.command_id()));
  // The run resumes after the checkpoint and passes the old detection step.
  for (int64_t s = 3001; s < 3800; ++s) r0.Send(Step(run, 0, 2, s, Loss(s), 1.0));
  REQUIRE(r0.WaitDurable(0, 3799));
  tw.server->ingestor()->Flush();
  const v1::Incident done = op.Get(id);
  CHECK(done.state() == v1::INCIDENT_STATE_RESOLVED);
  REQUIRE(done.decisions_size() == 1);
  const auto shards = op.Shards(run);
  REQUIRE(shards.shards().ranges_size() == 1);
  CHECK(shards.entries(0).incident_id() == id);
  // After a resolution nothing more can be decided.
  v1::ApproveRollbackResponse late;
  CHECK(op.Approve(id, "key-3", false, &late).error_code() == grpc::FAILED_PRECONDITION);
  const auto snap = tw.server->ingestor()->views().All();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].row.attempt == 1);
  CHECK(snap[0].row.last_step == 3799);
  // The history of each attempt: the current one by default, the abandoned
  // one on request (it ends where the rollback cut it), nothing beyond.
  auto stub = v1::OperatorService::NewStub(ch);
  auto status = [&](std::optional<int64_t> attempt, v1::GetRunStatusResponse* resp) {
    grpc::ClientContext c;
    v1::GetRunStatusRequest req;
    req.set_run_id(run);
    req.set_window_steps(100000);
    if (attempt) req.set_attempt(*attempt);
    return stub->GetRunStatus(&c, req, resp);
  };
  v1::GetRunStatusResponse now, before, beyond;
  REQUIRE(status(std::nullopt, &now).ok());
  CHECK(now.run().attempt() == 1);
  CHECK(now.recent(now.recent_size() - 1).step() == 3799);
  CHECK(now.recent(0).step() == 0);  // the steps up to the checkpoint, carried over
  REQUIRE(status(0, &before).ok());
  CHECK(before.recent(before.recent_size() - 1).step() >= 3699);
  CHECK(status(2, &beyond).error_code() == grpc::INVALID_ARGUMENT);
  // The report draws the abandoned attempt under the current one.
  std::string out, err;
  const std::string report = dir.File("report.html");
  REQUIRE(cli::OperatorCommand("report", {run, "--out", report, "--server",
                                          tw.address()},
                               nullptr, &out, &err) == 0);
  const std::string html = testing::ReadFile(report);
  CHECK(html.find("class=\"abandoned\"") != std::string::npos);
  CHECK(html.find("attempt 1") != std::string::npos);
  CHECK(html.find(id) != std::string::npos);
  CHECK(r0.Close().ok());
  CHECK(r1b.Close().ok());
}

TEST_CASE("rollback: a rejected incident cannot be approved - tier 1 needs no rollback",
          "[server][rollback]") {
  TempDir dir;
  Running tw = StartServer(dir.File("tw.db"));
  auto ch = tw.channel;
  const std::string run = "run-rj";
  TestAgent a(ch);
  a.Send(Hello(run, 0, 1));
  for (int64_t s = 0; s < 3700; ++s) {
    const bool bad = s == 2000;
    a.Send(Step(run, 0, 1, s, bad ? 3.5 : (s >= 3000 ? Loss(s) + 0.3 : Loss(s)), bad ? 9.0 : 1.0));
    if (s > 0 && s % 1000 == 0) a.Send(Checkpoint(run, s));
  }
  REQUIRE(a.WaitDurable(0, 3699));
  Operator op(ch);
  std::string tier1, tier2;
  for (const auto& i : op.List(run)) {
    if (i.tier() == v1::TIER_DATA_ANOMALY) tier1 = i.incident_id();
    if (i.tier() == v1::TIER_LOGIT_DRIFT) tier2 = i.incident_id();
  }
  REQUIRE_FALSE(tier1.empty());
  REQUIRE_FALSE(tier2.empty());
  // The skip the agents took by themselves is recorded, the rule as actor.
  const v1::Incident t1_full = op.Get(tier1);
  REQUIRE(t1_full.decisions_size() == 1);
  CHECK(t1_full.decisions(0).actor().kind() == v1::ACTOR_KIND_SERVER);
  CHECK(t1_full.decisions(0).actor().id() == "rule:data_anomaly");
  v1::ApproveRollbackResponse r;
  const grpc::Status t1 = op.Approve(tier1, "", false, &r);
  CHECK(t1.error_code() == grpc::FAILED_PRECONDITION);
  CHECK(t1.error_message().find("need no rollback") != std::string::npos);
  v1::RejectRollbackResponse rej;
  REQUIRE(op.Reject(tier2, &rej).ok());
  CHECK(rej.incident_state() == v1::INCIDENT_STATE_DISMISSED);
  const grpc::Status after = op.Approve(tier2, "", false, &r);
  CHECK(after.error_code() == grpc::FAILED_PRECONDITION);
  CHECK(after.error_message().find("was rejected") != std::string::npos);
  CHECK(after.error_message().find("transient; leave it") != std::string::npos);
  v1::ApproveRollbackResponse missing;
  CHECK(op.Approve("I-999", "", false, &missing).error_code() == grpc::NOT_FOUND);
  // A NaN with per-tensor counts: the halt names the source tensor.
  v1::AgentMessage nan = Step(run, 0, 1, 3700, 2.5, 1.0);
  nan.mutable_step_report()->mutable_metrics()->set_nan_frac(1e-6);
  auto* t = nan.mutable_step_report()->add_tensors();
  t->set_name("layers.11.mlp.fc2.weight");
  t->set_nonfinite_count(42);
  t->set_element_count(1 << 20);
  a.Send(nan);
  // ...and the rank's own report (what the agent sends when it saw a NaN).
  v1::AgentMessage own = nan;
  own.mutable_step_report()->set_scope(v1::REPORT_SCOPE_RANK);
  own.mutable_step_report()->set_nonfinite_count(42);
  own.mutable_step_report()->set_element_count(1 << 20);
  a.Send(own);
  REQUIRE(a.WaitDurable(0, 3700));
  std::string t3;
  for (const auto& i : op.List(run)) {
    if (i.tier() == v1::TIER_NUMERICAL_FAILURE) t3 = i.incident_id();
  }
  REQUIRE_FALSE(t3.empty());
  // The rank's own report travels after the global record on the stream, so
  // the global record's ack does not cover it yet: wait until it is stored.
  v1::Incident t3_full;
  REQUIRE(testing::WaitUntil(
      [&] {
        t3_full = op.Get(t3);
        return t3_full.summary().tensor_breakdown_size() > 0;
      },
      std::chrono::seconds(10)));
  CHECK(t3_full.summary().explanation().find("layers.11.mlp.fc2.weight (42 of 1048576") !=
        std::string::npos);
  REQUIRE(t3_full.decisions_size() == 1);
  CHECK(t3_full.decisions(0).actor().id() == "rule:nonfinite_gradients");
  REQUIRE(t3_full.summary().tensor_breakdown_size() == 1);
  CHECK(t3_full.summary().tensor_breakdown(0).name() == "layers.11.mlp.fc2.weight");
  CHECK(t3_full.summary().tensor_breakdown(0).nonfinite_count() == 42);
  REQUIRE(t3_full.summary().nonfinite_ranks_size() == 1);
  CHECK(t3_full.summary().nonfinite_ranks(0) == 0);
  CHECK(a.Close().ok());
}

}  // namespace
}  // namespace trainwatch::server
