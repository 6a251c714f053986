#include "trainwatch/server/store.h"

#include <sqlite3.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace trainwatch::server {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Migrations, applied in order; PRAGMA user_version records how many ran.
// Never edit one that has shipped: append a new one.
const char* const kMigrations[] = {
    R"sql(
CREATE TABLE runs (
  run_id TEXT PRIMARY KEY,
  world_size INTEGER NOT NULL,
  attempt INTEGER NOT NULL DEFAULT 0,
  last_step INTEGER NOT NULL DEFAULT -1,
  created_ms INTEGER NOT NULL,
  last_seen_ms INTEGER NOT NULL
);
CREATE TABLE steps (
  run_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  step INTEGER NOT NULL,
  loss REAL, grad_norm REAL, log_z REAL, nan_frac REAL, lr REAL, z_loss_alpha REAL,
  activation_max REAL, attention_p99 REAL,
  present INTEGER NOT NULL,
  loss_ema_ratio REAL,
  nonfinite INTEGER, elements INTEGER,
  decision INTEGER NOT NULL,
  shards TEXT,
  missing_ranks TEXT,
  late INTEGER NOT NULL DEFAULT 0,
  received_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, attempt, step)
) WITHOUT ROWID;
CREATE TABLE rank_steps (
  run_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  step INTEGER NOT NULL,
  report BLOB NOT NULL,
  PRIMARY KEY (run_id, attempt, step, rank)
) WITHOUT ROWID;
CREATE TABLE checkpoints (
  run_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  uri TEXT NOT NULL,
  reported_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, step)
);
CREATE TABLE incidents (
  id INTEGER PRIMARY KEY,
  run_id TEXT NOT NULL,
  episode INTEGER NOT NULL,
  tier INTEGER NOT NULL,
  state INTEGER NOT NULL,
  kind INTEGER NOT NULL,
  title TEXT NOT NULL,
  onset_step INTEGER NOT NULL,
  detection_step INTEGER NOT NULL,
  checkpoint_step INTEGER NOT NULL,
  checkpoint_uri TEXT NOT NULL,
  shards TEXT NOT NULL,
  actions TEXT NOT NULL,
  opened_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  closed_ms INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX incidents_by_run ON incidents (run_id, episode);
CREATE TABLE events (
  id INTEGER PRIMARY KEY,
  run_id TEXT NOT NULL,
  incident_id INTEGER NOT NULL,
  episode INTEGER NOT NULL,
  step INTEGER NOT NULL,
  onset_step INTEGER NOT NULL,
  tier INTEGER NOT NULL,
  action INTEGER NOT NULL,
  kind INTEGER NOT NULL,
  reason TEXT NOT NULL,
  shards TEXT NOT NULL,
  checkpoint_step INTEGER NOT NULL,
  created_ms INTEGER NOT NULL
);
CREATE INDEX events_by_incident ON events (incident_id);
CREATE TABLE flagged_shards (
  run_id TEXT NOT NULL,
  shard INTEGER NOT NULL,
  incident_id INTEGER NOT NULL,
  PRIMARY KEY (run_id, shard, incident_id)
) WITHOUT ROWID;
CREATE TABLE quarantined_shards (
  id INTEGER PRIMARY KEY,
  run_id TEXT NOT NULL,
  first_shard INTEGER NOT NULL,
  last_shard INTEGER NOT NULL,
  incident_id INTEGER NOT NULL,
  decision_id INTEGER NOT NULL,
  created_ms INTEGER NOT NULL
);
CREATE TABLE commands (
  id TEXT PRIMARY KEY,
  run_id TEXT NOT NULL,
  incident_id INTEGER NOT NULL,
  kind TEXT NOT NULL,
  payload BLOB NOT NULL,
  created_ms INTEGER NOT NULL
);
CREATE TABLE command_acks (
  command_id TEXT NOT NULL,
  run_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  status INTEGER NOT NULL,
  message TEXT NOT NULL,
  resumed_step INTEGER NOT NULL,
  at_ms INTEGER NOT NULL,
  PRIMARY KEY (command_id, rank, status)
) WITHOUT ROWID;
CREATE TABLE decisions (
  id INTEGER PRIMARY KEY,
  incident_id INTEGER NOT NULL,
  run_id TEXT NOT NULL,
  actor TEXT NOT NULL,
  kind TEXT NOT NULL,
  comment TEXT NOT NULL,
  payload BLOB NOT NULL,
  idempotency_key TEXT UNIQUE,
  at_ms INTEGER NOT NULL
);
CREATE TABLE outbox (
  id INTEGER PRIMARY KEY,
  incident_id INTEGER NOT NULL,
  channel TEXT NOT NULL,
  kind TEXT NOT NULL,
  payload BLOB NOT NULL,
  state TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  next_attempt_ms INTEGER NOT NULL,
  last_error TEXT NOT NULL DEFAULT '',
  created_ms INTEGER NOT NULL,
  sent_ms INTEGER NOT NULL DEFAULT 0
);
)sql",
    // 2: one page per incident, receiver and state change.
    R"sql(
