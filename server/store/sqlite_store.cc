#include "store/sqlite_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "store/sql_statement.h"
#include "store/store_decision_rows.h"
#include "store/store_incident_rows.h"
#include "store/store_migrations.h"
#include "store/store_outbox_rows.h"
#include "store/store_snapshot_rows.h"
#include "store/store_step_rows.h"

namespace trainwatch::server {

namespace {

absl::StatusOr<sqlite3*> OpenConnection(const std::string& path, const StoreOptions& options) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    absl::Status s = absl::UnavailableError(
        absl::StrCat("cannot open database ", path, ": ", db ? sqlite3_errmsg(db) : "no memory"));
    sqlite3_close(db);
    return s;
  }
  sqlite3_busy_timeout(db, options.busy_timeout_ms);
  // WAL: readers never block the writer. synchronous: what a commit waits
  // for, which is what an acknowledgement promises (store.h).
  const char* synchronous = options.synchronous == StoreOptions::Synchronous::kNormal
                                ? "PRAGMA synchronous=NORMAL"
                                : "PRAGMA synchronous=FULL";
  // cache_size: a batch of thousands of steps dirties more pages than
  // SQLite's default 2 MB cache holds, and a full cache spills dirty pages
  // to the WAL in the middle of the transaction, to be written again at its
  // commit. 16 MB per connection (a negative size is KiB).
  // page_size: 8 KiB for a new database (an existing one keeps the size it
  // was made with: WAL mode cannot change it). Two costs pull apart:
  // - a batch appends thousands of step rows, and with SQLite's 4 KiB pages
  //   the writer pays a b-tree split and two pwrite calls for every few
  //   dozen rows: larger pages cost it less CPU;
  // - every commit writes each page it dirtied whole into the WAL, and at a
  //   cluster's steady rate a commit holds a few dozen records spread over
  //   a page or two per run: larger pages write more bytes per record.
  // 8 KiB keeps most of the larger pages' CPU saving at a fraction of their
  // disk writes (make bench: ingest).
  for (const char* pragma : {"PRAGMA page_size=8192", "PRAGMA journal_mode=WAL", synchronous,
                             "PRAGMA foreign_keys=ON", "PRAGMA temp_store=MEMORY",
                             "PRAGMA cache_size=-16384"}) {
    if (absl::Status s = Exec(db, pragma); !s.ok()) {
      sqlite3_close(db);
      return s;
    }
  }
  if (options.max_bytes > 0) {
    // Per connection, not stored in the file: the quota is the flag's,
    // checked again at every start.
    absl::StatusOr<int64_t> page_size;
    {
      SqlStatement q(db, "PRAGMA page_size");
      page_size = QueryInt(q);
    }
    absl::Status s = page_size.status();
    if (s.ok()) {
      const int64_t pages =
          std::max<int64_t>(1, options.max_bytes / std::max<int64_t>(1, *page_size));
      s = Exec(db, absl::StrCat("PRAGMA max_page_count=", pages).c_str());
    }
    if (!s.ok()) {
      sqlite3_close(db);
      return s;
    }
  }
  return db;
}

}  // namespace

// Checkpoints the WAL from a thread and connection of its own. SQLite's
// automatic checkpoint runs inside the commit that crosses 1,000 WAL pages,
// on the committing thread: the writer's, whose commit an agent's ack waits
// for. With --db_synchronous normal that checkpoint also fsyncs the WAL
// first, which about doubled the p99 ack at a cluster's steady rate (make
// bench: ingest, paced). A PASSIVE checkpoint runs beside the writer's
// commits (WAL mode allows one of each) and never waits for a lock. Should
// the WAL still outgrow kWriterFrames (the checkpoints falling behind a
// flood), the writer checkpoints too, as SQLite would have: the file stays
// bounded.
class SqliteStore::Checkpointer {
 public:
  static constexpr int kFrames = 1000;        // SQLite's own threshold
  static constexpr int kWriterFrames = 8000;  // 64 MB of 8 KiB pages

  // Takes `own` (a connection for the checkpoints) and hooks `writer`'s
  // commits, replacing its automatic checkpoint.
  Checkpointer(sqlite3* writer, sqlite3* own) : writer_(writer), own_(own) {
    sqlite3_wal_hook(writer_, &Checkpointer::OnCommit, this);
    thread_ = std::thread([this] { Loop(); });
  }
  ~Checkpointer() {
    sqlite3_wal_hook(writer_, nullptr, nullptr);
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
    sqlite3_close(own_);
  }

