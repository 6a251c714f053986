// The PostgreSQL store against a real PostgreSQL 15 with a synchronous
// standby (tests/testing/pg_cluster.h): the ack rule at the store's Write,
// and trainwatchd end to end, the real binary started with
// `--db postgresql://...`, a real agent streaming to it and twctl reading
// the records back, then trainwatchd restarted on the same database.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "stack.h"
#include "store/pg/pg_connection.h"
#include "store/store.h"
#include "testing/pg_cluster.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/agent/reducer.h"
#include "trainwatch/cli/operator_commands.h"

namespace trainwatch::server {
namespace {

using testing::PgCluster;
using namespace std::chrono_literals;

int64_t StepsInPostgres(const PgCluster& cluster, const std::string& run) {
  absl::StatusOr<std::unique_ptr<PgConnection>> c =
      PgConnection::Connect(cluster.Conninfo(PgCluster::Node::kPrimary));
  REQUIRE(c.ok());
  absl::StatusOr<PgRows> rows =
      (*c)->Execute("SELECT COUNT(*) FROM steps WHERE run_id = $1", {run});
  REQUIRE(rows.ok());
  return rows->Int(0, 0).value_or(-1);
}

// A Write on a thread of its own, since it blocks while the standby is
// paused. Leaving the scope (also when a REQUIRE fails) resumes the standby
// and joins; should the commit still hang, killing the primary ends it.
class BackgroundWrite {
 public:
  BackgroundWrite(PgCluster& cluster, std::function<absl::Status()> write)
      : cluster_(cluster), thread_([this, write = std::move(write)] {
          result_ = write();
          done_ = true;
        }) {}
  ~BackgroundWrite() {
    cluster_.Resume(PgCluster::Node::kStandby).IgnoreError();
    if (!testing::WaitUntil([&] { return done_.load(); }, 30s)) {
      cluster_.Kill(PgCluster::Node::kPrimary).IgnoreError();
    }
    thread_.join();
  }
  bool done() const { return done_.load(); }
  absl::Status result() const { return result_; }  // REQUIRES: done()

