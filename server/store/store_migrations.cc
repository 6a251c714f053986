#include "store/store_migrations.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "store/sql_statement.h"

namespace trainwatch::server {

namespace {

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
    // 3: an acknowledgement belongs to its run. The key names the run, so a
    // row another run's agent wrote under the same command id cannot hide
    // this run's (INSERT OR IGNORE); rows that acknowledge another run's
    // command, or one never issued, were forged and go.
    R"sql(
CREATE TABLE command_acks_by_run (
  command_id TEXT NOT NULL,
  run_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  status INTEGER NOT NULL,
  message TEXT NOT NULL,
  resumed_step INTEGER NOT NULL,
  at_ms INTEGER NOT NULL,
  PRIMARY KEY (command_id, run_id, rank, status)
) WITHOUT ROWID;
INSERT INTO command_acks_by_run
  SELECT a.command_id, a.run_id, a.rank, a.status, a.message, a.resumed_step, a.at_ms
  FROM command_acks a JOIN commands c ON c.id = a.command_id AND c.run_id = a.run_id;
DROP TABLE command_acks;
ALTER TABLE command_acks_by_run RENAME TO command_acks;
)sql",
    // 4: shard names beside the integer ids (agent.proto, StepReport.
    // shard_names). A step's and an incident's names are a JSON array of
    // strings (names may hold any character, so no separator would do),
    // NULL where there are none, as in every row from before; a quarantine
    // row is an id range or, with `name` set, one named shard.
    R"sql(
ALTER TABLE steps ADD COLUMN shard_names TEXT;
ALTER TABLE incidents ADD COLUMN shard_names TEXT;
ALTER TABLE quarantined_shards ADD COLUMN name TEXT;
)sql",
    // 5: incarnations (one launch of a job each) and how each attempt began.
    // A run's current incarnation and the step it resumed after (NULL: not
    // known yet) survive a restart of trainwatchd; every incarnation a run
    // saw stays, so that an older one reconnecting is refused (ingest.h).
    // Attempts begun before this migration have no row: they were
    // rollbacks, and the operator view says so.
    R"sql(
ALTER TABLE runs ADD COLUMN incarnation TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN resume_step INTEGER;
CREATE TABLE incarnations (
  run_id TEXT NOT NULL,
  incarnation TEXT NOT NULL,
  seen_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, incarnation)
) WITHOUT ROWID;
CREATE TABLE attempts (
  run_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  start INTEGER NOT NULL,
  incident_id INTEGER NOT NULL,
  incarnation TEXT NOT NULL,
  from_step INTEGER NOT NULL,
  started_ms INTEGER NOT NULL,
  PRIMARY KEY (run_id, attempt)
) WITHOUT ROWID;
)sql",
    // 6: fp16 dynamic loss scaling (StepReport.loss_scale and
    // loss_scale_overflow), so that an engine rebuilt from the store after a
    // restart tells an overflow step from a numerical failure as the live one
    // did. loss_scale_overflow is NULL on steps without a loss scale (bf16,
    // fp32, every row from before), 0 or 1 otherwise; a NaN scale is stored
    // as NULL beside a non-NULL flag.
    R"sql(
ALTER TABLE steps ADD COLUMN loss_scale REAL;
ALTER TABLE steps ADD COLUMN loss_scale_overflow INTEGER;
)sql",
    // 7: followed runs (`twctl follow`, Hello.observed), whose records are
    // observed, not enforced. The run's mark survives a restart of
    // trainwatchd, and each incident keeps whether its run was followed when
    // it opened, so its pages and views say no automatic action was possible.
    R"sql(
ALTER TABLE runs ADD COLUMN observed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE incidents ADD COLUMN observed INTEGER NOT NULL DEFAULT 0;
)sql",
    // 8: rule-engine snapshots, so that a restart, an eviction's rebuild or a
    // new attempt replays only the steps after the latest snapshot instead
    // of the run's whole history (server/ingest/engine_snapshots.cc). `state`
    // is RuleEngine::SaveState()'s blob, which names the rule config it was
    // built under; skipped and overflows are the attempt's counts up to and
    // including `step`, which a rebuild would otherwise count by a scan.
    // A rowid table: the blobs are large (~0.3 MB with the default windows).
    R"sql(
CREATE TABLE engine_snapshots (
  run_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  step INTEGER NOT NULL,
  skipped INTEGER NOT NULL,
  overflows INTEGER NOT NULL,
  written_ms INTEGER NOT NULL,
  state BLOB NOT NULL,
  UNIQUE (run_id, attempt, step)
);
)sql",
    // 9: the rules each run is judged by (a JSON object of RuleConfig
    // fields) and where they came from (the agent's hello, the server's
    // --run_rules or --rules), so that a restart of trainwatchd rebuilds the
    // run by the same rules. '' on runs from before: they are judged by the
    // server's rules of the day, as they were.
    R"sql(