  int64_t background() const { return background_.load(); }
  int64_t by_writer() const { return by_writer_.load(); }

  void AwaitIdle() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Checkpointer* c) ABSL_SHARED_LOCKS_REQUIRED(c->mu_) {
          return (!c->due_ && !c->running_) || c->stop_;
        },
        this));
  }

 private:
  // On the writer's thread, after each commit; `frames`: the WAL's pages.
  static int OnCommit(void* self, sqlite3* db, const char* schema, int frames) {
    auto* c = static_cast<Checkpointer*>(self);
    if (frames >= kWriterFrames) {
      if (sqlite3_wal_checkpoint_v2(db, schema, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr) ==
          SQLITE_OK) {
        c->by_writer_++;
      }
    } else if (frames >= kFrames) {
      absl::MutexLock lock(&c->mu_);
      c->due_ = true;
    }
    return SQLITE_OK;
  }

  void Loop() {
    int last_rc = SQLITE_OK;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](Checkpointer* c) ABSL_SHARED_LOCKS_REQUIRED(c->mu_) { return c->due_ || c->stop_; },
            this));
        if (stop_) return;
        due_ = false;
        running_ = true;
      }
      const int rc = sqlite3_wal_checkpoint_v2(own_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr,
                                               nullptr);
      if (rc == SQLITE_OK) background_++;
      {
        absl::MutexLock lock(&mu_);
        running_ = false;
      }
      // Logged once per change: a full disk would fail every one of them.
      if (rc != last_rc && rc != SQLITE_OK && rc != SQLITE_BUSY) {
        LOG(WARNING) << "WAL checkpoint failed (" << sqlite3_errstr(rc)
                     << "); the WAL grows until one succeeds";
      }
      last_rc = rc;
    }
  }

  sqlite3* const writer_;
  sqlite3* const own_;
  absl::Mutex mu_;
  bool due_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // a checkpoint in progress
  std::atomic<int64_t> background_{0};
  std::atomic<int64_t> by_writer_{0};
  std::thread thread_;
};

int64_t SqliteStore::background_checkpoints() const { return checkpointer_->background(); }
int64_t SqliteStore::writer_checkpoints() const { return checkpointer_->by_writer(); }
void SqliteStore::AwaitBackgroundCheckpoint() { checkpointer_->AwaitIdle(); }

std::vector<StoreCounter> SqliteStore::Counters() const {
  return {{"trainwatch_store_wal_checkpoints_total",
           "WAL checkpoints run beside the commits, on a thread of their own.",
           background_checkpoints()},
          {"trainwatch_store_writer_checkpoints_total",
           "WAL checkpoints the writer ran inside a commit, the WAL past 8,000 pages: the "
           "checkpoints beside the commits fell behind.",
           writer_checkpoints()}};
}

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path,
                                                               const StoreOptions& options) {
  if (options.max_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("database quota must be >= 0 bytes (0: none), got ", options.max_bytes));
  }
  if (options.busy_timeout_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("busy timeout must be >= 0 ms, got ", options.busy_timeout_ms));
  }
  if (options.engine_snapshots_kept < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine snapshots kept must be >= 1, got ", options.engine_snapshots_kept));
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore());
  store->engine_snapshots_kept_ = options.engine_snapshots_kept;
  absl::StatusOr<sqlite3*> db = OpenConnection(path, options);
  if (!db.ok()) return db.status();
  store->db_ = *db;
  if (absl::Status s = store->Migrate(); !s.ok()) return s;
  store->statements_ = std::make_unique<StatementCache>(store->db_);
  absl::StatusOr<sqlite3*> cdb = OpenConnection(path, options);
  if (!cdb.ok()) return cdb.status();
  store->checkpointer_ = std::make_unique<Checkpointer>(store->db_, *cdb);
  absl::StatusOr<sqlite3*> rdb = OpenConnection(path, options);
  if (!rdb.ok()) return rdb.status();
  absl::MutexLock lock(&store->read_mu_);
  store->read_db_ = *rdb;
  return store;
}

