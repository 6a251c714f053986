// Chaos while agents stream: a real trainwatchd process on a fixed port,
// SIGKILLed and restarted, once restarted with a database quota that fails
// every write that needs a new page (--db_max_bytes) until another
// process frees space, and two real C++
// agents (spill folders on) stepping through all of it. At the end every
// step an agent saw acknowledged is stored exactly once, evaluated in order,
// and the NaN sent while the store refused writes opened one incident whose
// page was delivered once. The kill points come from a seeded generator;
// the seed is printed (TRAINWATCH_CHAOS_SEED replays one).

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "stack.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/agent/reducer.h"

namespace trainwatch::server {
namespace {

using testing::HttpReceiver;
using testing::TempDir;
using testing::Trainwatchd;

int64_t Query(const std::string& db, const std::string& sql) {
  sqlite3* h = nullptr;
  REQUIRE(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_busy_timeout(h, 5000);
  sqlite3_stmt* st = nullptr;
  INFO(sql);
  REQUIRE(sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) == SQLITE_OK);
  int64_t n = -1;
  if (sqlite3_step(st) == SQLITE_ROW) n = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(h);
  return n;
}

// Runs `sql` on a connection of its own, as another process on the same
// disk would.
void Exec(const std::string& db, const std::string& sql) {
  sqlite3* h = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &h) == SQLITE_OK);
  sqlite3_busy_timeout(h, 5000);
  char* err = nullptr;
  const int rc = sqlite3_exec(h, sql.c_str(), nullptr, nullptr, &err);
  INFO(sql << ": " << (err != nullptr ? err : ""));
  sqlite3_free(err);
  sqlite3_close(h);
  REQUIRE(rc == SQLITE_OK);
}

// One training process: a real agent, rank 0 of 1, stepping on this thread.
struct Trainer {
  Trainer(const std::string& address, const std::string& run, const std::string& spill,
          int64_t nan_step)
      : run(run), nan_step(nan_step) {
    agent::AgentConfig c;
    c.server_address = address;
    c.run_id = run;
    c.host_name = "chaos";
    c.spill_dir = spill;
    c.memory_records = 300;  // a restart's worth of records spills
    c.reconnect_initial_ms = 20;
    c.reconnect_max_ms = 200;
    c.heartbeat_ms = 200;
    auto a = agent::Agent::Create(c, std::make_unique<agent::SingleProcessReducer>());
    REQUIRE(a.ok());
    agent = *std::move(a);
  }
  void StepTo(int64_t last) {
    for (; next <= last; ++next) {
      agent::StepInput in;
      in.step = next;
      in.loss = next == nan_step ? std::numeric_limits<double>::quiet_NaN()
                                 : 2.5 + 0.01 * std::sin(static_cast<double>(next) * 1.7);
      in.grad_sum_squares = 1.0;
      in.grad_elements = 1000;
      REQUIRE(agent->Step(in).ok());
    }
  }
  int64_t durable() const { return agent->Stats().durable_step; }

  std::string run;
  int64_t nan_step;
  int64_t next = 0;
  std::unique_ptr<agent::Agent> agent;
};

