// An observed agent (AgentConfig::observed, what twctl follow runs): the
// hello says observed, StepObserved() streams the record as given with nothing
// skipped, and the per-step path of a trainer is refused on it.

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <memory>

#include "fake_trainwatchd.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"

namespace trainwatch::agent {
namespace {

using core::Signal;
using testing::FreePort;
using testing::WaitUntil;

TEST_CASE("observed: the hello says observed and records go as given with nothing skipped",
          "[agent][observed]") {
  const int port = FreePort();
  FakeServer service;
  Running server(&service, port);
  AgentConfig cfg;
  cfg.server_address = "127.0.0.1:" + std::to_string(port);
  cfg.run_id = "run-o";
  cfg.observed = true;
  auto agent = Agent::Create(cfg, std::make_unique<SingleProcessReducer>());
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
  core::StepRecord back;
  back.step = 40;
  CHECK(absl::IsInvalidArgument((*agent)->StepObserved(back)));
  StepInput in;
  in.step = 50;
  CHECK(absl::IsFailedPrecondition((*agent)->Step(in).status()));
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