SqliteStore::~SqliteStore() {
  {
    absl::MutexLock lock(&read_mu_);
    sqlite3_close(read_db_);
  }
  statements_.reset();  // finalizes its statements: before the close
  checkpointer_.reset();  // unhooks db_; the last close checkpoints what is left
  sqlite3_close(db_);
}

absl::Status SqliteStore::Migrate() {
  absl::StatusOr<int> version = MigrateSchema(db_);
  if (!version.ok()) return version.status();
  schema_version_ = *version;
  return absl::OkStatus();
}

absl::Status SqliteStore::Write(const WriteBatch& b) {
  if (b.empty()) return absl::OkStatus();
  return InTransaction(db_, [&] {
    // The order is the one batches have always been written in, and it
    // matters where tables meet: the steps go in before the attempt copies,
    // so a copy also takes the old attempt's steps still in this batch.
    // An empty table is skipped: preparing its statement anyway is paid on
    // every commit, and commits are small and many at a steady rate.
    absl::Status s;
    auto write = [&](const auto& table, auto fn) {
      if (s.ok() && !table.empty()) s = fn(db_, table);
    };
    write(b.runs, rows::UpsertRuns);
    write(b.steps, rows::InsertSteps);
    write(b.rank_steps, rows::InsertRankSteps);
    write(b.checkpoints, rows::ReplaceCheckpoints);
    write(b.incidents, rows::UpsertIncidents);
    write(b.events, rows::InsertEvents);
    write(b.command_acks, rows::InsertCommandAcks);
    write(b.attempt_copies, rows::CopyAttempts);
    write(b.incarnations, rows::InsertIncarnations);
    write(b.decisions, rows::InsertDecisions);
    write(b.commands, rows::InsertCommands);
    write(b.quarantines, rows::InsertQuarantines);
    write(b.outbox, rows::InsertOutbox);
    write(b.engine_snapshots, [this](sqlite3* db, const std::vector<EngineSnapshotRow>& t) {
      return rows::InsertEngineSnapshots(db, t, engine_snapshots_kept_);
    });
    return s;
  });
}

// ---- the writer's connection (the writer thread)

absl::StatusOr<std::vector<RunRow>> SqliteStore::LoadRuns() { return rows::Runs(db_); }

absl::Status SqliteStore::ForEachStep(
    const std::string& run_id, int64_t attempt,
    const std::function<void(const StepRow&, const std::string&)>& fn, int64_t after_step) {
  return rows::ForEachStep(db_, run_id, attempt, fn, after_step);
}

absl::StatusOr<std::optional<EngineSnapshotRow>> SqliteStore::LatestEngineSnapshot(
    const std::string& run_id, int64_t attempt, int64_t max_step) {
  return rows::LatestEngineSnapshot(db_, run_id, attempt, max_step);
}

absl::StatusOr<std::vector<RankStepRow>> SqliteStore::LoadRankStepsAfter(const std::string& run_id,
                                                                   int64_t attempt, int64_t step) {
  return rows::RankStepsAfter(db_, run_id, attempt, step);
}

absl::StatusOr<std::vector<std::string>> SqliteStore::Incarnations(const std::string& run_id) {
  return rows::Incarnations(db_, run_id);
}

absl::StatusOr<int64_t> SqliteStore::MaxIncidentId() { return rows::MaxIncidentId(db_); }

absl::StatusOr<int64_t> SqliteStore::MaxDecisionId() { return rows::MaxDecisionId(db_); }

absl::StatusOr<std::optional<DecisionRow>> SqliteStore::FindDecisionByKey(const std::string& key) {
  return rows::FindDecisionByKey(db_, key);
}

absl::StatusOr<std::optional<CommandRow>> SqliteStore::LatestCommand(int64_t incident_id) {
  return rows::LatestCommand(db_, incident_id);
}

absl::StatusOr<std::vector<CommandAckRow>> SqliteStore::CommandAcks(const std::string& run_id,
                                                             const std::string& command_id) {
  return rows::CommandAcks(db_, run_id, command_id);
}

// ---- the read connection (any thread, one at a time)

absl::StatusOr<std::vector<RankStepRow>> SqliteStore::RankStepsAt(const std::string& run_id,
                                                            int64_t attempt, int64_t step) {
  absl::MutexLock lock(&read_mu_);
  return rows::RankStepsAt(read_db_, run_id, attempt, step);
}