 private:
  PgCluster& cluster_;
  absl::Status result_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST_CASE("pg store: a batch whose commit lost its wait for the standby is refused - its retry "
          "is stored once",
          "[server][store][pg][ack]") {
  absl::StatusOr<std::unique_ptr<PgCluster>> started = PgCluster::Start(/*with_standby=*/true);
  if (!started.ok()) FAIL(started.status().ToString());
  PgCluster& cluster = **started;
  const std::string conninfo = cluster.Conninfo(PgCluster::Node::kPrimary);
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(conninfo);
  REQUIRE(store.ok());
  absl::StatusOr<std::unique_ptr<PgConnection>> admin = PgConnection::Connect(conninfo);
  REQUIRE(admin.ok());

  WriteBatch batch;
  for (int64_t s = 0; s < 10; ++s) {
    WriteBatch::Step step;
    step.run_id = "r";
    step.step.step = s;
    step.step.Set(core::Signal::kLoss, 1.0);
    batch.steps.push_back(step);
    batch.rank_steps.push_back({"r", 0, 0, s, "report"});
  }
  absl::Status refused;
  {
    REQUIRE(cluster.Pause(PgCluster::Node::kStandby).ok());
    BackgroundWrite write(cluster, [&] { return (*store)->Write(batch); });
    // The commit waits for the paused standby; a cancel of that wait (an
    // operator's pg_cancel_backend, a statement_timeout set on the server)
    // makes PostgreSQL report the commit done.
    int64_t pid = 0;
    REQUIRE(testing::WaitUntil(
        [&] {
          absl::StatusOr<PgRows> r = (*admin)->Execute(
              "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'");
          if (!r.ok() || r->rows() != 1) return false;
          pid = r->Int(0, 0).value_or(0);
          return true;
        },
        30s, 20ms));
    CHECK_FALSE(write.done());
    REQUIRE((*admin)->Execute("SELECT pg_cancel_backend($1)", {pid}).ok());
    REQUIRE(testing::WaitUntil([&] { return write.done(); }, 30s));
    refused = write.result();
  }
  // Refused, so the ingest acknowledges nothing of it, and counted.
  CHECK(refused.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(refused.message()).find("replication doubt") != std::string::npos);
  std::vector<StoreCounter> counters = (*store)->Counters();
  REQUIRE(counters.size() == 1);
  CHECK(counters[0].name == "trainwatch_store_replication_doubts_total");
  CHECK(counters[0].value == 1);
  // The agents re-send the batch (the ingest retries it): stored once, now
  // acknowledged, on both nodes.
  REQUIRE((*store)->Write(batch).ok());
  CHECK(StepsInPostgres(cluster, "r") == 10);
  CHECK((*store)->RankStepsAt("r", 0, 9)->size() == 1);
  absl::StatusOr<std::unique_ptr<PgConnection>> standby =
      PgConnection::Connect(cluster.Conninfo(PgCluster::Node::kStandby));
  REQUIRE(standby.ok());
  // Flushed there when the commit returned; applied (readable) soon after.
  CHECK(testing::WaitUntil(
      [&] {
        absl::StatusOr<PgRows> r = (*standby)->Execute("SELECT COUNT(*) FROM steps");
        return r.ok() && r->Int(0, 0) == 10;
      },
      20s, 20ms));

  // Connections the server ends (a restart, an administrator) fail what was
  // in flight on them, and are opened again at the next use.
  REQUIRE((*admin)
              ->Execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                        "backend_type = 'client backend' AND pid <> pg_backend_pid()")
              .ok());
  WriteBatch more;
  for (int64_t s = 10; s < 20; ++s) {
    WriteBatch::Step step;
    step.run_id = "r";
    step.step.step = s;
    more.steps.push_back(step);
  }
  absl::Status first = (*store)->Write(more);
  if (!first.ok()) {
    CHECK(first.code() == absl::StatusCode::kUnavailable);
    REQUIRE((*store)->Write(more).ok());  // the ingest's retry
  }
  absl::StatusOr<int64_t> count = (*store)->CountSteps("r");
  if (!count.ok()) count = (*store)->CountSteps("r");
  REQUIRE(count.ok());
  CHECK(*count == 20);
}

std::string Twctl(const std::string& command, std::vector<std::string> args,
                  const std::string& address) {
  args.insert(args.end(), {"--server", address});
  std::string out, err;
  const int rc = cli::OperatorCommand(command, args, nullptr, &out, &err);
  INFO(err);
  CHECK(rc == 0);
  return out;
}

TEST_CASE("trainwatchd on PostgreSQL: an agent's records stored on both nodes - twctl reads them "
          "back - a restart finds them",
          "[server][store][pg]") {
  absl::StatusOr<std::unique_ptr<PgCluster>> started = PgCluster::Start(/*with_standby=*/true);
  if (!started.ok()) FAIL(started.status().ToString());
  PgCluster& cluster = **started;
  const std::string db = cluster.Uri(PgCluster::Node::kPrimary);
  const std::string run = "pg-e2e";
  constexpr int kSteps = 300;

  testing::TempDir dir;
  {
    testing::Trainwatchd daemon(dir, "", "", {"--db", db});
    agent::AgentConfig c;
    c.server_address = daemon.address();
    c.run_id = run;
    c.host_name = "pg-e2e";
    auto agent = agent::Agent::Create(c, std::make_unique<agent::SingleProcessReducer>());
    REQUIRE(agent.ok());
    for (int64_t s = 0; s < kSteps; ++s) {
      agent::StepInput in;
      in.step = s;
      in.loss = 2.5 + 0.001 * static_cast<double>(s % 7);
      in.grad_sum_squares = 1.0;
      in.grad_elements = 100;
      REQUIRE((*agent)->Step(in).ok());
    }
    // Acknowledged means committed on the primary and flushed on the standby.
    CHECK(testing::WaitUntil([&] { return (*agent)->Stats().durable_step == kSteps - 1; }, 60s));
    (*agent)->Close(5000);
    CHECK(StepsInPostgres(cluster, run) == kSteps);
    const std::string runs = Twctl("runs", {}, daemon.address());
    CHECK(runs.find(run) != std::string::npos);
    const std::string status = Twctl("status", {run}, daemon.address());
    CHECK(status.find("run " + run + ": step " + std::to_string(kSteps - 1)) != std::string::npos);
  }
  // The keyword form, on a new trainwatchd: the run is rebuilt from the store.
  testing::Trainwatchd again(dir, "", "",
                             {"--db", cluster.Conninfo(PgCluster::Node::kPrimary)});
  const std::string status = Twctl("status", {run}, again.address());
  CHECK(status.find("run " + run + ": step " + std::to_string(kSteps - 1)) != std::string::npos);
}

}  // namespace
}  // namespace trainwatch::server