CREATE UNIQUE INDEX outbox_once ON outbox (incident_id, channel, kind);
)sql",
};

absl::Status SqlError(sqlite3* db, absl::string_view what) {
  return absl::InternalError(absl::StrCat("sqlite: ", what, ": ", sqlite3_errmsg(db)));
}

// A prepared statement with positional binds; reset for reuse.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  absl::Status status() const {
    return rc_ == SQLITE_OK ? absl::OkStatus() : SqlError(db_, "prepare");
  }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, double v) {
    if (std::isnan(v)) {
      sqlite3_bind_null(stmt_, i);  // NaN would read back as NULL anyway
    } else {
      sqlite3_bind_double(stmt_, i, v);
    }
    return *this;
  }
  Stmt& Bind(int i, absl::string_view v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindBlob(int i, absl::string_view v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindNull(int i) {
    sqlite3_bind_null(stmt_, i);
    return *this;
  }
  // Runs to completion (for writes).
  absl::Status Run() {
    const int rc = sqlite3_step(stmt_);
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    return rc == SQLITE_DONE || rc == SQLITE_ROW ? absl::OkStatus() : SqlError(db_, "step");
  }
  // Next row: true while rows remain; *st set on error.
  bool Next(absl::Status* st) {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) *st = SqlError(db_, "query");
    return false;
  }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const {
    return sqlite3_column_type(stmt_, col) == SQLITE_NULL ? kNaN
                                                         : sqlite3_column_double(stmt_, col);
  }
  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col))
             : std::string();
  }
  std::string Blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    return p ? std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, col))
             : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

absl::Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat("sqlite: ", err ? err : "exec failed"));
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<sqlite3*> OpenConnection(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    absl::Status s = absl::UnavailableError(
        absl::StrCat("cannot open database ", path, ": ", db ? sqlite3_errmsg(db) : "no memory"));
    sqlite3_close(db);
    return s;
  }
  sqlite3_busy_timeout(db, 5000);
  // WAL: readers never block the writer. synchronous=FULL: a commit is on
  // disk when it returns, which is what an acknowledgement promises.
  for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL",
                             "PRAGMA foreign_keys=ON", "PRAGMA temp_store=MEMORY"}) {
    if (absl::Status s = Exec(db, pragma); !s.ok()) {
      sqlite3_close(db);
      return s;
    }
  }
  return db;
}

std::string JoinShards(const std::vector<uint64_t>& shards) {
  return absl::StrJoin(shards, ";");
}

std::vector<uint64_t> SplitShards(const std::string& text) {
  std::vector<uint64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ';', absl::SkipEmpty())) {
    uint64_t v;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

// The columns of `steps` that hold signals, in Signal order.
constexpr const char* kSignalColumns[core::kNumSignals] = {
    "loss", "grad_norm", "log_z", "nan_frac", "lr", "z_loss_alpha", "activation_max",
    "attention_p99"};

constexpr char kStepColumns[] =
    "step, loss, grad_norm, log_z, nan_frac, lr, z_loss_alpha, activation_max, attention_p99, "
    "present, loss_ema_ratio, nonfinite, elements, decision, shards, missing_ranks, late, "
    "received_ms";

StoredStep ReadStep(const Stmt& q, int base) {
  StoredStep s;
  s.step = q.Int(base);
  s.present = static_cast<uint32_t>(q.Int(base + 9));
  for (int i = 0; i < core::kNumSignals; ++i) {
    // A reported NaN is stored as NULL and comes back as NaN; presence says
    // whether it was reported.
    s.values[i] = q.Real(base + 1 + i);
  }
  s.loss_ema_ratio = q.Real(base + 10);
  s.nonfinite = q.IsNull(base + 11) ? -1 : q.Int(base + 11);
  s.elements = q.IsNull(base + 12) ? -1 : q.Int(base + 12);
  s.decision = static_cast<int>(q.Int(base + 13));
  s.shards = SplitShards(q.Text(base + 14));
  s.missing_ranks = q.Text(base + 15);
  s.late = q.Int(base + 16) != 0;
  s.received_ms = q.Int(base + 17);
  return s;
}

constexpr char kIncidentColumns[] =
    "id, run_id, episode, tier, state, kind, title, onset_step, detection_step, "
    "checkpoint_step, checkpoint_uri, shards, actions, opened_ms, updated_ms, closed_ms";

IncidentRow ReadIncident(const Stmt& q) {
  IncidentRow r;
  r.id = q.Int(0);
  r.run_id = q.Text(1);
  r.episode = static_cast<uint64_t>(q.Int(2));
  r.tier = static_cast<int>(q.Int(3));
  r.state = static_cast<IncidentState>(q.Int(4));
  r.kind = static_cast<core::EventKind>(q.Int(5));
  r.title = q.Text(6);
  r.onset_step = q.Int(7);
  r.detection_step = q.Int(8);
  r.recommended_checkpoint_step = q.Int(9);
  r.recommended_checkpoint_uri = q.Text(10);
  r.shards = SplitShards(q.Text(11));
  r.actions_json = q.Text(12);
  r.opened_ms = q.Int(13);
  r.updated_ms = q.Int(14);
  r.closed_ms = q.Int(15);
  return r;
}

}  // namespace