TEST_CASE("chaos: SIGKILL - restarts and a full database while agents stream lose nothing",
          "[server][chaos]") {
  uint64_t seed = 20261201;
  if (const char* s = std::getenv("TRAINWATCH_CHAOS_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::printf("chaos seed: %llu (TRAINWATCH_CHAOS_SEED to replay)\n",
              static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  auto between = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };

  TempDir dir;
  HttpReceiver rx;
  const std::string pager = dir.File("pager.json");
  std::ofstream(pager) << "{\"receivers\": [{\"name\": \"hook\", \"type\": \"webhook\", "
                          "\"url\": \"http://127.0.0.1:"
                       << rx.port() << "/hook\"}]}";
  const std::string listen = "127.0.0.1:" + std::to_string(testing::FreePort());
  const std::string log = dir.File("trainwatchd.log");
  auto start = [&](const std::vector<std::string>& flags) {
    std::vector<std::string> all = {"--listen", listen};
    all.insert(all.end(), flags.begin(), flags.end());
    return std::make_unique<Trainwatchd>(dir, "", pager, all);
  };
  const int64_t kNan = 2500;  // run a, sent while the store refuses writes
  Trainer a(listen, "chaos-a", dir.File("spill-a"), kNan);
  Trainer b(listen, "chaos-b", dir.File("spill-b"), -1);
  auto step_both = [&](int64_t last) {
    a.StepTo(last);
    b.StepTo(last);
  };
  auto durable_both = [&](int64_t step, int seconds) {
    return testing::WaitUntil([&] { return a.durable() >= step && b.durable() >= step; },
                              std::chrono::seconds(seconds), std::chrono::milliseconds(10));
  };

  std::unique_ptr<Trainwatchd> d = start({});
  const std::string db = d->db();
  // 1. Streaming, a SIGKILL mid-stream at a seeded step, steps while it is
  //    down (they spill), a restart.
  step_both(999);
  REQUIRE(durable_both(999, 20));
  const int64_t kill1 = between(1000, 1800);
  std::printf("chaos: SIGKILL at step %lld\n", static_cast<long long>(kill1));
  step_both(kill1);
  d->Kill();
  step_both(1999);
  d = start({});
  REQUIRE(durable_both(1999, 30));
  // 2. A SIGKILL; something else fills the disk (2 MB of ballast); a
  //    restart with the quota at the file's size (1 byte: no page to grow
  //    into). Writes fail while the agents stream on, the NaN among them;
  //    then the ballast goes and the same process writes again, without a
  //    restart: the case where acks of later records used to cover the lost
  //    ones.
  d->Kill();
  Exec(db, "CREATE TABLE ballast(b BLOB)");
  Exec(db,
       "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 32) "
       "INSERT INTO ballast SELECT randomblob(65536) FROM n");
  d = start({"--db_max_bytes", "1"});
  step_both(2999);
  REQUIRE(testing::WaitUntil(
      [&] { return testing::ReadFile(log).find("store write failed") != std::string::npos; },
      std::chrono::seconds(20), std::chrono::milliseconds(20)));
  CHECK(std::min(a.durable(), b.durable()) < 2999);
  Exec(db, "DROP TABLE ballast");  // space freed: its pages are reused
  step_both(3049);
  REQUIRE(durable_both(3049, 30));
  // 3. A SIGKILL at a seeded moment, then a normal restart: everything
  //    unacknowledged is re-sent and lands once.
  const int64_t kill3 = between(3050, 3500);
  std::printf("chaos: SIGKILL of the full store at step %lld\n", static_cast<long long>(kill3));
  step_both(kill3);
  d->Kill();
  d = start({});
  step_both(3999);
  REQUIRE(durable_both(3999, 30));
  // The NaN's incident, once, and its page delivered once.
  const std::string nan_incident =
      "SELECT id FROM incidents WHERE run_id = 'chaos-a' AND tier = 3 AND detection_step = " +
      std::to_string(kNan);
  REQUIRE(testing::WaitUntil([&] { return Query(db, nan_incident) > 0; },
                             std::chrono::seconds(10), std::chrono::milliseconds(20)));
  const int64_t incident = Query(db, nan_incident);
  const std::string of_incident = " FROM outbox WHERE incident_id = " + std::to_string(incident);
  REQUIRE(testing::WaitUntil(
      [&] {
        return Query(db, "SELECT COUNT(*)" + of_incident + " AND state = 'pending'") == 0 &&
               Query(db, "SELECT COUNT(*)" + of_incident) > 0;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(20)));
  for (auto* t : {&a, &b}) t->agent->Close(5000);
  d.reset();  // SIGTERM: drained and stopped

  for (auto* t : {&a, &b}) {
    INFO(t->run);
    const agent::AgentStats st = t->agent->Stats();
    CHECK(st.durable_step == 3999);
    CHECK(st.records_dropped == 0);
    CHECK(st.records_spilled > 0);
    const std::string of_run = " FROM steps WHERE run_id = '" + t->run + "'";
    // Every acknowledged step stored exactly once, and evaluated in order
    // (a step taken after a later one would be stored "late").
    CHECK(Query(db, "SELECT COUNT(*)" + of_run) == 4000);
    CHECK(Query(db, "SELECT COUNT(DISTINCT step)" + of_run) == 4000);
    CHECK(Query(db, "SELECT MAX(step)" + of_run) == 3999);
    CHECK(Query(db, "SELECT COUNT(*)" + of_run + " AND late = 1") == 0);
  }
  CHECK(Query(db, "SELECT COUNT(*) FROM incidents WHERE tier = 3") == 1);
  CHECK(Query(db, "SELECT COUNT(*)" + of_incident + " AND kind LIKE 'trigger:%'") == 1);
  const std::string pub = "I-" + std::to_string(incident);
  size_t delivered = 0;
  for (const HttpReceiver::Request& r : rx.requests()) {
    delivered += r.body.find("\"incident_id\":\"" + pub + "\"") != std::string::npos;
  }
  CHECK(delivered == static_cast<size_t>(Query(db, "SELECT COUNT(*)" + of_incident)));
}

}  // namespace
}  // namespace trainwatch::server
