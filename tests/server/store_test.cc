// The store: migrations, one-transaction batches, deduplication, reads.

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include "test_util.h"
#include "store/sqlite_store.h"
#include "store/store.h"

namespace trainwatch::server {
namespace {

using testing::TempDir;

StepRow MakeStep(int64_t step, double loss) {
  StepRow s;
  s.step = step;
  s.Set(core::Signal::kLoss, loss);
  s.Set(core::Signal::kGradNorm, 1.0);
  s.loss_ema_ratio = 1.0;
  s.shards = {7, static_cast<uint64_t>(step)};
  s.received_ms = 1000 + step;
  return s;
}

TEST_CASE("store: migrates - writes a batch - deduplicates and reads back", "[server][store]") {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  {
    auto store = Store::Open(db);
    REQUIRE(store.ok());
    CHECK((*store)->schema_version() == 12);
    WriteBatch b;
    b.runs.push_back({"run-a", 4, 0, 2, 1, 2, "", std::nullopt});
    for (int64_t s = 0; s < 3; ++s) b.steps.push_back({"run-a", 0, MakeStep(s, 2.5 - 0.1 * s)});
    StepRow nan_step = MakeStep(3, 0);
    nan_step.Set(core::Signal::kLoss, std::nan(""));
    b.steps.push_back({"run-a", 0, nan_step});
    b.checkpoints.push_back({"run-a", 2, "ckpt://a/2", 5});
    IncidentRow inc;
    inc.id = 1;
    inc.run_id = "run-a";
    inc.episode = 3;
    inc.tier = 2;
    inc.state = IncidentState::kAwaitingDecision;
    inc.title = "tier 2";
    inc.shards = {10, 11};
    inc.actions.clear();
    b.incidents.push_back(inc);
    REQUIRE((*store)->Write(b).ok());
    // The same steps again (a re-send): ignored, not an error.
    WriteBatch again;
    again.steps.push_back({"run-a", 0, MakeStep(1, 9.9)});
    REQUIRE((*store)->Write(again).ok());
    auto count = (*store)->CountSteps("run-a");
    REQUIRE(count.ok());
    CHECK(*count == 4);
  }
  auto store = Store::Open(db);  // reopen: no migration twice
  REQUIRE(store.ok());
  auto runs = (*store)->LoadRuns();
  REQUIRE(runs.ok());
  REQUIRE(runs->size() == 1);
  CHECK((*runs)[0].world_size == 4);
  std::vector<StepRow> seen;
  std::vector<std::string> ckpts;
  REQUIRE((*store)
              ->ForEachStep("run-a", 0,
                            [&](const StepRow& s, const std::string& c) {
                              seen.push_back(s);
                              ckpts.push_back(c);
                            })
              .ok());
  REQUIRE(seen.size() == 4);
  CHECK(seen[1].Get(core::Signal::kLoss) == Approx(2.4));  // the first write won
  CHECK(seen[1].shards == std::vector<uint64_t>{7, 1});
  CHECK(ckpts[2] == "ckpt://a/2");
  CHECK(seen[3].Has(core::Signal::kLoss));  // a reported NaN stays reported
  CHECK(std::isnan(seen[3].Get(core::Signal::kLoss)));
  CHECK_FALSE(seen[0].Has(core::Signal::kLogZ));
  auto inc = (*store)->GetIncident(1);
  REQUIRE(inc.ok());
  REQUIRE(inc->has_value());
  CHECK((*inc)->state == IncidentState::kAwaitingDecision);
  auto flagged = (*store)->FlaggedShards("run-a");
  REQUIRE(flagged.ok());
  CHECK(flagged->size() == 2);
  IncidentFilter open;
  open.open_only = true;
  auto list = (*store)->ListIncidents(open);
  REQUIRE(list.ok());
  CHECK(list->size() == 1);
}

TEST_CASE("store: a step's shard list reads back whole at every length", "[server][store]") {
  // Short lists are formatted on the stack, long ones (past 256 bytes of
  // text) as a string of their own: both must store the same text.
  TempDir dir;
  auto store = Store::Open(dir.File("tw.db"));
  REQUIRE(store.ok());
  WriteBatch b;
  std::vector<std::vector<uint64_t>> lists;
  for (size_t n = 0; n <= 40; ++n) {
    std::vector<uint64_t> shards;
    for (size_t k = 0; k < n; ++k) shards.push_back(k % 3 == 0 ? UINT64_MAX - k : k * 1000003);
    StepRow s = MakeStep(static_cast<int64_t>(n), 1.0);
    s.shards = shards;
    lists.push_back(shards);
    b.steps.push_back({"run-s", 0, s});
  }
  REQUIRE((*store)->Write(b).ok());
  std::vector<std::vector<uint64_t>> seen;
  REQUIRE((*store)
              ->ForEachStep("run-s", 0,
                            [&](const StepRow& s, const std::string&) { seen.push_back(s.shards); })
              .ok());
  CHECK(seen == lists);
}

TEST_CASE("store: refuses a database from a newer version", "[server][store]") {
  TempDir dir;
  const std::string path = dir.File("tw.db");
  REQUIRE(Store::Open(path).ok());
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  REQUIRE(sqlite3_exec(db, "PRAGMA user_version=99", nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(db);
  auto again = Store::Open(path);
  REQUIRE_FALSE(again.ok());
  CHECK(std::string(again.status().message()).find("newer than this trainwatchd") !=
        std::string::npos);
}

int64_t PageSize(const std::string& path) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  REQUIRE(sqlite3_prepare_v2(db, "PRAGMA page_size", -1, &q, nullptr) == SQLITE_OK);
  REQUIRE(sqlite3_step(q) == SQLITE_ROW);
  const int64_t size = sqlite3_column_int64(q, 0);
  sqlite3_finalize(q);
  sqlite3_close(db);
  return size;
}

// Why 8 KiB: store.cc (the writer's CPU per appended row against the bytes
// each commit writes).
TEST_CASE("store: a new database has 8 KiB pages - an existing one keeps its own",
          "[server][store]") {
  TempDir dir;
  const std::string fresh = dir.File("fresh.db");
  REQUIRE(Store::Open(fresh).ok());
  CHECK(PageSize(fresh) == 8192);

  // A database made with SQLite's default pages, in WAL mode, as every
  // trainwatchd before this page size made them.
  const std::string old = dir.File("old.db");
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(old.c_str(), &db) == SQLITE_OK);
  REQUIRE(sqlite3_exec(db, "PRAGMA page_size=4096; PRAGMA journal_mode=WAL; CREATE TABLE t (x)",
                       nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(db);
  {
    auto store = Store::Open(old);
    REQUIRE(store.ok());
    WriteBatch b;
    RunRow run;
    run.run_id = "run-a";
    run.last_step = 499;
    b.runs.push_back(run);
    for (int64_t s = 0; s < 500; ++s) b.steps.push_back({"run-a", 0, MakeStep(s, 2.0)});
    REQUIRE((*store)->Write(b).ok());
    auto count = (*store)->CountSteps("run-a");
    REQUIRE(count.ok());
    CHECK(*count == 500);
  }
  CHECK(PageSize(old) == 4096);
}

// A batch of `rows` rank reports of `bytes` each: WAL pages without much CPU.
WriteBatch BigReports(int64_t first_step, int rows, size_t bytes) {
  WriteBatch b;
  for (int i = 0; i < rows; ++i) {
    b.rank_steps.push_back({"run-a", 0, 0, first_step + i, std::string(bytes, 'x')});
  }
  return b;
}

int64_t FileBytes(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(n);
}

TEST_CASE("store: WAL checkpoints run off the writer's commits - the WAL stays bounded",
          "[server][store]") {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  auto store = SqliteStore::Open(db, {StoreOptions::Synchronous::kNormal});
  REQUIRE(store.ok());
  // 30 commits of 1 MB, 3,900 pages in all: SQLite's own checkpoint would
  // have run three times inside a commit. Spaced as a steady rate spaces
  // them, so that a checkpoint beside them finishes between two: waiting
  // for the checkpointer rather than sleeping, since on a loaded machine
  // its thread may not run within any fixed sleep (the WAL reached 33 MB).
  int64_t wal_max = 0;
  for (int c = 0; c < 30; ++c) {
    REQUIRE((*store)->Write(BigReports(c * 16, 16, 64 * 1024)).ok());
    wal_max = std::max(wal_max, FileBytes(db + "-wal"));
    (*store)->AwaitBackgroundCheckpoint();
  }
  CHECK((*store)->background_checkpoints() >= 1);
  CHECK((*store)->writer_checkpoints() == 0);
  // Without checkpoints the WAL would hold all 30 MB; each one lets the
  // next commit start it over.
  CHECK(wal_max < 20 * 1024 * 1024);
  CHECK(FileBytes(db) > 10 * 1024 * 1024);  // the pages reached the database
  auto rows = (*store)->RankStepsAt("run-a", 0, 479);
  REQUIRE(rows.ok());
  CHECK(rows->size() == 1);
}

TEST_CASE("store: a WAL past 8000 pages is checkpointed by the writer itself",
          "[server][store]") {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  auto store = SqliteStore::Open(db, {StoreOptions::Synchronous::kNormal});
  REQUIRE(store.ok());
  // One commit of 66 MB: no checkpoint beside it can keep the WAL under the
  // bound, so the commit that crosses it checkpoints, as SQLite's would.
  REQUIRE((*store)->Write(BigReports(0, 1056, 64 * 1024)).ok());
  CHECK((*store)->writer_checkpoints() == 1);
  REQUIRE((*store)->Write(BigReports(2000, 1, 1024)).ok());
  CHECK(FileBytes(db + "-wal") < 80 * 1024 * 1024);
}

TEST_CASE("store: a path that cannot be opened is a clear error", "[server][store]") {
  auto s = Store::Open("/nonexistent/dir/tw.db");
  REQUIRE_FALSE(s.ok());
  CHECK(std::string(s.status().message()).find("cannot open database") != std::string::npos);
}

}  // namespace
}  // namespace trainwatch::server