double StoredStep::Get(core::Signal s) const {
  return Has(s) ? values[static_cast<int>(s)] : kNaN;
}

core::StepRecord StoredStep::View() const {
  core::StepRecord r;
  r.step = step;
  for (int i = 0; i < core::kNumSignals; ++i) {
    if (present & (1u << i)) r.Set(static_cast<core::Signal>(i), values[i]);
  }
  r.shards = shards;
  return r;
}

void WriteBatch::clear() {
  runs.clear();
  steps.clear();
  rank_steps.clear();
  checkpoints.clear();
  events.clear();
  incidents.clear();
  command_acks.clear();
  decisions.clear();
  commands.clear();
  quarantines.clear();
  attempt_copies.clear();
  outbox.clear();
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  std::unique_ptr<Store> store(new Store());
  absl::StatusOr<sqlite3*> db = OpenConnection(path);
  if (!db.ok()) return db.status();
  store->db_ = *db;
  if (absl::Status s = store->Migrate(); !s.ok()) return s;
  absl::StatusOr<sqlite3*> rdb = OpenConnection(path);
  if (!rdb.ok()) return rdb.status();
  absl::MutexLock lock(&store->read_mu_);
  store->read_db_ = *rdb;
  return store;
}

Store::~Store() {
  {
    absl::MutexLock lock(&read_mu_);
    sqlite3_close(read_db_);
  }
  sqlite3_close(db_);
}

absl::Status Store::Migrate() {
  Stmt v(db_, "PRAGMA user_version");
  absl::Status st;
  int version = 0;
  if (v.Next(&st)) version = static_cast<int>(v.Int(0));
  if (!st.ok()) return st;
  const int target = static_cast<int>(sizeof(kMigrations) / sizeof(kMigrations[0]));
  if (version > target) {
    return absl::FailedPreconditionError(absl::StrCat(
        "database schema version ", version, " is newer than this trainwatchd (", target,
        "): refusing to touch it"));
  }
  for (int i = version; i < target; ++i) {
    if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
    absl::Status s = Exec(db_, kMigrations[i]);
    if (s.ok()) s = Exec(db_, absl::StrCat("PRAGMA user_version=", i + 1).c_str());
    if (!s.ok()) {
      Exec(db_, "ROLLBACK").IgnoreError();
      return absl::InternalError(absl::StrCat("migration ", i + 1, ": ", s.message()));
    }
    if (absl::Status c = Exec(db_, "COMMIT"); !c.ok()) return c;
  }
  schema_version_ = target;
  return absl::OkStatus();
}