ALTER TABLE runs ADD COLUMN rules_json TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN rules_source TEXT NOT NULL DEFAULT '';
)sql",
    // 10: the two counts a restart reads for every run before its port opens
    // (skipped updates and loss-scale overflows, rows::CountSkipped and
    // rows::CountLossScaleOverflows) were a scan of the attempt's whole
    // history, seconds for long runs. Partial indexes hold only the
    // rare rows they count, so each count reads those rows alone, and an
    // insert of an ordinary step costs one WHERE test per index.
    // The literals are core::Decision::kSkipUpdate (1) and the flag's true.
    R"sql(
CREATE INDEX steps_skipped ON steps (run_id, attempt) WHERE decision = 1 AND late = 0;
CREATE INDEX steps_overflowed ON steps (run_id, attempt) WHERE loss_scale_overflow = 1 AND late = 0;
)sql",
    // 11: fewer pages written per commit, which is what a durable ack
    // waits for (the WAL is written and synced a page at a time). At a
    // cluster's steady rate a commit dirtied about a page per record, most
    // of them rank_steps' and the runs rows'.
    // - rank_steps was keyed by run: each commit added rows in the middle of
    //   the table, once per run, and every leaf split there rebalanced its
    //   siblings. Rows now go to the end of the table in arrival order and a
    //   unique index of the same key (entries a fifth of a row's size)
    //   finds and deduplicates them: a commit dirties one index leaf per run
    //   and the few data pages it fills.
    // - The rules (a 3 KB JSON object) made each runs row most of a page, and
    //   every batch rewrote the row of every run it touched. They live in a
    //   table of their own now, written only when they change.
    R"sql(
CREATE TABLE run_rules (
  run_id TEXT PRIMARY KEY,
  rules_json TEXT NOT NULL,
  rules_source TEXT NOT NULL
);
INSERT INTO run_rules (run_id, rules_json, rules_source)
  SELECT run_id, rules_json, rules_source FROM runs WHERE rules_json != '' OR rules_source != '';
ALTER TABLE runs DROP COLUMN rules_json;
ALTER TABLE runs DROP COLUMN rules_source;
CREATE TABLE rank_steps_by_arrival (
  id INTEGER PRIMARY KEY,
  run_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  step INTEGER NOT NULL,
  report BLOB NOT NULL
);
INSERT INTO rank_steps_by_arrival (run_id, attempt, rank, step, report)
  SELECT run_id, attempt, rank, step, report FROM rank_steps ORDER BY run_id, attempt, step, rank;
DROP TABLE rank_steps;
ALTER TABLE rank_steps_by_arrival RENAME TO rank_steps;
CREATE UNIQUE INDEX rank_steps_key ON rank_steps (run_id, attempt, step, rank);
)sql",
    // 12: what `trainwatch run` found when it attached a run's job
    // (Hello.attachment), beside the rules and for the same reason: a line
    // of a few hundred bytes that changes once a launch, kept out of the
    // runs row that every batch rewrites.
    R"sql(
CREATE TABLE run_attachments (
  run_id TEXT PRIMARY KEY,
  attachment TEXT NOT NULL
);
)sql",
};

}  // namespace

absl::Span<const char* const> SchemaMigrations() { return kMigrations; }

absl::StatusOr<int> MigrateSchema(sqlite3* db, absl::Span<const char* const> migrations) {
  absl::StatusOr<int64_t> version;
  {
    // Finalized before the migrations run: DROP TABLE fails ("database
    // table is locked") while any statement on the connection is active.
    SqlStatement v(db, "PRAGMA user_version");
    version = QueryInt(v);
  }
  if (!version.ok()) return version.status();
  const int target = static_cast<int>(migrations.size());
  if (*version > target) {
    return absl::FailedPreconditionError(absl::StrCat("database schema version ", *version,
                                                      " is newer than this trainwatchd (", target,
                                                      "): refusing to touch it"));
  }
  for (int i = static_cast<int>(*version); i < target; ++i) {
    absl::Status s = InTransaction(db, [&]() -> absl::Status {
      absl::Status m = Exec(db, migrations[i]);
      if (m.ok()) m = Exec(db, absl::StrCat("PRAGMA user_version=", i + 1).c_str());
      if (!m.ok()) return absl::InternalError(absl::StrCat("migration ", i + 1, ": ", m.message()));
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  return target;
}

}  // namespace trainwatch::server
