// A tier 3 halt, then a job that comes back: undecided (the answer to its
// hello names the incident, and the incident records it), or after an
// approval that changes settings (per-module precision, an lr scale), which
// survives a trainwatchd restart and reaches the restarted job's agent at
// hello, before its first step (Agent::WaitForServer). The settings'
// validation on the server (CheckApprovalRequest).

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "daemon/server.h"
#include "server_fixture.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using testing::Checkpoint;
using testing::Hello;
using testing::HelloAnswer;
using testing::Running;
using testing::StartServer;
using testing::Step;
using testing::TempDir;
using testing::TestAgent;

double Loss(int64_t s) { return 2.5 + 0.01 * std::sin(static_cast<double>(s) * 1.7); }

grpc::Status Approve(const std::shared_ptr<grpc::Channel>& ch, const std::string& id,
                     const std::vector<v1::SettingChange>& settings,
                     v1::ApproveRollbackResponse* resp) {
  auto stub = v1::OperatorService::NewStub(ch);
  grpc::ClientContext c;
  v1::ApproveRollbackRequest req;
  req.set_incident_id(id);
  req.set_to_step(1000);
  req.set_comment("bf16 cancels in the norm: fp32 and a lower learning rate");
  for (const auto& s : settings) *req.add_settings() = s;
  return stub->ApproveRollback(&c, req, resp);
}

v1::Incident Get(const std::shared_ptr<grpc::Channel>& ch, const std::string& id) {
  auto stub = v1::OperatorService::NewStub(ch);
  grpc::ClientContext c;
  v1::GetIncidentRequest req;
  req.set_incident_id(id);
  v1::GetIncidentResponse resp;
  REQUIRE(stub->GetIncident(&c, req, &resp).ok());
  return resp.incident();
}

v1::SettingChange Precision(const std::string& module, v1::Precision p) {
  v1::SettingChange s;
  s.mutable_layer_precision()->set_layer(module);
  s.mutable_layer_precision()->set_precision(p);
  return s;
}

v1::SettingChange LrScale(double x) {
  v1::SettingChange s;
  s.set_lr_scale(x);
  return s;
}