absl::Status Store::Write(const WriteBatch& b) {
  if (b.empty()) return absl::OkStatus();
  if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
  auto fail = [&](absl::Status s) {
    Exec(db_, "ROLLBACK").IgnoreError();
    return s;
  };
  {
    Stmt q(db_,
           "INSERT INTO runs (run_id, world_size, attempt, last_step, created_ms, last_seen_ms) "
           "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(run_id) DO UPDATE SET "
           "world_size=excluded.world_size, attempt=excluded.attempt, "
           "last_step=excluded.last_step, last_seen_ms=excluded.last_seen_ms");
    if (!q.status().ok()) return fail(q.status());
    for (const RunRow& r : b.runs) {
      q.Bind(1, r.run_id).Bind(2, int64_t{r.world_size}).Bind(3, r.attempt);
      q.Bind(4, r.last_step).Bind(5, r.created_ms).Bind(6, r.last_seen_ms);
      if (absl::Status s = q.Run(); !s.ok()) return fail(s);
    }
  }
  if (!b.steps.empty()) {
    Stmt q(db_, absl::StrCat("INSERT OR IGNORE INTO steps (run_id, attempt, ", kStepColumns,
                             ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
                             "?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)")
                    .c_str());
    if (!q.status().ok()) return fail(q.status());
    for (const WriteBatch::Step& w : b.steps) {
      const StoredStep& s = w.step;
      q.Bind(1, w.run_id).Bind(2, w.attempt).Bind(3, s.step);
      for (int i = 0; i < core::kNumSignals; ++i) {
        if (s.present & (1u << i)) {
          q.Bind(4 + i, s.values[i]);
        } else {
          q.BindNull(4 + i);
        }
      }
      q.Bind(12, int64_t{s.present}).Bind(13, s.loss_ema_ratio);
      if (s.nonfinite >= 0) q.Bind(14, s.nonfinite); else q.BindNull(14);
      if (s.elements >= 0) q.Bind(15, s.elements); else q.BindNull(15);
      q.Bind(16, int64_t{s.decision}).Bind(17, JoinShards(s.shards));
      q.Bind(18, s.missing_ranks).Bind(19, int64_t{s.late}).Bind(20, s.received_ms);
      if (absl::Status st = q.Run(); !st.ok()) return fail(st);
    }
  }
  if (!b.rank_steps.empty()) {
    Stmt q(db_,
           "INSERT OR IGNORE INTO rank_steps (run_id, attempt, rank, step, report) "
           "VALUES (?1, ?2, ?3, ?4, ?5)");
    if (!q.status().ok()) return fail(q.status());
    for (const RankStepRow& r : b.rank_steps) {
      q.Bind(1, r.run_id).Bind(2, r.attempt).Bind(3, int64_t{r.rank}).Bind(4, r.step);
      q.BindBlob(5, r.report);
      if (absl::Status s = q.Run(); !s.ok()) return fail(s);
    }
  }
  if (!b.checkpoints.empty()) {
    Stmt q(db_,
           "INSERT OR REPLACE INTO checkpoints (run_id, step, uri, reported_ms) "
           "VALUES (?1, ?2, ?3, ?4)");
    if (!q.status().ok()) return fail(q.status());
    for (const CheckpointRow& c : b.checkpoints) {
      q.Bind(1, c.run_id).Bind(2, c.step).Bind(3, c.uri).Bind(4, c.reported_ms);
      if (absl::Status s = q.Run(); !s.ok()) return fail(s);
    }
  }
  if (!b.incidents.empty()) {
    Stmt q(db_, absl::StrCat("INSERT OR REPLACE INTO incidents (", kIncidentColumns,
                             ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
                             "?13, ?14, ?15, ?16)")
                    .c_str());
    Stmt flag(db_,
              "INSERT OR IGNORE INTO flagged_shards (run_id, shard, incident_id) "
              "VALUES (?1, ?2, ?3)");
    if (!q.status().ok()) return fail(q.status());
    if (!flag.status().ok()) return fail(flag.status());
    for (const IncidentRow& r : b.incidents) {
      q.Bind(1, r.id).Bind(2, r.run_id).Bind(3, static_cast<int64_t>(r.episode));
      q.Bind(4, int64_t{r.tier}).Bind(5, int64_t{static_cast<int>(r.state)});
      q.Bind(6, int64_t{static_cast<int>(r.kind)}).Bind(7, r.title).Bind(8, r.onset_step);
      q.Bind(9, r.detection_step).Bind(10, r.recommended_checkpoint_step);
      q.Bind(11, r.recommended_checkpoint_uri).Bind(12, JoinShards(r.shards));
      q.Bind(13, r.actions_json).Bind(14, r.opened_ms).Bind(15, r.updated_ms);
      q.Bind(16, r.closed_ms);
      if (absl::Status s = q.Run(); !s.ok()) return fail(s);
      for (uint64_t shard : r.shards) {
        flag.Bind(1, r.run_id).Bind(2, static_cast<int64_t>(shard)).Bind(3, r.id);
        if (absl::Status s = flag.Run(); !s.ok()) return fail(s);
      }
    }
  }
  if (!b.events.empty()) {
    Stmt q(db_,
           "INSERT INTO events (run_id, incident_id, episode, step, onset_step, tier, action, "
           "kind, reason, shards, checkpoint_step, created_ms) "
           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)");
    if (!q.status().ok()) return fail(q.status());
    for (const EventRow& r : b.events) {
      const core::Event& e = r.event;
      q.Bind(1, r.run_id).Bind(2, r.incident_id).Bind(3, static_cast<int64_t>(e.episode));
      q.Bind(4, e.step).Bind(5, e.onset_step).Bind(6, int64_t{e.tier});
      q.Bind(7, int64_t{static_cast<int>(e.action)}).Bind(8, int64_t{static_cast<int>(e.kind)});
      q.Bind(9, e.reason).Bind(10, JoinShards(e.shards));
      q.Bind(11, e.recommended_checkpoint_step).Bind(12, r.created_ms);
      if (absl::Status s = q.Run(); !s.ok()) return fail(s);
    }
  }
  if (!b.command_acks.empty()) {
    Stmt q(db_,
           "INSERT OR IGNORE INTO command_acks (command_id, run_id, rank, status, message, "
           "resumed_step, at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
    if (!q.status().ok()) return fail(q.status());
    for (const CommandAckRow& a : b.command_acks) {
      q.Bind(1, a.command_id).Bind(2, a.run_id).Bind(3, int64_t{a.rank});
      q.Bind(4, int64_t{a.status}).Bind(5, a.message).Bind(6, a.resumed_step).Bind(7, a.at_ms);
      if (absl::Status s = q.Run(); !s.ok()) return fail(s);
    }
  }
  for (const AttemptCopy& a : b.attempt_copies) {
    Stmt q(db_, absl::StrCat("INSERT OR IGNORE INTO steps (run_id, attempt, ", kStepColumns,
                             ") SELECT run_id, ?2, ", kStepColumns,
                             " FROM steps WHERE run_id = ?1 AND attempt = ?3 AND step <= ?4")
                    .c_str());
    if (!q.status().ok()) return fail(q.status());
    q.Bind(1, a.run_id).Bind(2, a.to_attempt).Bind(3, a.from_attempt).Bind(4, a.up_to_step);
    if (absl::Status s = q.Run(); !s.ok()) return fail(s);
  }
  if (!b.decisions.empty()) {
    Stmt q(db_,
           "INSERT INTO decisions (id, incident_id, run_id, actor, kind, comment, payload, "
           "idempotency_key, at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
    if (!q.status().ok()) return fail(q.status());
    for (const DecisionRow& d : b.decisions) {
      q.Bind(1, d.id).Bind(2, d.incident_id).Bind(3, d.run_id).Bind(4, d.actor);
      q.Bind(5, d.kind).Bind(6, d.comment).BindBlob(7, d.payload);
      if (d.idempotency_key.empty()) q.BindNull(8); else q.Bind(8, d.idempotency_key);
      q.Bind(9, d.at_ms);
      if (absl::Status s = q.Run(); !s.ok()) return fail(s);
    }
  }
  if (!b.commands.empty()) {
    Stmt q(db_,
           "INSERT OR IGNORE INTO commands (id, run_id, incident_id, kind, payload, created_ms) "
           "VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
    if (!q.status().ok()) return fail(q.status());
    for (const CommandRow& c : b.commands) {
      q.Bind(1, c.id).Bind(2, c.run_id).Bind(3, c.incident_id).Bind(4, c.kind);
      q.BindBlob(5, c.payload).Bind(6, c.created_ms);
      if (absl::Status s = q.Run(); !s.ok()) return fail(s);
    }
  }
  if (!b.quarantines.empty()) {
    Stmt q(db_,
           "INSERT INTO quarantined_shards (run_id, first_shard, last_shard, incident_id, "
           "decision_id, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
    if (!q.status().ok()) return fail(q.status());
    for (const QuarantineRow& r : b.quarantines) {
      q.Bind(1, r.run_id).Bind(2, static_cast<int64_t>(r.first));
      q.Bind(3, static_cast<int64_t>(r.last)).Bind(4, r.incident_id).Bind(5, r.decision_id);
      q.Bind(6, r.created_ms);
      if (absl::Status s = q.Run(); !s.ok()) return fail(s);
    }
  }
  if (!b.outbox.empty()) {
    Stmt q(db_,
           "INSERT OR IGNORE INTO outbox (incident_id, channel, kind, payload, state, attempts, "
           "next_attempt_ms, created_ms) VALUES (?1, ?2, ?3, ?4, 'pending', 0, ?5, ?6)");
    if (!q.status().ok()) return fail(q.status());
    for (const OutboxRow& o : b.outbox) {
      q.Bind(1, o.incident_id).Bind(2, o.channel).Bind(3, o.kind).BindBlob(4, o.payload);
      q.Bind(5, o.next_attempt_ms).Bind(6, o.created_ms);
      if (absl::Status s = q.Run(); !s.ok()) return fail(s);
    }
  }
  if (absl::Status s = Exec(db_, "COMMIT"); !s.ok()) return fail(s);
  return absl::OkStatus();
}

namespace {
constexpr char kOutboxColumns[] =
    "id, incident_id, channel, kind, payload, state, attempts, next_attempt_ms, last_error, "
    "created_ms, sent_ms";
OutboxRow ReadOutbox(const Stmt& q) {
  OutboxRow o;
  o.id = q.Int(0);
  o.incident_id = q.Int(1);
  o.channel = q.Text(2);
  o.kind = q.Text(3);
  o.payload = q.Blob(4);
  o.state = q.Text(5);
  o.attempts = static_cast<int>(q.Int(6));
  o.next_attempt_ms = q.Int(7);
  o.last_error = q.Text(8);
  o.created_ms = q.Int(9);
  o.sent_ms = q.Int(10);
  return o;
}
}  // namespace

absl::StatusOr<std::vector<OutboxRow>> Store::DueOutbox(int64_t now_ms, int limit) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_, absl::StrCat("SELECT ", kOutboxColumns,
                                " FROM outbox WHERE state = 'pending' AND next_attempt_ms <= ?1 "
                                "ORDER BY id LIMIT ?2").c_str());
  if (!q.status().ok()) return q.status();
  q.Bind(1, now_ms).Bind(2, int64_t{limit});
  std::vector<OutboxRow> out;
  absl::Status st;
  while (q.Next(&st)) out.push_back(ReadOutbox(q));
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<OutboxRow>> Store::Outbox(int64_t incident_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_, absl::StrCat("SELECT ", kOutboxColumns,
                                " FROM outbox WHERE incident_id = ?1 ORDER BY id").c_str());
  if (!q.status().ok()) return q.status();
  q.Bind(1, incident_id);
  std::vector<OutboxRow> out;
  absl::Status st;
  while (q.Next(&st)) out.push_back(ReadOutbox(q));
  if (!st.ok()) return st;
  return out;
}

absl::Status Store::MarkOutbox(int64_t id, bool sent, int attempts, int64_t next_attempt_ms,
                               const std::string& error, int64_t now_ms) {
  // The pager's own connection would be a third writer; the read connection
  // under its mutex serialises with the other queries, and WAL orders it
  // with the ingest writer's transactions.
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_,
         "UPDATE outbox SET state = ?2, attempts = ?3, next_attempt_ms = ?4, last_error = ?5, "
         "sent_ms = ?6 WHERE id = ?1");
  if (!q.status().ok()) return q.status();
  q.Bind(1, id).Bind(2, std::string(sent ? "sent" : "pending")).Bind(3, int64_t{attempts});
  q.Bind(4, next_attempt_ms).Bind(5, error).Bind(6, sent ? now_ms : int64_t{0});
  return q.Run();
}

absl::StatusOr<int64_t> Store::MaxDecisionId() {
  Stmt q(db_, "SELECT COALESCE(MAX(id), 0) FROM decisions");
  absl::Status st;
  int64_t v = 0;
  if (q.Next(&st)) v = q.Int(0);
  if (!st.ok()) return st;
  return v;
}

namespace {
constexpr char kDecisionColumns[] =
    "id, incident_id, run_id, actor, kind, comment, payload, COALESCE(idempotency_key, ''), "
    "at_ms";
DecisionRow ReadDecision(const Stmt& q) {
  DecisionRow d;
  d.id = q.Int(0);
  d.incident_id = q.Int(1);
  d.run_id = q.Text(2);
  d.actor = q.Text(3);
  d.kind = q.Text(4);
  d.comment = q.Text(5);
  d.payload = q.Blob(6);
  d.idempotency_key = q.Text(7);
  d.at_ms = q.Int(8);
  return d;
}
}  // namespace

absl::StatusOr<std::optional<DecisionRow>> Store::FindDecisionByKey(const std::string& key) {
  Stmt q(db_, absl::StrCat("SELECT ", kDecisionColumns,
                           " FROM decisions WHERE idempotency_key = ?1").c_str());
  if (!q.status().ok()) return q.status();
  q.Bind(1, key);
  absl::Status st;
  std::optional<DecisionRow> out;
  if (q.Next(&st)) out = ReadDecision(q);
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<DecisionRow>> Store::DecisionsOfIncident(int64_t incident_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_, absl::StrCat("SELECT ", kDecisionColumns,
                                " FROM decisions WHERE incident_id = ?1 ORDER BY id").c_str());
  if (!q.status().ok()) return q.status();
  q.Bind(1, incident_id);
  std::vector<DecisionRow> out;
  absl::Status st;
  while (q.Next(&st)) out.push_back(ReadDecision(q));
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::optional<CommandRow>> Store::LatestCommand(int64_t incident_id) {
  Stmt q(db_,
         "SELECT id, run_id, incident_id, kind, payload, created_ms FROM commands WHERE "
         "incident_id = ?1 ORDER BY created_ms DESC, id DESC LIMIT 1");
  if (!q.status().ok()) return q.status();
  q.Bind(1, incident_id);
  absl::Status st;
  std::optional<CommandRow> out;
  if (q.Next(&st)) {
    out = CommandRow{q.Text(0), q.Text(1), q.Int(2), q.Text(3), q.Blob(4), q.Int(5)};
  }
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<CommandAckRow>> Store::CommandAcks(const std::string& command_id) {
  Stmt q(db_,
         "SELECT command_id, run_id, rank, status, message, resumed_step, at_ms FROM "
         "command_acks WHERE command_id = ?1 ORDER BY at_ms");
  if (!q.status().ok()) return q.status();
  q.Bind(1, command_id);
  std::vector<CommandAckRow> out;
  absl::Status st;
  while (q.Next(&st)) {
    out.push_back({q.Text(0), q.Text(1), static_cast<int32_t>(q.Int(2)),
                   static_cast<int>(q.Int(3)), q.Text(4), q.Int(5), q.Int(6)});
  }
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<QuarantineRow>> Store::Quarantines(const std::string& run_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_,
         "SELECT first_shard, last_shard, incident_id, decision_id, created_ms FROM "
         "quarantined_shards WHERE run_id = ?1 ORDER BY id");
  if (!q.status().ok()) return q.status();
  q.Bind(1, run_id);
  std::vector<QuarantineRow> out;
  absl::Status st;
  while (q.Next(&st)) {
    out.push_back({run_id, static_cast<uint64_t>(q.Int(0)), static_cast<uint64_t>(q.Int(1)),
                   q.Int(2), q.Int(3), q.Int(4)});
  }
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<RunRow>> Store::LoadRuns() {
  Stmt q(db_,
         "SELECT run_id, world_size, attempt, last_step, created_ms, last_seen_ms FROM runs "
         "ORDER BY run_id");
  if (!q.status().ok()) return q.status();
  std::vector<RunRow> out;
  absl::Status st;
  while (q.Next(&st)) {
    RunRow r;
    r.run_id = q.Text(0);
    r.world_size = static_cast<int32_t>(q.Int(1));
    r.attempt = q.Int(2);
    r.last_step = q.Int(3);
    r.created_ms = q.Int(4);
    r.last_seen_ms = q.Int(5);
    out.push_back(std::move(r));
  }
  if (!st.ok()) return st;
  return out;
}

absl::Status Store::ForEachStep(
    const std::string& run_id, int64_t attempt,
    const std::function<void(const StoredStep&, const std::string&)>& fn) {
  Stmt q(db_, absl::StrCat("SELECT ", kStepColumns,
                           ", (SELECT uri FROM checkpoints c WHERE c.run_id = s.run_id AND "
                           "c.step = s.step) FROM steps s WHERE run_id = ?1 AND attempt = ?2 "
                           "AND late = 0 ORDER BY step")
                  .c_str());
  if (!q.status().ok()) return q.status();
  q.Bind(1, run_id).Bind(2, attempt);
  absl::Status st;
  while (q.Next(&st)) fn(ReadStep(q, 0), q.Text(18));
  return st;
}

absl::StatusOr<std::vector<RankStepRow>> Store::LoadRankStepsAfter(const std::string& run_id,
                                                                   int64_t attempt,
                                                                   int64_t step) {
  Stmt q(db_,
         "SELECT rank, step, report FROM rank_steps WHERE run_id = ?1 AND attempt = ?2 AND "
         "step > ?3 ORDER BY step, rank");
  if (!q.status().ok()) return q.status();
  q.Bind(1, run_id).Bind(2, attempt).Bind(3, step);
  std::vector<RankStepRow> out;
  absl::Status st;
  while (q.Next(&st)) {
    RankStepRow r;
    r.run_id = run_id;
    r.attempt = attempt;
    r.rank = static_cast<int32_t>(q.Int(0));
    r.step = q.Int(1);
    r.report = q.Blob(2);
    out.push_back(std::move(r));
  }
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<RankStepRow>> Store::RankStepsAt(const std::string& run_id,
                                                            int64_t attempt, int64_t step) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_,
         "SELECT rank, report FROM rank_steps WHERE run_id = ?1 AND attempt = ?2 AND step = ?3 "
         "ORDER BY rank");
  if (!q.status().ok()) return q.status();
  q.Bind(1, run_id).Bind(2, attempt).Bind(3, step);
  std::vector<RankStepRow> out;
  absl::Status st;
  while (q.Next(&st)) {
    RankStepRow r;
    r.run_id = run_id;
    r.attempt = attempt;
    r.rank = static_cast<int32_t>(q.Int(0));
    r.step = step;
    r.report = q.Blob(1);
    out.push_back(std::move(r));
  }
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<int64_t> Store::MaxIncidentId() {
  Stmt q(db_, "SELECT COALESCE(MAX(id), 0) FROM incidents");
  absl::Status st;
  int64_t v = 0;
  if (q.Next(&st)) v = q.Int(0);
  if (!st.ok()) return st;
  return v;
}

absl::StatusOr<std::vector<IncidentRow>> Store::ListIncidents(const IncidentFilter& f) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_, absl::StrCat("SELECT ", kIncidentColumns,
                                " FROM incidents WHERE (?1 = '' OR run_id = ?1) AND "
                                "(?2 = 0 OR state NOT IN (5, 6)) AND (?3 < 0 OR tier = ?3) AND "
                                "id > ?4 ORDER BY id LIMIT ?5")
                       .c_str());
  if (!q.status().ok()) return q.status();
  q.Bind(1, f.run_id).Bind(2, int64_t{f.open_only}).Bind(3, int64_t{f.tier});
  q.Bind(4, f.after_id).Bind(5, int64_t{f.limit});
  std::vector<IncidentRow> out;
  absl::Status st;
  while (q.Next(&st)) out.push_back(ReadIncident(q));
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::optional<IncidentRow>> Store::GetIncident(int64_t id) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_,
         absl::StrCat("SELECT ", kIncidentColumns, " FROM incidents WHERE id = ?1").c_str());
  if (!q.status().ok()) return q.status();
  q.Bind(1, id);
  absl::Status st;
  std::optional<IncidentRow> out;
  if (q.Next(&st)) out = ReadIncident(q);
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<EventRow>> Store::EventsOfIncident(int64_t id) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_,
         "SELECT run_id, episode, step, onset_step, tier, action, kind, reason, shards, "
         "checkpoint_step, created_ms FROM events WHERE incident_id = ?1 ORDER BY id");
  if (!q.status().ok()) return q.status();
  q.Bind(1, id);
  std::vector<EventRow> out;
  absl::Status st;
  while (q.Next(&st)) {
    EventRow r;
    r.run_id = q.Text(0);
    r.incident_id = id;
    r.event.episode = static_cast<uint64_t>(q.Int(1));
    r.event.step = q.Int(2);
    r.event.onset_step = q.Int(3);
    r.event.tier = static_cast<int>(q.Int(4));
    r.event.action = static_cast<core::Action>(q.Int(5));
    r.event.kind = static_cast<core::EventKind>(q.Int(6));
    r.event.reason = q.Text(7);
    r.event.shards = SplitShards(q.Text(8));
    r.event.recommended_checkpoint_step = q.Int(9);
    r.created_ms = q.Int(10);
    out.push_back(std::move(r));
  }
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<StoredStep>> Store::RecentSteps(const std::string& run_id,
                                                           int64_t attempt, int limit) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_, absl::StrCat("SELECT ", kStepColumns,
                                " FROM steps WHERE run_id = ?1 AND attempt = ?2 ORDER BY step "
                                "DESC LIMIT ?3")
                       .c_str());
  if (!q.status().ok()) return q.status();
  q.Bind(1, run_id).Bind(2, attempt).Bind(3, int64_t{limit});
  std::vector<StoredStep> out;
  absl::Status st;
  while (q.Next(&st)) out.push_back(ReadStep(q, 0));
  if (!st.ok()) return st;
  std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<StoredStep>> Store::StepsBetween(const std::string& run_id,
                                                            int64_t attempt, int64_t first,
                                                            int64_t last) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_, absl::StrCat("SELECT ", kStepColumns,
                                " FROM steps WHERE run_id = ?1 AND attempt = ?2 AND step >= ?3 "
                                "AND step <= ?4 ORDER BY step")
                       .c_str());
  if (!q.status().ok()) return q.status();
  q.Bind(1, run_id).Bind(2, attempt).Bind(3, first).Bind(4, last);
  std::vector<StoredStep> out;
  absl::Status st;
  while (q.Next(&st)) out.push_back(ReadStep(q, 0));
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<CheckpointRow>> Store::Checkpoints(const std::string& run_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_,
         "SELECT step, uri, reported_ms FROM checkpoints WHERE run_id = ?1 ORDER BY step");
  if (!q.status().ok()) return q.status();
  q.Bind(1, run_id);
  std::vector<CheckpointRow> out;
  absl::Status st;
  while (q.Next(&st)) out.push_back({run_id, q.Int(0), q.Text(1), q.Int(2)});
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> Store::FlaggedShards(
    const std::string& run_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_,
         "SELECT shard, incident_id FROM flagged_shards WHERE run_id = ?1 ORDER BY shard");
  if (!q.status().ok()) return q.status();
  q.Bind(1, run_id);
  std::vector<std::pair<uint64_t, int64_t>> out;
  absl::Status st;
  while (q.Next(&st)) out.emplace_back(static_cast<uint64_t>(q.Int(0)), q.Int(1));
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<int64_t> Store::CountSteps(const std::string& run_id) {
  absl::MutexLock lock(&read_mu_);
  Stmt q(read_db_, "SELECT COUNT(*) FROM steps WHERE run_id = ?1");
  if (!q.status().ok()) return q.status();
  q.Bind(1, run_id);
  absl::Status st;
  int64_t n = 0;
  if (q.Next(&st)) n = q.Int(0);
  if (!st.ok()) return st;
  return n;
}

}  // namespace trainwatch::server
