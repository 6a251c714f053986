// Several server addresses: the list's parsing and its errors, the
// rotation's policy alone, and the agent against fake replicas that are
// down, refuse the run (as a replica that does not own it would) or die
// mid-run. The failover between real trainwatchd processes is
// tests/integration/failover_test.cc.

#include <chrono>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "fake_trainwatchd.h"
#include "server_rotation.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/agent/server_addresses.h"

namespace trainwatch::agent {
namespace {

using internal::ServerRotation;
using testing::FreePort;
using testing::WaitUntil;

std::string Local(int port) { return "127.0.0.1:" + std::to_string(port); }

AgentConfig Config(const std::string& addresses) {
  AgentConfig c;
  c.server_address = addresses;
  c.run_id = "run-t";
  c.reconnect_initial_ms = 20;
  c.reconnect_max_ms = 200;
  return c;
}

void Feed(Agent& a, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s) {
    StepInput in;
    in.step = s;
    in.loss = 2.5;
    REQUIRE(a.Step(in).ok());
  }
}

std::set<int64_t> Range(int64_t from, int64_t to) {
  std::set<int64_t> s;
  for (int64_t i = from; i < to; ++i) s.insert(i);
  return s;
}

// The error of `list`, or "" when it parses.
std::string ErrorOf(const std::string& list) {
  absl::StatusOr<std::vector<std::string>> parsed = ParseServerAddresses(list);
  if (parsed.ok()) return "";
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

TEST_CASE("server addresses: every single form stays one address as given",
          "[agent][failover]") {
  for (const std::string one :
       {"127.0.0.1:7070", "localhost:7070", "trainwatch", "tw-0.tw.svc.cluster.local:7070",
        "[::1]:7070", "[::1]", "unix:/run/trainwatch.sock", "unix:relative.sock",
        "unix-abstract:trainwatch", "ipv4:127.0.0.1:7070", "ipv6:[::1]:7070",
        "dns:///trainwatch:7070", "dns://8.8.8.8/trainwatch:7070"}) {
    INFO(one);
    absl::StatusOr<std::vector<std::string>> parsed = ParseServerAddresses(one);
    REQUIRE(parsed.ok());
    CHECK(*parsed == std::vector<std::string>{one});
  }
}

TEST_CASE("server addresses: a list in its order - blanks around entries dropped",
          "[agent][failover]") {
  absl::StatusOr<std::vector<std::string>> parsed =
      ParseServerAddresses(" 10.0.0.1:7070 ,unix:/tmp/tw.sock,\t[::1]:7071 ");
  REQUIRE(parsed.ok());
  CHECK(*parsed == std::vector<std::string>{"10.0.0.1:7070", "unix:/tmp/tw.sock", "[::1]:7071"});
}

TEST_CASE("server addresses: an empty or malformed entry is an error naming it",
          "[agent][failover]") {
  CHECK(ErrorOf("") == "server address list \"\" is empty");
  CHECK(ErrorOf("a:1,,b:2") ==
        "server address list \"a:1,,b:2\": entry 2 is empty (addresses are separated by single "
        "commas, host:port,host:port)");
  CHECK(ErrorOf("a:1,").find("entry 2 is empty") != std::string::npos);
  CHECK(ErrorOf(",a:1").find("entry 1 is empty") != std::string::npos);
  CHECK(ErrorOf("a:1, ,b:2").find("entry 2 is empty") != std::string::npos);
  CHECK(ErrorOf("a:1,b c:2") ==
        "server address list \"a:1,b c:2\": entry 2 (\"b c:2\") is malformed: it has a blank "
        "inside; expected host:port, [v6-address]:port or a gRPC URI such as unix:/path");
  CHECK(ErrorOf("a:0").find("the port '0' is not a number in 1..65535") != std::string::npos);
  CHECK(ErrorOf("a:70000").find("the port '70000'") != std::string::npos);
  CHECK(ErrorOf("a:+7").find("the port '+7'") != std::string::npos);
  CHECK(ErrorOf("a:http").find("the port 'http'") != std::string::npos);
  CHECK(ErrorOf("a:").find("the port after ':' is empty") != std::string::npos);
  CHECK(ErrorOf(":7070").find("the host is empty") != std::string::npos);
  CHECK(ErrorOf("[::1:7070").find("its '[' is not closed") != std::string::npos);
  CHECK(ErrorOf("[]:7070").find("the host between [ ] is empty") != std::string::npos);
  CHECK(ErrorOf("::1:7070").find("an IPv6 address goes in brackets") != std::string::npos);
  CHECK(ErrorOf("a:1,unix:").find("entry 2 (\"unix:\") is malformed: nothing follows unix:") !=
        std::string::npos);
  CHECK(ErrorOf("a;b:2").find("';' cannot be in a host name") != std::string::npos);
}

TEST_CASE("server rotation: one address backs off each time - FAILED_PRECONDITION is final",
          "[agent][failover]") {
  ServerRotation r({"a:1"});
  ServerRotation::Next n = r.StreamEnded(grpc::StatusCode::UNAVAILABLE);
  CHECK(n.back_off);
  CHECK_FALSE(n.replaced);
  CHECK(r.address() == "a:1");
  n = r.StreamEnded(grpc::StatusCode::ABORTED);
  CHECK(n.back_off);
  CHECK_FALSE(n.replaced);
  CHECK(r.StreamEnded(grpc::StatusCode::FAILED_PRECONDITION).replaced);
}

TEST_CASE("server rotation: several addresses in turn - a back-off once per round",
          "[agent][failover]") {
  ServerRotation r({"a:1", "b:2", "c:3"});
  CHECK(r.address() == "a:1");
  ServerRotation::Next n = r.StreamEnded(grpc::StatusCode::UNAVAILABLE);
  CHECK(r.address() == "b:2");
  CHECK_FALSE(n.back_off);
  n = r.StreamEnded(grpc::StatusCode::ABORTED);
  CHECK(r.address() == "c:3");
  CHECK_FALSE(n.back_off);
  n = r.StreamEnded(grpc::StatusCode::OK);
  CHECK(r.address() == "a:1");
  CHECK(n.back_off);
  CHECK_FALSE(r.StreamEnded(grpc::StatusCode::CANCELLED).back_off);
}

TEST_CASE("server rotation: FAILED_PRECONDITION is final only when every address said it in a row",
          "[agent][failover]") {
  ServerRotation r({"a:1", "b:2"});
  CHECK_FALSE(r.StreamEnded(grpc::StatusCode::FAILED_PRECONDITION).replaced);  // a: not the owner
  CHECK_FALSE(r.StreamEnded(grpc::StatusCode::UNAVAILABLE).replaced);          // b: down
  CHECK_FALSE(r.StreamEnded(grpc::StatusCode::FAILED_PRECONDITION).replaced);  // a again
  CHECK(r.StreamEnded(grpc::StatusCode::FAILED_PRECONDITION).replaced);        // b too: replaced
  ServerRotation aborted({"a:1", "b:2"});
  for (int i = 0; i < 10; ++i) {
    CHECK_FALSE(aborted.StreamEnded(grpc::StatusCode::ABORTED).replaced);
  }
}

TEST_CASE("failover: TRAINWATCH_SERVER and server_address refuse a malformed list",
          "[agent][failover]") {
  setenv("TRAINWATCH_SERVER", "127.0.0.1:7070,,127.0.0.1:7071", 1);
  absl::StatusOr<AgentConfig> env = AgentConfig::FromEnvironment();
  unsetenv("TRAINWATCH_SERVER");
  REQUIRE_FALSE(env.ok());
  CHECK(env.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(env.status().message()) ==
        "TRAINWATCH_SERVER: server address list \"127.0.0.1:7070,,127.0.0.1:7071\": entry 2 is "
        "empty (addresses are separated by single commas, host:port,host:port)");

  setenv("TRAINWATCH_SERVER", "127.0.0.1:7070, 127.0.0.1:7071", 1);
  env = AgentConfig::FromEnvironment();
  unsetenv("TRAINWATCH_SERVER");
  REQUIRE(env.ok());
  CHECK(env->server_address == "127.0.0.1:7070, 127.0.0.1:7071");

  auto agent = Agent::Create(Config("127.0.0.1:7070,127.0.0.1:99999"),
                             std::make_unique<SingleProcessReducer>());
  REQUIRE_FALSE(agent.ok());
  CHECK(agent.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(agent.status().message())
            .rfind("server_address: server address list \"127.0.0.1:7070,127.0.0.1:99999\": "
                   "entry 2 (\"127.0.0.1:99999\") is malformed: the port '99999'",
                   0) == 0);
}

TEST_CASE("failover: a dead first address - the second gets every step from the start",
          "[agent][failover]") {
  const int dead = FreePort();
  const int port = FreePort();
  FakeServer fake;
  Running server(&fake, port);
  auto agent = Agent::Create(Config(Local(dead) + "," + Local(port)),
                             std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  Feed(**agent, 0, 200);
  REQUIRE(WaitUntil([&] { return (*agent)->Stats().durable_step >= 199; },
                    std::chrono::seconds(20)));
  CHECK(fake.steps() == Range(0, 200));
  CHECK((*agent)->Stats().records_dropped == 0);
  (*agent)->Close();
}

TEST_CASE("failover: a replica refusing the run is skipped - ABORTED or FAILED_PRECONDITION",
          "[agent][failover]") {
  const grpc::StatusCode code =
      GENERATE(grpc::StatusCode::ABORTED, grpc::StatusCode::FAILED_PRECONDITION,
               grpc::StatusCode::UNAVAILABLE);
  INFO("the first replica answers " << static_cast<int>(code));
  const int first = FreePort();
  const int second = FreePort();
  FakeServer not_owner, owner;
  not_owner.refuse_hello = code;
  Running a(&not_owner, first), b(&owner, second);
  auto agent = Agent::Create(Config(Local(first) + "," + Local(second)),
                             std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  Feed(**agent, 0, 200);
  REQUIRE(WaitUntil([&] { return (*agent)->Stats().durable_step >= 199; },
                    std::chrono::seconds(20)));
  CHECK(owner.steps() == Range(0, 200));
  CHECK(not_owner.steps().empty());
  CHECK_FALSE(not_owner.hellos().empty());  // it was asked first
  CHECK_FALSE((*agent)->Stats().replaced);
  (*agent)->Close();
}

TEST_CASE("failover: every replica answering FAILED_PRECONDITION - replaced - streaming stops",
          "[agent][failover]") {
  const int first = FreePort();
  const int second = FreePort();
  FakeServer r0, r1;
  r0.refuse_hello = grpc::StatusCode::FAILED_PRECONDITION;
  r1.refuse_hello = grpc::StatusCode::FAILED_PRECONDITION;
  Running a(&r0, first), b(&r1, second);
  auto agent = Agent::Create(Config(Local(first) + "," + Local(second)),
                             std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  REQUIRE(WaitUntil([&] { return (*agent)->Stats().replaced; }, std::chrono::seconds(20)));
  CHECK(r0.hellos().size() == 1);
  CHECK(r1.hellos().size() == 1);
  (*agent)->Close(1000);
}

TEST_CASE("failover: the serving fake dies mid-run - the next gets what was not acknowledged",
          "[agent][failover]") {
  const int first = FreePort();
  const int second = FreePort();
  FakeServer r0, r1;
  auto a = std::make_unique<Running>(&r0, first);
  Running b(&r1, second);
  auto agent = Agent::Create(Config(Local(first) + "," + Local(second)),
                             std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  int64_t durable_at_death = -1;
  {
    Feed(**agent, 0, 300);
    REQUIRE(WaitUntil([&] { return (*agent)->Stats().durable_step >= 299; },
                      std::chrono::seconds(20)));
    // Its acks stop: what comes next is not acknowledged by it.
    r0.ack_delay_ms = 1000;
    Feed(**agent, 300, 320);
    durable_at_death = (*agent)->Stats().durable_step;
    a.reset();  // dies
  }
  Feed(**agent, 320, 400);
  REQUIRE(WaitUntil([&] { return (*agent)->Stats().durable_step >= 399; },
                    std::chrono::seconds(20)));
  CHECK(durable_at_death >= 299);
  CHECK(durable_at_death < 319);  // some steps were sent and not acknowledged
  for (int64_t s = 0; s <= durable_at_death; ++s) CHECK(r0.steps().count(s) == 1);
  std::set<int64_t> resent;
  for (int64_t s : r1.steps()) {
    if (s <= durable_at_death) resent.insert(s);
  }
  CHECK(resent.empty());  // acknowledged steps are not sent again
  for (int64_t s = durable_at_death + 1; s < 400; ++s) {
    INFO("step " << s);
    CHECK(r1.steps().count(s) == 1);
  }
  CHECK((*agent)->Stats().records_dropped == 0);
  (*agent)->Close();
}

}  // namespace
}  // namespace trainwatch::agent
