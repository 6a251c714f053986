// Agents and twctl with several trainwatchd addresses, against real
// trainwatchd processes, each on its own SQLite file: a real C++ agent
// streams to the first; the first is frozen (SIGSTOP, so that what the
// agent sends it stays unacknowledged) and then killed (SIGKILL); the second
// must then hold every step the first had not acknowledged, while the
// training thread's Step() never waited. Also a dead first address from the
// start, for the agent and for twctl, and malformed lists.

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "stack.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/agent/reducer.h"
#include "trainwatch/cli/operator_commands.h"

namespace trainwatch::server {
namespace {

using Clock = std::chrono::steady_clock;
using testing::Child;
using testing::FreePort;
using testing::QueryInt;
using testing::ReadFile;
using testing::TempDir;
using testing::WaitUntil;

// One trainwatchd replica with its own database in `dir`, on a port chosen
// here, as a child whose process the test can freeze and kill. Destroyed,
// it is thawed first, so that the child's SIGTERM is not left pending on a
// stopped process.
class Replica {
 public:
  explicit Replica(const TempDir& dir) : db_(dir.File("trainwatch.db")), port_(FreePort()) {
    const std::string log = dir.File("trainwatchd.log");
    child_ = std::make_unique<Child>(
        std::vector<std::string>{TRAINWATCHD_PATH, "--listen", address(), "--metrics_listen",
                                 "127.0.0.1:0", "--db", db_},
        log);
    const bool up = WaitUntil(
        [&] { return ReadFile(log).find("listening on " + address()) != std::string::npos; },
        std::chrono::seconds(20), std::chrono::milliseconds(20));
    INFO(ReadFile(log));
    REQUIRE(up);
  }
  ~Replica() {
    if (frozen_) kill(child_->pid(), SIGCONT);
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& db() const { return db_; }
  void Freeze() {
    REQUIRE(kill(child_->pid(), SIGSTOP) == 0);
    frozen_ = true;
  }
  void Kill() {
    child_->Kill();
    frozen_ = false;
  }

 private:
  std::string db_;
  int port_;
  std::unique_ptr<Child> child_;
  bool frozen_ = false;
};

// The run's distinct stored steps in `db` within [from, to].
int64_t StoredSteps(const std::string& db, const std::string& run, int64_t from, int64_t to) {
  return QueryInt(db, "SELECT COUNT(DISTINCT step) FROM steps WHERE run_id = '" + run +
                          "' AND step >= " + std::to_string(from) +
                          " AND step <= " + std::to_string(to));
}

// The training loop: one step at a time on this thread, each Step() timed.
class Trainer {
 public:
  Trainer(const std::string& addresses, const std::string& run) {
    agent::AgentConfig c;
    c.server_address = addresses;
    c.run_id = run;
    c.host_name = "failover";
    c.reconnect_initial_ms = 50;
    c.reconnect_max_ms = 500;
    // Only the kill moves the agent on: a write held up by the frozen
    // server must not be cancelled first (a real server frozen this long
    // would be; that path is the stall test's, tests/agent).
    c.stall_timeout_ms = 120'000;
    c.ring_records = 1 << 15;
    auto a = agent::Agent::Create(c, std::make_unique<agent::SingleProcessReducer>());
    REQUIRE(a.ok());
    agent_ = *std::move(a);
  }

  // One step, about `pace` after the last; its Step() time counts.
  void Step(std::chrono::milliseconds pace = std::chrono::milliseconds(2)) {
    std::this_thread::sleep_for(pace);
    agent::StepInput in;
    in.step = next_++;
    in.loss = 2.5 + 0.001 * static_cast<double>(in.step % 7);
    in.grad_sum_squares = 1.0;
    in.grad_elements = 100;
    const auto t0 = Clock::now();
    REQUIRE(agent_->Step(in).ok());
    slowest_ = std::max(slowest_, Clock::now() - t0);
  }
  int64_t last_step() const { return next_ - 1; }
  agent::Agent& agent() { return *agent_; }
  double slowest_ms() const {
    return std::chrono::duration<double, std::milli>(slowest_).count();
  }

