// The store's migrations alone, on an in-memory database: a fresh database
// reaches the latest version, an older one is upgraded in place, a second
// run changes nothing, and a failing migration leaves the version as it was.

#include "store/store_migrations.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "memory_db.h"
#include "store/store_decision_rows.h"
#include "store/store_step_rows.h"

namespace trainwatch::server {
namespace {

using testing::MemoryDb;

// Every table and index definition, in a fixed order.
std::string Schema(const MemoryDb& db) {
  sqlite3_stmt* stmt = nullptr;
  std::string out;
  sqlite3_prepare_v2(db.get(), "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name",
                     -1, &stmt, nullptr);
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    out += reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    out += "\n";
  }
  sqlite3_finalize(stmt);
  return out;
}

int64_t HasIndex(const MemoryDb& db, const std::string& name) {
  return db.Int("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = '" + name +
                "'");
}

TEST_CASE("store migrations: a fresh database reaches the latest version", "[server][store]") {
  MemoryDb db;
  auto version = MigrateSchema(db.get());
  REQUIRE(version.ok());
  CHECK(*version == 12);
  CHECK(*version == static_cast<int>(SchemaMigrations().size()));
  CHECK(db.Int("PRAGMA user_version") == 12);
  for (const char* table :
       {"runs", "steps", "rank_steps", "checkpoints", "incidents", "events", "flagged_shards",
        "quarantined_shards", "commands", "command_acks", "decisions", "outbox", "attempts",
        "incarnations", "engine_snapshots", "run_rules", "run_attachments"}) {
    INFO(table);
    CHECK(
        db.Int(std::string("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '") +
               table + "'") == 1);
  }
  CHECK(HasIndex(db, "outbox_once") == 1);
}

TEST_CASE("store migrations: an older database is upgraded and keeps its rows", "[server][store]") {
  MemoryDb db;
  // A version-1 database, as the first release wrote it.
  auto v1 = MigrateSchema(db.get(), SchemaMigrations().first(1));
  REQUIRE(v1.ok());
  CHECK(*v1 == 1);
  CHECK(db.Int("PRAGMA user_version") == 1);
  CHECK(HasIndex(db, "outbox_once") == 0);
  REQUIRE(db.Exec("INSERT INTO runs (run_id, world_size, created_ms, last_seen_ms) "
                  "VALUES ('r', 2, 1, 1)") == SQLITE_OK);

  auto latest = MigrateSchema(db.get());
  REQUIRE(latest.ok());
  CHECK(*latest == 12);
  CHECK(db.Int("PRAGMA user_version") == 12);
  CHECK(HasIndex(db, "outbox_once") == 1);
  CHECK(db.Int("SELECT world_size FROM runs WHERE run_id = 'r'") == 2);
  // Migration 5: a run from before incarnations has none, and no resume step.
  CHECK(db.Int("SELECT COUNT(*) FROM runs WHERE run_id = 'r' AND incarnation = '' AND "
               "resume_step IS NULL") == 1);

  // The upgraded schema is the one a fresh database gets.
  MemoryDb fresh;
  REQUIRE(MigrateSchema(fresh.get()).ok());
  CHECK(Schema(db) == Schema(fresh));
}

TEST_CASE("store migrations: 3 keys acknowledgements by run and drops forged ones",
          "[server][store]") {
  MemoryDb db;
  REQUIRE(MigrateSchema(db.get(), SchemaMigrations().first(2)).ok());
  REQUIRE(db.Exec("INSERT INTO commands (id, run_id, incident_id, kind, payload, created_ms) "
                  "VALUES ('C-1', 'a', 1, 'rollback', x'00', 1)") == SQLITE_OK);
  // Run b's agent acknowledged run a's command, and one never issued.
  REQUIRE(db.Exec("INSERT INTO command_acks VALUES ('C-1', 'a', 0, 1, '', 5, 2), "
                  "('C-1', 'b', 1, 1, '', 5, 1), ('C-9', 'b', 0, 1, '', 5, 1)") == SQLITE_OK);
  REQUIRE(MigrateSchema(db.get()).ok());
  CHECK(db.Int("SELECT COUNT(*) FROM command_acks") == 1);
  CHECK(db.Int("SELECT COUNT(*) FROM command_acks WHERE run_id = 'a' AND rank = 0") == 1);
  // The same (command, rank, status) from two runs: both kept, apart.
  REQUIRE(db.Exec("INSERT INTO command_acks VALUES ('C-1', 'b', 0, 1, '', 5, 3)") == SQLITE_OK);
}

TEST_CASE("store migrations: 4 adds shard names and rows from before read with none",
          "[server][store][shards]") {
  MemoryDb db;
  REQUIRE(MigrateSchema(db.get(), SchemaMigrations().first(3)).ok());
  REQUIRE(db.Exec("INSERT INTO quarantined_shards (run_id, first_shard, last_shard, incident_id, "
                  "decision_id, created_ms) VALUES ('r', 4, 8, 1, 1, 1)") == SQLITE_OK);
  REQUIRE(MigrateSchema(db.get()).ok());
  auto q = rows::Quarantines(db.get(), "r");
  REQUIRE(q.ok());
  REQUIRE(q->size() == 1);
  CHECK((*q)[0].name.empty());  // a range, as it was
  CHECK((*q)[0].first == 4);
  CHECK(db.Int("SELECT COUNT(*) FROM pragma_table_info('steps') WHERE name = 'shard_names'") == 1);
  CHECK(db.Int("SELECT COUNT(*) FROM pragma_table_info('incidents') WHERE name = "
               "'shard_names'") == 1);
}

// SQLite virtual-machine instructions that `body` runs on `db`, in
// thousands: the progress handler is called once per 1,000.
template <typename F>
int64_t KiloInstructions(const MemoryDb& db, F body) {
  int64_t calls = 0;
  sqlite3_progress_handler(
      db.get(), 1000,
      [](void* n) {
        ++*static_cast<int64_t*>(n);
        return 0;
      },
      &calls);
  body();
  sqlite3_progress_handler(db.get(), 0, nullptr, nullptr);
  return calls;
}

TEST_CASE("store migrations: 10 counts a run's skips and overflows without reading its history",
          "[server][store][restart]") {
  MemoryDb db;
  REQUIRE(MigrateSchema(db.get()).ok());
  // 200k steps of run r, one in 50,000 skipped and one overflowed, a late
  // skip that does not count, and a second run whose skips are its own.
  REQUIRE(db.Exec("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < "
                  "200000) INSERT INTO steps (run_id, attempt, step, present, decision, "
                  "received_ms, loss_scale, loss_scale_overflow) SELECT 'r', 0, i, 0, "
                  "i % 50000 = 0, 0, 1.0, i % 50000 = 7 FROM n") == SQLITE_OK);
  REQUIRE(db.Exec("INSERT INTO steps (run_id, attempt, step, present, decision, received_ms, "
                  "late) VALUES ('r', 0, 200001, 0, 1, 0, 1), ('s', 0, 1, 0, 1, 0, 0)") ==
          SQLITE_OK);
  absl::StatusOr<int64_t> skipped, overflows;
  const int64_t cost = KiloInstructions(db, [&] {
    skipped = rows::CountSkipped(db.get(), "r", 0);
    overflows = rows::CountLossScaleOverflows(db.get(), "r", 0);
  });
  REQUIRE(skipped.ok());
  REQUIRE(overflows.ok());
  CHECK(*skipped == 4);
  CHECK(*overflows == 4);
  // A scan of the 200k rows runs millions of instructions; the partial
  // indexes' eight entries a few hundred.
  CHECK(cost < 5);
  const int64_t scan = KiloInstructions(db, [&] {
    CHECK(db.Int("SELECT COUNT(*) FROM steps NOT INDEXED WHERE run_id = 'r' AND attempt = 0 AND "
                 "decision = 1 AND late = 0") == 4);
  });
  INFO("a scan: " << scan << "k instructions, the counts: " << cost << "k");
  CHECK(scan > 100 * (cost + 1));
}

TEST_CASE("store migrations: 11 moves rank reports and rules and keeps every row",
          "[server][store]") {
  MemoryDb db;
  REQUIRE(MigrateSchema(db.get(), SchemaMigrations().first(10)).ok());
  REQUIRE(db.Exec("INSERT INTO runs (run_id, world_size, created_ms, last_seen_ms, last_step, "
                  "rules_json, rules_source) VALUES ('r', 2, 1, 1, 7, '{\"a\": 1}', 'hello'), "
                  "('old', 1, 1, 1, 3, '', '')") == SQLITE_OK);
  REQUIRE(db.Exec("INSERT INTO rank_steps (run_id, attempt, rank, step, report) VALUES "
                  "('r', 0, 1, 5, x'01'), ('r', 0, 0, 5, x'00'), ('r', 0, 0, 6, x'02')") ==
          SQLITE_OK);
  REQUIRE(MigrateSchema(db.get()).ok());
  auto runs = rows::Runs(db.get());
  REQUIRE(runs.ok());
  REQUIRE(runs->size() == 2);
  CHECK((*runs)[0].run_id == "old");
  CHECK((*runs)[0].rules_json.empty());
  CHECK((*runs)[1].run_id == "r");
  CHECK((*runs)[1].last_step == 7);
  CHECK((*runs)[1].rules_json == "{\"a\": 1}");
  CHECK((*runs)[1].rules_source == "hello");
  auto at5 = rows::RankStepsAt(db.get(), "r", 0, 5);
  REQUIRE(at5.ok());
  REQUIRE(at5->size() == 2);
  CHECK((*at5)[0].rank == 0);
  CHECK((*at5)[0].report == std::string(1, '\0'));
  CHECK((*at5)[1].report == "\x01");
  // Still one report per (run, attempt, step, rank): a re-send is ignored.
  REQUIRE(rows::InsertRankSteps(db.get(), {{"r", 0, 1, 5, "again"}}).ok());
  CHECK(db.Int("SELECT COUNT(*) FROM rank_steps") == 3);
  CHECK(HasIndex(db, "rank_steps_key") == 1);
}

TEST_CASE("store migrations: running twice is a no-op", "[server][store]") {
  MemoryDb db;
  REQUIRE(MigrateSchema(db.get()).ok());
  const std::string before = Schema(db);
  auto again = MigrateSchema(db.get());
  REQUIRE(again.ok());
  CHECK(*again == 12);
  CHECK(Schema(db) == before);
}

TEST_CASE("store migrations: a newer database is refused untouched", "[server][store]") {
  MemoryDb db;
  REQUIRE(db.Exec("PRAGMA user_version=13") == SQLITE_OK);
  auto version = MigrateSchema(db.get());
  REQUIRE_FALSE(version.ok());
  CHECK(version.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(db.Int("PRAGMA user_version") == 13);
  CHECK(db.Int("SELECT COUNT(*) FROM sqlite_master") == 0);
}

TEST_CASE("store migrations: a failing migration rolls back and keeps the version",
          "[server][store]") {
  MemoryDb db;
  const std::vector<const char*> migrations = {
      "CREATE TABLE a (x INTEGER);",
      "CREATE TABLE b (x INTEGER); CREATE TABLE a (y INTEGER);",  // a exists: fails
  };
  auto version = MigrateSchema(db.get(), migrations);
  REQUIRE_FALSE(version.ok());
  CHECK(std::string(version.status().message()).find("migration 2: ") == 0);
  CHECK(db.Int("PRAGMA user_version") == 1);  // the first one stays applied
  CHECK(db.Int("SELECT COUNT(*) FROM sqlite_master WHERE name = 'b'") == 0);
  CHECK(sqlite3_get_autocommit(db.get()) != 0);
}

}  // namespace
}  // namespace trainwatch::server