TEST_CASE("reconfigure: an undecided restart is named at hello and recorded - an approval's "
          "settings survive a server restart to the job's hello",
          "[server][rollback][reconfigure]") {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  Running tw = StartServer(db);
  const std::string run = "run-reconf";
  {
    TestAgent a(tw.channel);
    a.Send(Hello(run, 0, 1));
    for (int64_t s = 0; s < 1150; ++s) {
      a.Send(Step(run, 0, 1, s, Loss(s), 1.0));
      if (s > 0 && s % 500 == 0) a.Send(Checkpoint(run, s));
    }
    v1::AgentMessage nan = Step(run, 0, 1, 1150, 2.5, 1.0);
    nan.mutable_step_report()->mutable_metrics()->set_nan_frac(1e-6);
    a.Send(nan);
    REQUIRE(a.WaitDurable(0, 1150));
    CHECK(a.Close().ok());
  }
  tw.server->ingestor()->Flush();
  std::string t3;
  {
    auto stub = v1::OperatorService::NewStub(tw.channel);
    grpc::ClientContext c;
    v1::ListIncidentsRequest req;
    req.set_run_id(run);
    v1::ListIncidentsResponse resp;
    REQUIRE(stub->ListIncidents(&c, req, &resp).ok());
    for (const auto& i : resp.incidents()) {
      if (i.tier() == v1::TIER_NUMERICAL_FAILURE) t3 = i.incident_id();
    }
  }
  REQUIRE_FALSE(t3.empty());

  // The job restarts with no decision: the answer names the incident, and
  // the incident records that the job came back undecided.
  const v1::DurabilityAck undecided = HelloAnswer(tw.channel, run);
  REQUIRE(undecided.undecided_incidents_size() == 1);
  CHECK(undecided.undecided_incidents(0) == t3);
  CHECK(undecided.pending_command_id().empty());
  REQUIRE(testing::WaitUntil(
      [&] {
        const v1::Incident inc = Get(tw.channel, t3);
        for (const auto& d : inc.decisions()) {
          if (d.kind() == v1::DECISION_KIND_RESTARTED_UNDECIDED &&
              d.comment().find(t3 + " awaited a decision") != std::string::npos) {
            return true;
          }
        }
        return false;
      },
      std::chrono::seconds(10)));

  // With incarnation ids the record is exact: a new launch is recorded as
  // a restart, a reconnect of it is told again and not recorded.
  auto undecided_notes = [&] {
    tw.server->ingestor()->Flush();
    std::vector<std::string> notes;
    const v1::Incident inc = Get(tw.channel, t3);  // outlives the loop
    for (const auto& d : inc.decisions()) {
      if (d.kind() == v1::DECISION_KIND_RESTARTED_UNDECIDED) notes.push_back(d.comment());
    }
    return notes;
  };
  CHECK(HelloAnswer(tw.channel, run, "job-2").undecided_incidents_size() == 1);
  REQUIRE(testing::WaitUntil([&] { return undecided_notes().size() == 2; },
                             std::chrono::seconds(10)));
  CHECK(undecided_notes()[1].find("the job restarted (incarnation job-2;") != std::string::npos);
  CHECK(HelloAnswer(tw.channel, run, "job-2").undecided_incidents_size() == 1);
  CHECK(testing::HoldsFor([&] { return undecided_notes().size() == 2; },
                          std::chrono::milliseconds(500)));

  // Settings the server refuses, each naming what is wrong.
  struct Bad {
    std::vector<v1::SettingChange> settings;
    const char* message;
  };
  for (const Bad& bad : std::vector<Bad>{
           {{LrScale(0)}, "lr_scale must be a finite number > 0"},
           {{LrScale(std::nan(""))}, "lr_scale must be a finite number > 0"},
           {{Precision("norm", v1::PRECISION_FP8)}, "needs fp32, bf16 or fp16, not PRECISION_FP8"},
           {{Precision("", v1::PRECISION_FP32)}, "the module name is empty"},
           {{Precision("norm", v1::PRECISION_FP32), Precision("norm", v1::PRECISION_BF16)},
            "module 'norm' is given twice"}}) {
    v1::ApproveRollbackResponse resp;
    const grpc::Status st = Approve(tw.channel, t3, bad.settings, &resp);
    INFO(st.error_message());
    CHECK(st.error_code() == grpc::INVALID_ARGUMENT);
    CHECK(st.error_message().find(bad.message) != std::string::npos);
  }

  v1::ApproveRollbackResponse approved;
  const grpc::Status ok = Approve(
      tw.channel, t3, {Precision("blocks.0.norm", v1::PRECISION_FP32), LrScale(0.5)}, &approved);
  INFO(ok.error_message());
  REQUIRE(ok.ok());
  const v1::RollbackPlan& plan = approved.decision().plan();
  CHECK(plan.target_step() == 1000);
  REQUIRE(plan.settings_size() == 2);
  CHECK(plan.settings(0).layer_precision().layer() == "blocks.0.norm");
  CHECK(plan.settings(1).lr_scale() == 0.5);
  const std::string command_id = approved.decision().command_id();

  // trainwatchd restarts before the job does; the decision is durable.
  tw.server.reset();
  tw = StartServer(db);
  CHECK(Get(tw.channel, t3).state() == v1::INCIDENT_STATE_ROLLING_BACK);
  CHECK(HelloAnswer(tw.channel, run).pending_command_id() == command_id);

  // The restarted job's agent: the command is there before its first step.
  agent::AgentConfig cfg;
  cfg.server_address = tw.address();
  cfg.run_id = run;
  auto a = agent::Agent::Create(cfg, std::make_unique<agent::SingleProcessReducer>());
  REQUIRE(a.ok());
  REQUIRE((*a)->WaitForServer(10'000));
  std::optional<agent::Command> cmd = (*a)->PollCommand();
  REQUIRE(cmd.has_value());
  CHECK(cmd->kind == agent::Command::Kind::kRollback);
  CHECK(cmd->command_id == command_id);
  CHECK(cmd->target_step == 1000);
  CHECK(cmd->precision ==
        std::vector<std::pair<std::string, std::string>>{{"blocks.0.norm", "fp32"}});
  CHECK(cmd->lr_scale == 0.5);
  // Nothing undecided any more: the incident is rolling back.
  CHECK(HelloAnswer(tw.channel, run).undecided_incidents_size() == 0);
  (*a)->Close(1000);
}

TEST_CASE("reconfigure: WaitForServer gives up after its timeout without an answer",
          "[server][reconfigure]") {
  agent::AgentConfig cfg;
  cfg.server_address = "127.0.0.1:" + std::to_string(testing::FreePort());
  cfg.run_id = "run-nobody";
  auto a = agent::Agent::Create(cfg, std::make_unique<agent::SingleProcessReducer>());
  REQUIRE(a.ok());
  const auto start = std::chrono::steady_clock::now();
  CHECK_FALSE((*a)->WaitForServer(300));
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= std::chrono::milliseconds(250));
  CHECK(waited < std::chrono::seconds(5));
  // Without a server address there is nothing to wait for.
  agent::AgentConfig local;
  local.run_id = "run-local";
  auto b = agent::Agent::Create(local, std::make_unique<agent::SingleProcessReducer>());
  REQUIRE(b.ok());
  CHECK_FALSE((*b)->WaitForServer(10'000));
  (*a)->Close(0);
}

}  // namespace
}  // namespace trainwatch::server