 private:
  std::unique_ptr<agent::Agent> agent_;
  int64_t next_ = 0;
  Clock::duration slowest_{0};
};

TEST_CASE("failover: the first trainwatchd frozen then killed - the second stores every step it "
          "did not acknowledge - Step never waits",
          "[integration][failover]") {
  TempDir dir_a, dir_b;
  Replica a(dir_a), b(dir_b);
  const std::string run = "failover-run";
  Trainer t(a.address() + "," + b.address(), run);

  // 1. Streaming to the first, every step acknowledged.
  for (int i = 0; i < 200; ++i) t.Step();
  REQUIRE(WaitUntil([&] { return t.agent().Stats().durable_step >= 199; },
                    std::chrono::seconds(20)));

  // 2. The first freezes: what the agent sends it now is never acknowledged.
  // Acks already on their way land within the pause before the reading.
  a.Freeze();
  const auto frozen = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t acked_by_first = t.agent().Stats().durable_step;
  while (Clock::now() - frozen < std::chrono::seconds(2)) t.Step();
  const int64_t sent_to_first = t.last_step();
  CHECK(t.agent().Stats().durable_step == acked_by_first);

  // 3. It dies. Training goes on at its pace; the agent moves to the second.
  a.Kill();
  const auto killed = Clock::now();
  const bool caught_up = [&] {
    while (Clock::now() - killed < std::chrono::seconds(60)) {
      t.Step();
      if (t.agent().Stats().durable_step >= sent_to_first) return true;
    }
    return false;
  }();
  const auto failed_over = Clock::now();
  REQUIRE(caught_up);
  for (int i = 0; i < 200; ++i) t.Step();
  const int64_t last = t.last_step();
  REQUIRE(WaitUntil([&] { return t.agent().Stats().durable_step >= last; },
                    std::chrono::seconds(30)));
  const agent::AgentStats stats = t.agent().Stats();
  t.agent().Close(5000);

  const double outage_ms =
      std::chrono::duration<double, std::milli>(failed_over - frozen).count();
  const double failover_ms =
      std::chrono::duration<double, std::milli>(failed_over - killed).count();
  std::printf("failover: %lld steps; the first acknowledged up to %lld of the %lld sent to it; "
              "kill to the second acknowledging them %.0f ms; slowest Step() %.1f ms\n",
              static_cast<long long>(last + 1), static_cast<long long>(acked_by_first),
              static_cast<long long>(sent_to_first), failover_ms, t.slowest_ms());

  CHECK(acked_by_first >= 199);
  CHECK(acked_by_first < sent_to_first);  // there were steps the first never acknowledged
  // Everything the first acknowledged is stored there.
  CHECK(StoredSteps(a.db(), run, 0, acked_by_first) == acked_by_first + 1);
  // Every step after that, the unacknowledged ones included, is stored by
  // the second, once; nothing acknowledged was sent to it again.
  CHECK(StoredSteps(b.db(), run, acked_by_first + 1, last) == last - acked_by_first);
  CHECK(QueryInt(b.db(), "SELECT COUNT(*) FROM steps WHERE run_id = '" + run + "'") ==
        last - acked_by_first);
  CHECK(StoredSteps(b.db(), run, 0, acked_by_first) == 0);
  CHECK(stats.records_dropped == 0);
  CHECK(stats.reconnects >= 1);
  CHECK_FALSE(stats.replaced);
  // The step never waited on any of it: the slowest Step() is far below the
  // time the records had no server (frozen 2 s, then the failover). A step
  // that waited on the network would have taken most of that.
  CHECK(outage_ms >= 2000.0);
  CHECK(t.slowest_ms() * 4 < outage_ms);
}

TEST_CASE("failover: keepalive notices a frozen first trainwatchd - a quiet agent moves on",
          "[integration][failover]") {
  // A frozen server is a machine gone: its socket stays open, nothing
  // answers, and steps at a trainer's slow pace never fill the connection,
  // so no write stalls. Only the client's keepalive can notice it.
  TempDir dir_a, dir_b;
  Replica a(dir_a), b(dir_b);
  const std::string run = "keepalive-run";
  Trainer t(a.address() + "," + b.address(), run);
  for (int i = 0; i < 10; ++i) t.Step();
  REQUIRE(WaitUntil([&] { return t.agent().Stats().durable_step >= 9; },
                    std::chrono::seconds(20)));
  a.Freeze();
  const auto frozen = Clock::now();
  const bool moved = [&] {
    while (Clock::now() - frozen < std::chrono::seconds(60)) {
      t.Step(std::chrono::milliseconds(250));
      if (StoredSteps(b.db(), run, 10, t.last_step()) > 0) return true;
    }
    return false;
  }();
  const double noticed_s = std::chrono::duration<double>(Clock::now() - frozen).count();
  std::printf("keepalive: the frozen server was left after %.1f s\n", noticed_s);
  REQUIRE(moved);
  // Keepalive's ping interval plus its timeout, and room for a loaded machine.
  CHECK(noticed_s < 45.0);
  const int64_t last = t.last_step();
  REQUIRE(WaitUntil([&] { return t.agent().Stats().durable_step >= last; },
                    std::chrono::seconds(30)));
  t.agent().Close(5000);
  CHECK(StoredSteps(b.db(), run, 10, last) == last - 9);
}

TEST_CASE("failover: a dead first address from the start - the agent streams to the second",
          "[integration][failover]") {
  const std::string dead = "127.0.0.1:" + std::to_string(FreePort());
  TempDir dir;
  Replica b(dir);
  const std::string run = "dead-first";
  Trainer t(dead + "," + b.address(), run);
  for (int i = 0; i < 100; ++i) t.Step(std::chrono::milliseconds(1));
  REQUIRE(WaitUntil([&] { return t.agent().Stats().durable_step >= 99; },
                    std::chrono::seconds(30)));
  t.agent().Close(5000);
  CHECK(StoredSteps(b.db(), run, 0, 99) == 100);
}

TEST_CASE("failover: twctl with a dead first address answers from the second",
          "[integration][failover]") {
  const std::string dead = "127.0.0.1:" + std::to_string(FreePort());
  TempDir dir;
  Replica b(dir);
  {
    Trainer t(b.address(), "seen-by-twctl");
    for (int i = 0; i < 20; ++i) t.Step(std::chrono::milliseconds(1));
    REQUIRE(WaitUntil([&] { return t.agent().Stats().durable_step >= 19; },
                      std::chrono::seconds(30)));
    t.agent().Close(5000);
  }
  std::string out, err;
  const int rc = cli::OperatorCommand("runs", {"--server", dead + "," + b.address()}, nullptr,
                                      &out, &err);
  INFO(out << err);
  CHECK(rc == 0);
  CHECK(out.find("seen-by-twctl") != std::string::npos);
  // A real error from the serving replica is the answer, as with one server.
  out.clear();
  err.clear();
  const int missing = cli::OperatorCommand(
      "incident", {"--server", dead + "," + b.address(), "show", "I-424242"}, nullptr, &out, &err);
  INFO(out << err);
  CHECK(missing == 1);
  CHECK(err.find("no incident I-424242 (not found)") != std::string::npos);
  // The watch stream too: the second replica's watch runs to its timeout
  // (exit 0), where the dead address alone is an error.
  out.clear();
  err.clear();
  CHECK(cli::OperatorCommand("watch", {"--server", dead + "," + b.address(), "--timeout", "1"},
                             nullptr, &out, &err) == 0);
  CHECK(cli::OperatorCommand("watch", {"--server", dead, "--timeout", "1"}, nullptr, &out,
                             &err) == 1);
  // Every address down: the last one's UNAVAILABLE, as with one server.
  out.clear();
  err.clear();
  CHECK(cli::OperatorCommand("runs", {"--server", dead + "," + dead}, nullptr, &out, &err) == 1);
  CHECK(err.find("(server unavailable)") != std::string::npos);
}

TEST_CASE("failover: malformed address lists are refused with a message naming the entry",
          "[integration][failover]") {
  std::string out, err;
  CHECK(cli::OperatorCommand("runs", {"--server", "127.0.0.1:7070,,127.0.0.1:7071"}, nullptr,
                             &out, &err) == 2);
  CHECK(err ==
        "twctl: server address list \"127.0.0.1:7070,,127.0.0.1:7071\": entry 2 is empty "
        "(addresses are separated by single commas, host:port,host:port)\n");
  err.clear();
  CHECK(cli::OperatorCommand("runs", {"--server", "127.0.0.1:7070,127.0.0.1:"}, nullptr, &out,
                             &err) == 2);
  CHECK(err.find("entry 2 (\"127.0.0.1:\") is malformed: the port after ':' is empty") !=
        std::string::npos);
  // The agent refuses it at Create, naming the setting.
  agent::AgentConfig c;
  c.server_address = "127.0.0.1:7070 127.0.0.1:7071";
  c.run_id = "malformed";
  auto a = agent::Agent::Create(c, std::make_unique<agent::SingleProcessReducer>());
  REQUIRE_FALSE(a.ok());
  CHECK(std::string(a.status().message()).find("server_address: server address list") == 0);
  CHECK(std::string(a.status().message()).find("it has a blank inside") != std::string::npos);
}

}  // namespace
}  // namespace trainwatch::server
