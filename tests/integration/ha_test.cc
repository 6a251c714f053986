// trainwatchd without a single point of failure, as its users would run it:
// a PostgreSQL primary with a synchronous standby, two trainwatchd replicas
// (one owns every shard, the other stands by), two Alertmanagers in a gossip
// cluster whose webhook counts notifications, and agents streaming several
// runs to both replicas' addresses. The owner is killed (and, in a second
// case, the database primary with it); the standby takes over.
//
// What must hold: every step an agent saw acknowledged is stored once and
// contiguous; each incident exists once and was notified once; the standby
// serves within the lease plus its rebuild; a paused owner fences itself.
// Meanwhile the standby serves the operator's reads from the store and
// sends agents and decisions to the owner.

#include <signal.h>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "stack.h"
#include "store/pg/pg_connection.h"
#include "test_util.h"
#include "testing/pg_cluster.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/agent/reducer.h"
#include "trainwatch/cli/operator_commands.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server {
namespace {

using namespace std::chrono_literals;
using testing::Alertmanager;
using testing::Child;
using testing::FreePort;
using testing::HttpGet;
using testing::HttpReceiver;
using testing::PgCluster;
using testing::ReadFile;
using testing::TempDir;
using testing::WaitUntil;
using Node = PgCluster::Node;

constexpr int64_t kLeaseMs = 3'000;
constexpr int kRuns = 3;

// One trainwatchd replica as a process, on ports chosen before it starts:
// it says "listening on" when its port opens, a standby at once, and
// "serving agents on" once it owns the shards and takes records.
struct Replica {
  Replica(const TempDir& dir, const std::string& name, const std::string& db,
          const std::string& pager, int64_t lease_ms = kLeaseMs)
      : port(FreePort()), metrics_port(FreePort()), log(dir.File(name + ".log")) {
    child = std::make_unique<Child>(
        std::vector<std::string>{TRAINWATCHD_PATH, "--listen",
                                 "127.0.0.1:" + std::to_string(port), "--metrics_listen",
                                 "127.0.0.1:" + std::to_string(metrics_port), "--db", db,
                                 "--replica", name, "--lease_ms", std::to_string(lease_ms),
                                 "--pager_config", pager},
        log);
  }
  bool Listening() const {
    return ReadFile(log).find("listening on 127.0.0.1:") != std::string::npos;
  }
  bool Serving() const {
    return ReadFile(log).find("serving agents on 127.0.0.1:") != std::string::npos;
  }
  bool Standing() const { return ReadFile(log).find("standby:") != std::string::npos; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  int port, metrics_port;
  std::string log;
  std::unique_ptr<Child> child;
};

std::string RunId(int r) { return "run-ha-" + std::to_string(r); }

// A benign loss, with a drift of +0.3 from step 3,000 on run 0: a tier 2
// page (non_recovering), as in alertmanager_test.cc.
double Loss(int run, int64_t s) {
  const double base = 2.5 + 0.01 * std::sin(static_cast<double>(s) * 1.7 + run);
  return run == 0 && s >= 3000 ? base + 0.3 : base;
}

struct Agents {
  explicit Agents(const std::string& addresses) {
    for (int r = 0; r < kRuns; ++r) {
      agent::AgentConfig c;
      c.server_address = addresses;
      c.run_id = RunId(r);
      auto a = agent::Agent::Create(c, std::make_unique<agent::SingleProcessReducer>());
      if (!a.ok()) FAIL(a.status().ToString());
      all.push_back(std::move(*a));
    }
  }
  // Steps [from, to) of every run, waiting for each run to be acknowledged
  // durable to `to - 1` (so the ring never fills).
  void Feed(int64_t from, int64_t to) {
    for (int64_t s = from; s < to; ++s) {
      for (int r = 0; r < kRuns; ++r) {
        agent::StepInput in;
        in.step = s;
        in.loss = Loss(r, s);
        in.grad_sum_squares = 1.0;
        in.grad_elements = 1000;
        REQUIRE(all[static_cast<size_t>(r)]->Step(in).ok());
      }
    }
  }
  bool Durable(int64_t step) {
    for (auto& a : all) {
      if (a->Stats().durable_step < step) return false;
    }
    return true;
  }
  std::vector<std::unique_ptr<agent::Agent>> all;
};

// The incident ids of the webhook's notifications, one entry per firing
// notification of each.
std::multiset<std::string> FiringNotifications(HttpReceiver& hook) {
  std::multiset<std::string> ids;
  for (const auto& r : hook.requests()) {
    auto v = core::ParseJson(r.body, "webhook");
    if (!v.ok() || v->Find("status") == nullptr || v->Find("status")->string != "firing") continue;
    for (const core::JsonValue& alert : v->Find("alerts")->array) {
      ids.insert(alert.Find("labels")->Find("incident")->string);
    }
  }
  return ids;
}

// grpc.health.v1.Health/Check of `service` at `address`, by hand: its two
// messages have one field each (the request's service name, the response's
// status), so no generated code is needed. 1 SERVING, 2 NOT_SERVING; -1
// when the call failed.
int HealthStatus(const std::string& address, const std::string& service) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  std::string request;
  if (!service.empty()) {
    request.push_back('\x0a');  // field 1, length-delimited
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out,
                 [&](grpc::Status s) { done.set_value(std::move(s)); });
  if (!done.get_future().get().ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!out.Dump(&slices).ok()) return -1;
  std::string response;
  for (const grpc::Slice& piece : slices) {
    response.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
  }
  // Field 1, a varint; absent is 0 (UNKNOWN).
  return response.size() >= 2 && response[0] == '\x08' ? response[1] : 0;
}

// twctl, in process: the exit code, with what it printed in *out and *err.
int Twctl(const std::vector<std::string>& argv, std::string* out, std::string* err) {
  out->clear();
  err->clear();
  return cli::OperatorCommand(argv.front(), {argv.begin() + 1, argv.end()}, nullptr, out, err);
}

int64_t Int(PgConnection& db, const std::string& sql, const std::vector<PgParam>& params = {}) {
  auto rows = db.Execute(sql, params);
  if (!rows.ok()) FAIL(sql << ": " << rows.status().ToString());
  return rows->Int(0, 0).value_or(-1);
}

// Each run's steps in the database: stored once, contiguous from 0, up to at
// least what its agent saw acknowledged.
void CheckSteps(PgConnection& db, Agents& agents) {
  for (int r = 0; r < kRuns; ++r) {
    INFO(RunId(r));
    const int64_t acked = agents.all[static_cast<size_t>(r)]->Stats().durable_step;
    const std::vector<PgParam> run = {RunId(r)};
    const int64_t rows = Int(db, "SELECT count(*) FROM steps WHERE run_id = $1", run);
    const int64_t distinct =
        Int(db, "SELECT count(DISTINCT (attempt, step)) FROM steps WHERE run_id = $1", run);
    const int64_t first = Int(db, "SELECT min(step) FROM steps WHERE run_id = $1", run);
    const int64_t last = Int(db, "SELECT max(step) FROM steps WHERE run_id = $1", run);
    CHECK(rows == distinct);
    CHECK(first == 0);
    CHECK(rows == last + 1);
    CHECK(last >= acked);
  }
}

struct Stack {
  Stack(bool with_standby_db)
      : gossip_a(FreePort()), gossip_b(FreePort()),
        am_a(dir_am_a, hook.port(), gossip_a, {gossip_b}),
        am_b(dir_am_b, hook.port(), gossip_b, {gossip_a}) {
    auto c = PgCluster::Start(with_standby_db);
    if (!c.ok()) FAIL(c.status().ToString());
    pg = std::move(*c);
    db = with_standby_db ? pg->MultiHostConninfo() : pg->Conninfo(Node::kPrimary);
    REQUIRE(WaitUntil([&] { return am_a.ClusterSize() == 2 && am_b.ClusterSize() == 2; }, 30s,
                      100ms));
    pager = Alertmanager::WritePagerConfig(dir, "http://grafana.local/d/trainwatch",
                                           {&am_a, &am_b});
  }
  TempDir dir, dir_am_a, dir_am_b;
  HttpReceiver hook;
  int gossip_a, gossip_b;
  Alertmanager am_a, am_b;
  std::unique_ptr<PgCluster> pg;
  std::string db, pager;
};

// The owner dies (kill -9), and with `kill_db_primary` the database primary
// too, its standby promoted: the standby replica takes over, the agents
// follow, a NaN after the failover opens a second incident.
void Failover(bool kill_db_primary) {
  Stack st(/*with_standby_db=*/true);
  Replica a(st.dir, "replica-a", st.db, st.pager);
  REQUIRE(WaitUntil([&] { return a.Serving(); }, 30s, 50ms));
  Replica b(st.dir, "replica-b", st.db, st.pager);
  REQUIRE(WaitUntil([&] { return b.Standing() && b.Listening(); }, 30s, 50ms));
  CHECK_FALSE(b.Serving());

  Agents agents(a.address() + "," + b.address());
  agents.Feed(0, 3600);
  REQUIRE(WaitUntil([&] { return agents.Durable(3599); }, 60s, 20ms));
  REQUIRE(WaitUntil([&] { return FiringNotifications(st.hook).size() >= 1; }, 60s, 100ms));
  const std::string first = *FiringNotifications(st.hook).begin();

  const auto killed = std::chrono::steady_clock::now();
  a.child->Kill();
  if (kill_db_primary) {
    REQUIRE(st.pg->Kill(Node::kPrimary).ok());
    REQUIRE(st.pg->Promote(Node::kStandby).ok());
  }
  agents.Feed(3600, 4000);  // queued while nobody serves: the step never waits
  REQUIRE(WaitUntil([&] { return b.Serving(); }, 60s, 20ms));
  const double takeover_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  INFO("takeover " << takeover_s << " s");
  REQUIRE(WaitUntil([&] { return agents.Durable(3999); }, 60s, 20ms));
  // The first acknowledgement on the standby within the lease, its renewal
  // period and the rebuild: the goal is 15 s.
  const double acked_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  std::printf("ha failover (%s): serving after %.2f s, agents acknowledged after %.2f s\n",
              kill_db_primary ? "trainwatchd and the database primary" : "trainwatchd",
              takeover_s, acked_s);
  CHECK(acked_s <= 15.0);

  // A NaN on run 1 after the failover: tier 3, a second incident.
  agent::StepInput nan;
  nan.step = 4000;
  nan.loss = std::nan("");
  nan.grad_sum_squares = 1.0;
  nan.grad_elements = 1000;
  auto v = agents.all[1]->Step(nan);
  REQUIRE(v.ok());
  CHECK(v->decision == core::Decision::kHalt);
  REQUIRE(WaitUntil([&] { return FiringNotifications(st.hook).size() >= 2; }, 60s, 100ms));
  // Each incident notified once: re-sent pages (the new owner's outbox) are
  // de-duplicated by the Alertmanager cluster since their labels never name
  // a replica. Over two peer-timeouts (4 s each) show no second notification.
  CHECK(testing::HoldsFor(
      [&] {
        const auto ids = FiringNotifications(st.hook);
        return ids.size() == 2 && ids.count(first) == 1;
      },
      10s));
  for (auto& agent : agents.all) agent->Close();

  auto conn = PgConnection::Connect(kill_db_primary ? st.pg->Conninfo(Node::kStandby)
                                                    : st.pg->Conninfo(Node::kPrimary));
  REQUIRE(conn.ok());
  CheckSteps(**conn, agents);
  // Each incident once: the standby's engines, rebuilt from the snapshots
  // and the tail, found the drift's episode again rather than a new one.
  // Two were paged (tiers 2 and 3); the drift's onset also left a tier 0
  // early warning, recorded, not paged.
  CHECK(Int(**conn, "SELECT count(*) FROM incidents") ==
        Int(**conn, "SELECT count(DISTINCT (run_id, episode)) FROM incidents"));
  CHECK(Int(**conn, "SELECT count(*) FROM incidents WHERE tier >= 2") == 2);
  // The standby took every shard at a new epoch.
  CHECK(Int(**conn, "SELECT count(*) FROM shard_lease WHERE holder = 'replica-b' AND epoch = 2") ==
        Int(**conn, "SELECT count(*) FROM shard_lease"));
}

TEST_CASE("ha: the standby replica takes over from a killed owner", "[integration][ha][pg]") {
  Failover(/*kill_db_primary=*/false);
}

TEST_CASE("ha: the standby replica takes over when the database primary dies with the owner",
          "[integration][ha][pg]") {
  Failover(/*kill_db_primary=*/true);
}

TEST_CASE("ha: when only the database primary dies the owner keeps its shards",
          "[integration][ha][pg]") {
  Stack st(/*with_standby_db=*/true);
  // A lease longer than the database's failover takes on a loaded machine
  // (the kill, the promotion, the owner's reconnection): the owner must
  // renew through it, not fence itself.
  constexpr int64_t kLongLeaseMs = 15'000;
  Replica a(st.dir, "replica-a", st.db, st.pager, kLongLeaseMs);
  REQUIRE(WaitUntil([&] { return a.Serving(); }, 30s, 50ms));
  Replica b(st.dir, "replica-b", st.db, st.pager, kLongLeaseMs);
  REQUIRE(WaitUntil([&] { return b.Standing(); }, 30s, 50ms));
  Agents agents(a.address() + "," + b.address());
  agents.Feed(0, 500);
  REQUIRE(WaitUntil([&] { return agents.Durable(499); }, 60s, 20ms));
  REQUIRE(st.pg->Kill(Node::kPrimary).ok());
  REQUIRE(st.pg->Promote(Node::kStandby).ok());
  agents.Feed(500, 1000);
  REQUIRE(WaitUntil([&] { return agents.Durable(999); }, 60s, 20ms));
  CHECK(a.child->running());
  CHECK_FALSE(b.Serving());
  for (auto& agent : agents.all) agent->Close();
  auto conn = PgConnection::Connect(st.pg->Conninfo(Node::kStandby));
  REQUIRE(conn.ok());
  CheckSteps(**conn, agents);
  CHECK(Int(**conn, "SELECT count(*) FROM shard_lease WHERE holder = 'replica-a' AND epoch = 1") ==
        Int(**conn, "SELECT count(*) FROM shard_lease"));
}

TEST_CASE("ha: an owner paused past its lease fences itself and acknowledges nothing",
          "[integration][ha][pg]") {
  Stack st(/*with_standby_db=*/false);
  Replica a(st.dir, "replica-a", st.db, st.pager);
  REQUIRE(WaitUntil([&] { return a.Serving(); }, 30s, 50ms));
  Replica b(st.dir, "replica-b", st.db, st.pager);
  REQUIRE(WaitUntil([&] { return b.Standing(); }, 30s, 50ms));
  // These agents know the owner alone: whatever they see acknowledged came
  // from it.
  Agents agents(a.address());
  agents.Feed(0, 500);
  REQUIRE(WaitUntil([&] { return agents.Durable(499); }, 60s, 20ms));
  REQUIRE(kill(a.child->pid(), SIGSTOP) == 0);
  agents.Feed(500, 600);  // sent to the paused owner's socket
  REQUIRE(WaitUntil([&] { return b.Serving(); }, 60s, 50ms));
  REQUIRE(kill(a.child->pid(), SIGCONT) == 0);
  // Awake again, the old owner finds its lease lapsed on its own clock: it
  // commits and acknowledges nothing of what waited in its socket, and
  // exits, saying why.
  REQUIRE(WaitUntil([&] { return !a.child->running(); }, 30s, 50ms));
  CHECK(ReadFile(a.log).find("fenced") != std::string::npos);
  for (auto& agent : agents.all) CHECK(agent->Stats().durable_step == 499);
  auto conn = PgConnection::Connect(st.pg->Conninfo(Node::kPrimary));
  REQUIRE(conn.ok());
  CHECK(Int(**conn, "SELECT count(*) FROM steps WHERE step >= 500") == 0);
  for (auto& agent : agents.all) agent->Close(0);
}

TEST_CASE("ha: a standby serves the operator's reads and sends agents and decisions to the owner",
          "[integration][ha][pg]") {
  Stack st(/*with_standby_db=*/false);
  Replica a(st.dir, "replica-a", st.db, st.pager);
  REQUIRE(WaitUntil([&] { return a.Serving(); }, 30s, 50ms));
  Replica b(st.dir, "replica-b", st.db, st.pager);
  REQUIRE(WaitUntil([&] { return b.Standing() && b.Listening(); }, 30s, 50ms));
  INFO(ReadFile(b.log));
  const std::string agent_service = "trainwatch.v1.AgentService";
  // Up, but taking no records: on grpc.health.v1 and the /serving probe.
  CHECK(HealthStatus(a.address(), agent_service) == 1);
  CHECK(HealthStatus(b.address(), agent_service) == 2);
  CHECK(HealthStatus(b.address(), "") == 1);
  CHECK(HttpGet(a.metrics_port, "/serving").find("trainwatch_serving 1") != std::string::npos);
  CHECK(HttpGet(b.metrics_port, "/serving").find("trainwatch_serving") == std::string::npos);
  // A standby's /metrics has its leases and no run: the owner exports those.
  const std::string metrics = HttpGet(b.metrics_port, "/metrics");
  CHECK(metrics.find("trainwatch_lease_shards_owned 0") != std::string::npos);
  CHECK(metrics.find("trainwatch_lease_shards_total 64") != std::string::npos);

  Agents agents(a.address());
  agents.Feed(0, 3600);
  REQUIRE(WaitUntil([&] { return agents.Durable(3599); }, 60s, 20ms));
  CHECK(HttpGet(b.metrics_port, "/metrics").find("trainwatch_loss{") == std::string::npos);

  // The standby's reads: what the owner stored, within a refresh (2 s).
  std::string out, err;
  REQUIRE(WaitUntil(
      [&] {
        return Twctl({"status", RunId(0), "--server", b.address()}, &out, &err) == 0 &&
               out.find("step 3599") != std::string::npos;
      },
      30s, 200ms));
  CHECK(out.find("answered by standby replica replica-b") != std::string::npos);
  CHECK(out.find("the owner, replica replica-a") != std::string::npos);
  REQUIRE(Twctl({"runs", "--server", b.address()}, &out, &err) == 0);
  for (int r = 0; r < kRuns; ++r) CHECK(out.find(RunId(r)) != std::string::npos);
  CHECK(out.find("answered by standby") != std::string::npos);
  // The owner's answer says nothing of the kind.
  REQUIRE(Twctl({"status", RunId(0), "--server", a.address()}, &out, &err) == 0);
  CHECK(out.find("standby") == std::string::npos);

  auto conn = PgConnection::Connect(st.pg->Conninfo(Node::kPrimary));
  REQUIRE(conn.ok());
  const std::string paged =
      "I-" + std::to_string(Int(**conn, "SELECT id FROM incidents WHERE tier = 2"));
  REQUIRE(Twctl({"incident", "--server", b.address(), "show", paged}, &out, &err) == 0);
  CHECK(out.find(paged) != std::string::npos);

  // Watching the standby: the owner's changes reach it from the store.
  const int64_t open = Int(**conn, "SELECT count(*) FROM incidents WHERE run_id = '" +
                                       RunId(0) + "' AND closed_ms = 0");
  REQUIRE(open >= 1);
  std::mutex mu;
  std::vector<std::string> lines;
  std::string watch_out, watch_err;
  int watch_rc = -1;
  std::thread watch([&] {
    watch_rc = cli::OperatorCommand(
        "watch",
        {"--server", b.address(), "--run", RunId(0), "--open", "--count",
         std::to_string(open + 1), "--timeout", "60"},
        nullptr, &watch_out, &watch_err, [&](const std::string& line) {
          std::lock_guard<std::mutex> lock(mu);
          lines.push_back(line);
        });
  });
  auto seen = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const std::string& l : lines) n += l.find(what) != std::string::npos;
    return n;
  };
  // The snapshot came: the watcher is registered.
  REQUIRE(WaitUntil([&] { return seen("snapshot") == open; }, 30s, 50ms));

  // A decision on the standby alone is refused, naming the owner; with both
  // addresses twctl moves on to the owner, which records it.
  CHECK(Twctl({"rollback", "--server", b.address(), "reject", paged, "--comment", "drift is ok"},
              &out, &err) == 1);
  CHECK(err.find("standby") != std::string::npos);
  CHECK(err.find("replica replica-a owns the runs") != std::string::npos);
  CHECK(err.find("(aborted: try again)") != std::string::npos);
  CHECK(Twctl({"rollback", "--server", b.address() + "," + a.address(), "reject", paged,
               "--comment", "drift is ok"},
              &out, &err) == 0);
  watch.join();
  INFO(watch_out << watch_err);
  CHECK(watch_rc == 0);
  CHECK(seen("state_changed") == 1);
  CHECK(seen("dismissed") == 1);

  // An agent that knows the standby alone is refused there: nothing of its
  // run is stored, and its training step went on.
  {
    agent::AgentConfig c;
    c.server_address = b.address();
    c.run_id = "run-standby-only";
    auto lone = agent::Agent::Create(c, std::make_unique<agent::SingleProcessReducer>());
    REQUIRE(lone.ok());
    for (int64_t s = 0; s < 20; ++s) {
      agent::StepInput in;
      in.step = s;
      in.loss = 2.5;
      in.grad_sum_squares = 1.0;
      in.grad_elements = 1000;
      REQUIRE((*lone)->Step(in).ok());
    }
    REQUIRE(WaitUntil([&] { return (*lone)->Stats().reconnects >= 2; }, 30s, 50ms));
    CHECK((*lone)->Stats().durable_step == -1);
    CHECK(Int(**conn, "SELECT count(*) FROM runs WHERE run_id = 'run-standby-only'") == 0);
    (*lone)->Close(0);
  }

  // The owner dies: the standby takes agents from then on.
  a.child->Kill();
  REQUIRE(WaitUntil([&] { return b.Serving(); }, 60s, 50ms));
  CHECK(HealthStatus(b.address(), agent_service) == 1);
  CHECK(HttpGet(b.metrics_port, "/serving").find("trainwatch_serving 1") != std::string::npos);
  REQUIRE(Twctl({"status", RunId(0), "--server", b.address()}, &out, &err) == 0);
  CHECK(out.find("standby") == std::string::npos);
  for (auto& agent : agents.all) agent->Close(0);
}

}  // namespace
}  // namespace trainwatch::server
