// The agent's incarnation (issue 12): one id for every rank of a launch,
// agreed through the reducer, a new one for the next launch; the resume
// step in the hello; and a server that ends the stream because a newer
// incarnation took over stops the streaming for good, not in a reconnect
// loop, while the local verdicts go on.

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "fake_trainwatchd.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"

namespace trainwatch::agent {
namespace {

using testing::FreePort;
using testing::HoldsFor;
using testing::WaitUntil;

AgentConfig Config(int port) {
  AgentConfig c;
  c.server_address = "127.0.0.1:" + std::to_string(port);
  c.run_id = "run-t";
  c.reconnect_initial_ms = 20;
  c.reconnect_max_ms = 100;
  return c;
}

StepInput Input(int64_t step) {
  StepInput in;
  in.step = step;
  in.loss = 2.5;
  in.grad_sum_squares = 1.0;
  in.grad_elements = 100;
  return in;
}

// One launch of `ranks` ranks (threads): each creates its agent, runs a
// step and closes. Returns the incarnation ids their hellos carried.
std::set<std::string> Launch(FakeServer& service, int port, int ranks) {
  const size_t before = service.hellos().size();
  InProcessGroup group(ranks);
  std::vector<std::thread> threads;
  std::vector<int> ok(static_cast<size_t>(ranks), 0);  // not vector<bool>: one per thread
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto agent = Agent::Create(Config(port), group.ReducerFor(r));
      if (!agent.ok()) return;
      ok[static_cast<size_t>(r)] = (*agent)->Step(Input(0)).ok() ? 1 : 0;
      // Every rank connects (and says hello) before any closes.
      WaitUntil([&] { return service.hellos().size() >= before + ranks; },
                std::chrono::seconds(20));
      (*agent)->Close(2000);
    });
  }
  for (auto& t : threads) t.join();
  for (int b : ok) REQUIRE(b == 1);
  std::set<std::string> ids;
  const std::vector<v1::Hello> hellos = service.hellos();
  REQUIRE(hellos.size() >= before + ranks);
  for (size_t i = before; i < hellos.size(); ++i) ids.insert(hellos[i].incarnation_id());
  return ids;
}

TEST_CASE("incarnation: every rank of a launch says the same id - the next launch another",
          "[agent][incarnation]") {
  const int port = FreePort();
  FakeServer service;
  Running server(&service, port);
  const std::set<std::string> first = Launch(service, port, 3);
  REQUIRE(first.size() == 1);
  CHECK(first.begin()->size() == 16);  // 64 bits in hex
  const std::set<std::string> second = Launch(service, port, 3);
  REQUIRE(second.size() == 1);
  CHECK(*second.begin() != *first.begin());
  // One process: its own id.
  const std::set<std::string> single = Launch(service, port, 1);
  REQUIRE(single.size() == 1);
  CHECK(*single.begin() != *second.begin());
}

TEST_CASE("incarnation: the hello carries resume_step when the trainer gives it",
          "[agent][incarnation]") {
  const int port = FreePort();
  FakeServer service;
  Running server(&service, port);
  AgentConfig cfg = Config(port);
  std::optional<int64_t> expected;
  SECTION("given") {
    cfg.resume_step = 49;
    expected = 49;
  }
  SECTION("not given") {}
  auto agent = Agent::Create(cfg, std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  REQUIRE(WaitUntil([&] { return !service.hellos().empty(); }, std::chrono::seconds(20)));
  const v1::Hello h = service.hellos().front();
  CHECK(h.has_resume_step() == expected.has_value());
  if (expected) CHECK(h.resume_step() == *expected);
  (*agent)->Close(1000);
}

TEST_CASE("incarnation: a resume_step below -1 is an error naming it", "[agent][incarnation]") {
  AgentConfig cfg;
  cfg.resume_step = -2;
  auto agent = Agent::Create(cfg, std::make_unique<SingleProcessReducer>());
  REQUIRE(!agent.ok());
  CHECK_THAT(std::string(agent.status().message()), Catch::Contains("resume_step -2"));
}

TEST_CASE("incarnation: replaced by a newer one - stops streaming - verdicts go on",
          "[agent][incarnation]") {
  const int port = FreePort();
  FakeServer service;
  service.replace_incarnation = true;
  Running server(&service, port);
  auto agent = Agent::Create(Config(port), std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  REQUIRE(WaitUntil([&] { return (*agent)->Stats().replaced; }, std::chrono::seconds(20)));
  // No reconnect loop: the one hello stays the only one (the backoff is at
  // most 100 ms here, so a loop would say hello again within the wait).
  CHECK(HoldsFor([&] { return service.hellos().size() == 1; }, std::chrono::milliseconds(500)));
  CHECK((*agent)->Stats().reconnects == 0);
  for (int64_t s = 0; s < 50; ++s) REQUIRE((*agent)->Step(Input(s)).ok());
  // Nothing is kept for a server that will not take it, and Close() does
  // not wait for acknowledgements that cannot come.
  const auto t0 = std::chrono::steady_clock::now();
  (*agent)->Close(10'000);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK((*agent)->Stats().unacked == 0);
}

}  // namespace
}  // namespace trainwatch::agent
