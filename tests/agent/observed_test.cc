// An observed agent (AgentConfig::observed: what twctl follow runs, and
// `trainwatch run --observe-only`): the hello says observed, StepObserved()
// streams the record as given with nothing skipped, and Step() judges a
// trainer's step whose skip goes out as recommended, never as done.

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>

#include "fake_trainwatchd.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"

namespace trainwatch::agent {
namespace {

using core::Signal;
using testing::FreePort;
using testing::WaitUntil;

// An observed agent of `run` streaming to the fake server on `port`.
AgentConfig ObservedConfig(int port, const std::string& run) {
  AgentConfig cfg;
  cfg.server_address = "127.0.0.1:" + std::to_string(port);
  cfg.run_id = run;
  cfg.observed = true;
  return cfg;
}

TEST_CASE("observed: the hello says observed and records go as given with nothing skipped",
          "[agent][observed]") {
  const int port = FreePort();
  FakeServer service;
  Running server(&service, port);
  auto agent = Agent::Create(ObservedConfig(port, "run-o"),
                             std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  for (int64_t s = 0; s < 5; ++s) {
    core::StepRecord rec;
    rec.step = s * 10;
    rec.Set(Signal::kLoss, s == 4 ? std::nan("") : 2.0 + 0.1 * s);  // a NaN loss halts a trainer
    rec.Set(Signal::kGradNorm, 0.25 * s);
    rec.Set(Signal::kNanFrac, 0.125);
    REQUIRE((*agent)->StepObserved(rec).ok());
  }
  REQUIRE(
      WaitUntil([&] { return service.global_report(40).has_value(); }, std::chrono::seconds(20)));
  REQUIRE(!service.hellos().empty());
  CHECK(service.hellos().front().observed());
  const v1::StepReport r = *service.global_report(30);
  CHECK(r.metrics().loss() == 2.0 + 0.1 * 3);
  CHECK(r.metrics().grad_norm() == 0.25 * 3);
  CHECK(r.metrics().nan_frac() == 0.125);
  CHECK(!service.global_report(40)->update_skipped());
  // No agent decided these steps, the NaN's included: no verdict to compare,
  // and no local engine derived anything (the server judges).
  CHECK(r.verdict() == v1::VERDICT_UNSPECIFIED);
  CHECK_FALSE(r.metrics().has_loss_ema_ratio());
  CHECK(service.global_report(40)->verdict() == v1::VERDICT_UNSPECIFIED);
  core::StepRecord back;
  back.step = 40;
  CHECK(absl::IsInvalidArgument((*agent)->StepObserved(back)));
  (*agent)->Close(2000);
}

TEST_CASE("observed: Step() judges and its skip is reported as not applied",
          "[agent][observed]") {
  const int port = FreePort();
  FakeServer service;
  Running server(&service, port);
  AgentConfig cfg = ObservedConfig(port, "run-oo");
  core::RuleConfig rules;
  rules.warmup_steps = 20;
  rules.warmup_min_records = 10;
  rules.warmup_min_grad_samples = 10;
  cfg.rules = rules;
  auto agent = Agent::Create(cfg, std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  Verdict skip;
  for (int64_t s = 0; s <= 40; ++s) {
    StepInput in;
    in.step = s;
    in.loss = 2.5 + 0.01 * (s % 3);
    in.grad_sum_squares = 1.0 + 0.05 * (s % 4);
    in.grad_elements = 1000;
    if (s == 40) {  // a bad batch
      in.loss = 6.0;
      in.grad_sum_squares = 160.0;
    }
    absl::StatusOr<Verdict> v = (*agent)->Step(in);
    REQUIRE(v.ok());
    if (s == 40) skip = *v;
  }
  CHECK(skip.decision == Decision::kSkipUpdate);
  REQUIRE(
      WaitUntil([&] { return service.global_report(40).has_value(); }, std::chrono::seconds(20)));
  CHECK(service.hellos().front().observed());
  CHECK(service.global_report(40)->verdict() == v1::VERDICT_SKIP);  // what the rules say
  CHECK_FALSE(service.global_report(40)->update_skipped());          // and nothing was done
  (*agent)->Close(2000);
}

TEST_CASE("observed: StepObserved on a trainer agent is refused", "[agent][observed]") {
  AgentConfig cfg;  // no server: local only
  auto agent = Agent::Create(cfg, std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  core::StepRecord rec;
  CHECK(absl::IsFailedPrecondition((*agent)->StepObserved(rec)));
}

}  // namespace
}  // namespace trainwatch::agent
