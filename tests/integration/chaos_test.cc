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
#include <chrono>
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
using testing::QueryInt;
using testing::TempDir;
using testing::Trainwatchd;

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

// Another process fills the disk: `megabytes` of ballast in the database
// file, beyond any quota trainwatchd opened it with; FreeDisk() drops it,
// and its pages are free for trainwatchd to reuse.
void FillDisk(const std::string& db, int megabytes) {
  Exec(db, "CREATE TABLE ballast(b BLOB)");
  Exec(db, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < " +
               std::to_string(megabytes * 16) +
               ") INSERT INTO ballast SELECT randomblob(65536) FROM n");
}
void FreeDisk(const std::string& db) { Exec(db, "DROP TABLE ballast"); }

// One training process: a real agent, rank 0 of 1, stepping on this thread.
struct Trainer {
  // `spill`: empty for none; `memory_records`: 0 for the default.
  Trainer(const std::string& address, const std::string& run, const std::string& spill,
          int64_t nan_step, size_t memory_records)
      : run(run), nan_step(nan_step) {
    agent::AgentConfig c;
    c.server_address = address;
    c.run_id = run;
    c.host_name = "chaos";
    c.spill_dir = spill;
    if (memory_records > 0) c.memory_records = memory_records;
    // Room for every step of a phase: the test steps faster than any
    // trainer, and a record dropped at the ring would be a gap of its making.
    c.ring_records = 1 << 15;
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
  // Memory for 300 records: a restart's worth spills.
  Trainer a(listen, "chaos-a", dir.File("spill-a"), kNan, 300);
  Trainer b(listen, "chaos-b", dir.File("spill-b"), -1, 300);
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
  // Streams on to a seeded step in [lo, hi], then SIGKILLs trainwatchd.
  auto kill_at = [&](int64_t lo, int64_t hi) {
    const int64_t at = between(lo, hi);
    std::printf("chaos: SIGKILL at step %lld\n", static_cast<long long>(at));
    step_both(at);
    d->Kill();
  };
  // 1. Streaming, a SIGKILL mid-stream at a seeded step, steps while it is
  //    down (they spill), a restart.
  step_both(999);
  REQUIRE(durable_both(999, 20));
  kill_at(1000, 1800);
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
  FillDisk(db, 2);
  d = start({"--db_max_bytes", "1"});
  step_both(2999);
  REQUIRE(testing::WaitUntil(
      [&] { return testing::ReadFile(log).find("store write failed") != std::string::npos; },
      std::chrono::seconds(20), std::chrono::milliseconds(20)));
  CHECK(std::min(a.durable(), b.durable()) < 2999);
  FreeDisk(db);  // space freed, the same trainwatchd still running
  step_both(3049);
  REQUIRE(durable_both(3049, 30));
  // The NaN is durable now, so its incident and page are; the page goes out
  // before the next kill. (A kill in the middle of a delivery may repeat
  // that one page: at-least-once, deduplicated by the receivers. The
  // crash test says the same; here each page is counted.)
  REQUIRE(testing::WaitUntil(
      [&] {
        return QueryInt(db, "SELECT COUNT(*) FROM outbox WHERE state = 'sent'") > 0 &&
               QueryInt(db, "SELECT COUNT(*) FROM outbox WHERE state = 'pending'") == 0;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(20)));
  // 3. A SIGKILL at a seeded moment, then a normal restart: everything
  //    unacknowledged is re-sent and lands once.
  kill_at(3050, 3500);
  d = start({});
  step_both(3999);
  REQUIRE(durable_both(3999, 30));
  // The NaN's incident, once, and its page delivered once.
  const std::string nan_incident =
      "SELECT id FROM incidents WHERE run_id = 'chaos-a' AND tier = 3 AND detection_step = " +
      std::to_string(kNan);
  REQUIRE(testing::WaitUntil([&] { return QueryInt(db, nan_incident) > 0; },
                             std::chrono::seconds(10), std::chrono::milliseconds(20)));
  const int64_t incident = QueryInt(db, nan_incident);
  const std::string of_incident = " FROM outbox WHERE incident_id = " + std::to_string(incident);
  REQUIRE(testing::WaitUntil(
      [&] {
        return QueryInt(db, "SELECT COUNT(*)" + of_incident + " AND state = 'pending'") == 0 &&
               QueryInt(db, "SELECT COUNT(*)" + of_incident) > 0;
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
    CHECK(QueryInt(db, "SELECT COUNT(*)" + of_run) == 4000);
    CHECK(QueryInt(db, "SELECT COUNT(DISTINCT step)" + of_run) == 4000);
    CHECK(QueryInt(db, "SELECT MAX(step)" + of_run) == 3999);
    CHECK(QueryInt(db, "SELECT COUNT(*)" + of_run + " AND late = 1") == 0);
  }
  CHECK(QueryInt(db, "SELECT COUNT(*) FROM incidents WHERE tier = 3") == 1);
  CHECK(QueryInt(db, "SELECT COUNT(*)" + of_incident + " AND kind LIKE 'trigger:%'") == 1);
  const std::string pub = "I-" + std::to_string(incident);
  size_t delivered = 0;
  for (const HttpReceiver::Request& r : rx.requests()) {
    delivered += r.body.find("\"incident_id\":\"" + pub + "\"") != std::string::npos;
  }
  CHECK(delivered == static_cast<size_t>(QueryInt(db, "SELECT COUNT(*)" + of_incident)));
}

// docs/reliability.md's disk-full episode: one agent (default configuration and a
// spill folder) streams 20,000 steps, the disk is full (2 MB quota, filled by
// another process) from step 400 to 12,000 with a NaN at 9,000, then space
// is freed with trainwatchd still running. Prints what was acknowledged and
// stored. Hidden (not in make test, the chaos test covers the same path):
//   build/bin/integration_test "[.disk_full_episode]"
TEST_CASE("disk full episode: 20000 steps - the store full from 400 to 12000",
          "[.disk_full_episode]") {
  const int64_t kSteps = 20'000, kFullFrom = 400, kFullTo = 12'000, kNan = 9'000;
  TempDir dir;
  const std::string listen = "127.0.0.1:" + std::to_string(testing::FreePort());
  const std::string log = dir.File("trainwatchd.log");
  auto d = std::make_unique<Trainwatchd>(
      dir, "", "", std::vector<std::string>{"--listen", listen, "--db_max_bytes", "2097152"});
  const std::string db = d->db();
  const auto t0 = std::chrono::steady_clock::now();
  // A spill folder: past memory_records (16,384) the agent's own bound would
  // drop records while the server is unavailable, which is not what is
  // measured here.
  Trainer t(listen, "disk-full", dir.File("spill"), kNan, 0);
  t.StepTo(kFullFrom - 1);
  REQUIRE(testing::WaitUntil([&] { return t.durable() == kFullFrom - 1; },
                             std::chrono::seconds(20)));
  FillDisk(db, 8);
  auto failed_batches = [&] {
    const std::string text = testing::ReadFile(log);
    size_t n = 0;
    for (size_t at = text.find("store write failed"); at != std::string::npos;
         at = text.find("store write failed", at + 1)) {
      ++n;
    }
    return n;
  };
  t.StepTo(kFullTo - 1);
  // Full long enough for every record up to kFullTo to meet the full store,
  // several times over (the agent's reconnects back off: 0.1, 0.2, 0.4 s).
  testing::WaitUntil([&] { return failed_batches() >= 4; }, std::chrono::seconds(10),
                     std::chrono::milliseconds(20));
  const int64_t acked_while_full = t.durable();
  FreeDisk(db);
  t.StepTo(kSteps - 1);
  const bool all_acked = testing::WaitUntil([&] { return t.durable() == kSteps - 1; },
                                            std::chrono::seconds(60));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t.agent->Close(5000);
  const agent::AgentStats st = t.agent->Stats();
  const size_t failed = failed_batches();
  d.reset();
  const int64_t acked = st.durable_step + 1;
  const int64_t stored = QueryInt(db, "SELECT COUNT(DISTINCT step) FROM steps WHERE step <= " +
                                       std::to_string(st.durable_step));
  const int64_t rows = QueryInt(db, "SELECT COUNT(*) FROM steps");
  const int64_t nan_incidents = QueryInt(
      db, "SELECT COUNT(*) FROM incidents WHERE tier = 3 AND detection_step = " +
              std::to_string(kNan));
  std::printf(
      "disk-full episode: %lld steps, store full from step %lld to %lld (2 MB quota, "
      "filled by another process, then freed), NaN at step %lld\n"
      "  acked %lld (durable step %lld; %lld while full), stored %lld, missing %lld, "
      "duplicates %lld, NaN incident opened: %s\n"
      "  failed batches %zu, agent reconnects %lld, records dropped %lld, %.1f s\n",
      static_cast<long long>(kSteps), static_cast<long long>(kFullFrom),
      static_cast<long long>(kFullTo), static_cast<long long>(kNan),
      static_cast<long long>(acked), static_cast<long long>(st.durable_step),
      static_cast<long long>(acked_while_full + 1), static_cast<long long>(stored),
      static_cast<long long>(acked - stored), static_cast<long long>(rows - stored),
      nan_incidents == 1 ? "yes" : "NO", failed, static_cast<long long>(st.reconnects),
      static_cast<long long>(st.records_dropped), seconds);
  CHECK(all_acked);
  CHECK(failed >= 4);
  CHECK(acked == kSteps);
  CHECK(stored == acked);
  CHECK(rows == stored);
  CHECK(nan_incidents == 1);
  CHECK(st.records_dropped == 0);
}

}  // namespace
}  // namespace trainwatch::server