absl::StatusOr<std::vector<IncidentRow>> SqliteStore::ListIncidents(const IncidentFilter& filter) {
  absl::MutexLock lock(&read_mu_);
  return rows::ListIncidents(read_db_, filter);
}

absl::StatusOr<std::optional<IncidentRow>> SqliteStore::GetIncident(int64_t id) {
  absl::MutexLock lock(&read_mu_);
  return rows::GetIncident(read_db_, id);
}

absl::StatusOr<std::vector<EventRow>> SqliteStore::EventsOfIncident(int64_t id) {
  absl::MutexLock lock(&read_mu_);
  return rows::EventsOfIncident(read_db_, id);
}

absl::StatusOr<std::vector<StepRow>> SqliteStore::RecentSteps(const std::string& run_id,
                                                           int64_t attempt, int limit) {
  absl::MutexLock lock(&read_mu_);
  return rows::RecentSteps(read_db_, run_id, attempt, limit);
}

absl::StatusOr<std::vector<StepRow>> SqliteStore::StepsBetween(const std::string& run_id,
                                                            int64_t attempt, int64_t first,
                                                            int64_t last) {
  absl::MutexLock lock(&read_mu_);
  return rows::StepsBetween(read_db_, run_id, attempt, first, last);
}

absl::StatusOr<std::vector<CheckpointRow>> SqliteStore::Checkpoints(const std::string& run_id) {
  absl::MutexLock lock(&read_mu_);
  return rows::Checkpoints(read_db_, run_id);
}

absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> SqliteStore::FlaggedShards(
    const std::string& run_id) {
  absl::MutexLock lock(&read_mu_);
  return rows::FlaggedShards(read_db_, run_id);
}

absl::StatusOr<int64_t> SqliteStore::CountSteps(const std::string& run_id) {
  absl::MutexLock lock(&read_mu_);
  return rows::CountSteps(read_db_, run_id);
}

absl::StatusOr<std::vector<AttemptRow>> SqliteStore::Attempts(const std::string& run_id,
                                                       int64_t current) {
  absl::MutexLock lock(&read_mu_);
  return rows::Attempts(read_db_, run_id, current);
}

absl::StatusOr<int64_t> SqliteStore::CountSkipped(const std::string& run_id, int64_t attempt) {
  absl::MutexLock lock(&read_mu_);
  return rows::CountSkipped(read_db_, run_id, attempt);
}

absl::StatusOr<int64_t> SqliteStore::CountLossScaleOverflows(const std::string& run_id,
                                                       int64_t attempt) {
  absl::MutexLock lock(&read_mu_);
  return rows::CountLossScaleOverflows(read_db_, run_id, attempt);
}

absl::StatusOr<std::vector<DecisionRow>> SqliteStore::DecisionsOfIncident(int64_t incident_id) {
  absl::MutexLock lock(&read_mu_);
  return rows::DecisionsOfIncident(read_db_, incident_id);
}

absl::StatusOr<std::vector<QuarantineRow>> SqliteStore::Quarantines(const std::string& run_id) {
  absl::MutexLock lock(&read_mu_);
  return rows::Quarantines(read_db_, run_id);
}

absl::StatusOr<std::vector<OutboxRow>> SqliteStore::DueOutbox(int64_t now_ms, int limit) {
  absl::MutexLock lock(&read_mu_);
  return rows::DueOutbox(read_db_, now_ms, limit);
}

absl::StatusOr<std::vector<OutboxRow>> SqliteStore::Outbox(int64_t incident_id) {
  absl::MutexLock lock(&read_mu_);
  return rows::OutboxOfIncident(read_db_, incident_id);
}

absl::Status SqliteStore::MarkOutbox(int64_t id, bool sent, int attempts, int64_t next_attempt_ms,
                               const std::string& error, int64_t now_ms) {
  // The pager's own connection would be a third writer; the read connection
  // under its mutex serialises with the other queries, and WAL orders it
  // with the ingest writer's transactions.
  absl::MutexLock lock(&read_mu_);
  return rows::MarkOutbox(read_db_, id, sent, attempts, next_attempt_ms, error, now_ms);
}

}  // namespace trainwatch::server
