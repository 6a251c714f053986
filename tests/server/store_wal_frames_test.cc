// What a durable acknowledgement waits for is its batch's commit, and in WAL
// mode a commit writes and syncs every page it dirtied: these cases count
// the pages (WAL frames) that the per-batch writes of a cluster's streams
// dirty, on the schema before migration 11 and on the latest.

#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "store/sql_statement.h"
#include "store/store_migrations.h"
#include "store/store_step_rows.h"
#include "testing/temp_dir.h"

namespace trainwatch::server {
namespace {

// A file database in WAL mode that counts the frames each commit appends.
// The hook replaces the automatic checkpoint, so the WAL only grows and the
// count per commit is exact.
class WalDb {
 public:
  WalDb() : dir_("tw_pages_test_") {
    REQUIRE(!dir_.path().empty());
    REQUIRE(sqlite3_open((dir_.path() + "/tw.db").c_str(), &db_) == SQLITE_OK);
    REQUIRE(Exec(db_, "PRAGMA journal_mode=WAL").ok());
    sqlite3_wal_hook(db_, &WalDb::OnCommit, this);
  }
  ~WalDb() { sqlite3_close(db_); }
  sqlite3* get() const { return db_; }
  // Frames appended since the last call.
  int TakeFrames() {
    const int n = frames_ - taken_;
    taken_ = frames_;
    return n;
  }

 private:
  static int OnCommit(void* self, sqlite3*, const char*, int frames) {
    static_cast<WalDb*>(self)->frames_ = frames;
    return SQLITE_OK;
  }
  testing::ScopedTempDir dir_;  // first: it goes after the database closes
  sqlite3* db_ = nullptr;
  int frames_ = 0;
  int taken_ = 0;
};

// 8 runs x 8 ranks, `per_commit` steps of every rank per commit, as the
// ingest writer batches them at a steady rate; reports of a typical size.
int RankStepFrames(sqlite3* db, int commits, int per_commit, WalDb& wal) {
  const std::string report(110, 'r');
  int64_t step = 0;
  for (int c = 0; c < commits; ++c) {
    std::vector<RankStepRow> rows;
    for (int s = 0; s < per_commit; ++s, ++step) {
      for (int run = 0; run < 8; ++run) {
        for (int rank = 0; rank < 8; ++rank) {
          rows.push_back({"cluster-run-" + std::to_string(run), 0, rank, step, report});
        }
      }
    }
    REQUIRE(InTransaction(db, [&] { return rows::InsertRankSteps(db, rows); }).ok());
  }
  return wal.TakeFrames();
}

TEST_CASE("store pages: rank reports dirty a quarter fewer pages than before migration 11",
          "[server][store]") {
  WalDb before;
  REQUIRE(MigrateSchema(before.get(), SchemaMigrations().first(10)).ok());
  WalDb latest;
  REQUIRE(MigrateSchema(latest.get()).ok());
  before.TakeFrames();
  latest.TakeFrames();
  // Warm: the tables past their first pages, as in a run under way.
  RankStepFrames(before.get(), 100, 2, before);
  RankStepFrames(latest.get(), 100, 2, latest);
  const int old_frames = RankStepFrames(before.get(), 200, 2, before);
  const int new_frames = RankStepFrames(latest.get(), 200, 2, latest);
  INFO("frames per commit of 128 reports: " << old_frames / 200.0 << " before, "
                                            << new_frames / 200.0 << " now");
  // Measured: 20.9 frames a commit before, 14.6 now (8 index leaves, about 5
  // data pages, the index's splits). Traffic whose ranks arrive out of order
  // gains more: 26 pages a commit fell to 18 under the ingest bench's load.
  CHECK(new_frames * 4 < old_frames * 3);
  CHECK(new_frames < 200 * 16);
}

TEST_CASE("store pages: a batch rewrites the runs' rows and not their rules",
          "[server][store]") {
  WalDb db;
  REQUIRE(MigrateSchema(db.get()).ok());
  std::vector<RunRow> runs(8);
  for (int i = 0; i < 8; ++i) {
    runs[i].run_id = "cluster-run-" + std::to_string(i);
    runs[i].world_size = 8;
    runs[i].rules_json = std::string(3000, 'j');  // a RuleConfig's JSON is about 3 KB
    runs[i].rules_source = "server";
  }
  REQUIRE(InTransaction(db.get(), [&] { return rows::UpsertRuns(db.get(), runs); }).ok());
  db.TakeFrames();
  for (int batch = 0; batch < 20; ++batch) {
    for (RunRow& r : runs) r.last_step += 100;
    REQUIRE(InTransaction(db.get(), [&] { return rows::UpsertRuns(db.get(), runs); }).ok());
  }
  // The 8 progress rows share a page; the 24 KB of rules stay where they were.
  CHECK(db.TakeFrames() <= 20 * 2);
  auto read = rows::Runs(db.get());
  REQUIRE(read.ok());
  REQUIRE(read->size() == 8);
  CHECK((*read)[0].last_step == 1999);
  CHECK((*read)[0].rules_json == runs[0].rules_json);
  CHECK((*read)[0].rules_source == "server");

  // A change of rules is written.
  runs[3].rules_json = "{}";
  runs[3].rules_source = "operator";
  REQUIRE(InTransaction(db.get(), [&] { return rows::UpsertRuns(db.get(), runs); }).ok());
  read = rows::Runs(db.get());
  REQUIRE(read.ok());
  CHECK((*read)[3].rules_json == "{}");
  CHECK((*read)[3].rules_source == "operator");
  CHECK((*read)[2].rules_json == runs[2].rules_json);
}

}  // namespace
}  // namespace trainwatch::server
