// The system of record, behind one domain-level interface: every run, every
// step record, every event and incident, the shards they flagged,
// checkpoints, commands and their acknowledgements, decisions (the audit
// log), the pager's outbox, each run's attempts (how each began) and
// incarnations (the launches of its job), and the rule engine's snapshots.
//
// Two backends implement it, chosen by Store::Open from the database's name:
//   - SQLite (sqlite_store.h), one file on one disk: the default, embedded
//     and single-node;
//   - PostgreSQL (pg/pg_store.h), through libpq: a server that platform
//     teams already replicate. A commit is acknowledged only once the server
//     says it is durable, never when its synchronous-replication wait was
//     cancelled (pg/pg_connection.h, the ack rule).
// The same conformance suite (tests/server/store_conformance_test.cc) runs
// against both, so what a caller sees does not depend on the backend.
//
// Writes come in batches, one transaction each, from a single writer (the
// ingest thread): a batch is durable when Write() returns OK, and only then
// is anything acknowledged to an agent. A failed Write() stored nothing the
// caller may count on; the ingest retries it.
//
// Thread-safety: Write() and the rebuild readers (LoadRuns through
// CommandAcks below) are for the writer thread; the query methods marked
// "any thread" serialise on a connection of their own, so a reader never
// waits for a commit in flight.

#ifndef TRAINWATCH_SERVER_STORE_H_
#define TRAINWATCH_SERVER_STORE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainwatch/core/event.h"
#include "trainwatch/core/step_record.h"

namespace trainwatch::server {

class ShardLeases;  // pg/shard_leases.h

// One global step of a run as the store keeps it: the step (core::Step),
// what the engine decided, and how the step arrived.
struct StepRow : core::Step {
  int decision = 0;             // core::Decision
  std::vector<uint64_t> shards;
  std::vector<std::string> shard_names;  // sorted, unique (migration 4)
  std::string missing_ranks;    // "3,7-9" when a step completed by timeout (bounded)
  bool late = false;            // arrived after later steps: stored, not evaluated
  int64_t received_ms = 0;

  // A view for the rule engine; valid while this row lives.
  core::StepRecord View() const {
    core::StepRecord r(*this);
    r.shards = shards;
    r.shard_names = shard_names;
    return r;
  }
};

struct RunRow {
  std::string run_id;
  int32_t world_size = 1;
  int64_t attempt = 0;     // bumped by each rollback or resume
  int64_t last_step = -1;  // last global step evaluated
  int64_t created_ms = 0;
  int64_t last_seen_ms = 0;
  // The launch of the job streaming now ("" before any agent sent one), and
  // the step it resumed after, once known (ingest.h).
  std::string incarnation;
  std::optional<int64_t> resume_step;
  // Followed from its log (`twctl follow`, Hello.observed): observed, not
  // enforced. Set by every Hello, so a job that later runs the agent itself
  // is enforced again.
  bool observed = false;
  // The rules the run is judged by, as core::ParseRuleConfigJson reads them,
  // and where they came from (ingest.h: "The run's rules"); empty for a run
  // stored before migration 9: the server's rules of the day.
  std::string rules_json;
  std::string rules_source;
  // What `trainwatch run` found when it attached the job (Hello.attachment),
  // or why it could not; empty for a job that attached itself. Set by every
  // Hello; kept in a table of its own, written only when it changes.
  std::string attachment;
};

// Every field: a standby rebuilds a run's view when its row changed
// (api/standby_reads.h), so a new field belongs here too.
inline bool operator==(const RunRow& a, const RunRow& b) {
  return std::tie(a.run_id, a.world_size, a.attempt, a.last_step, a.created_ms, a.last_seen_ms,
                  a.incarnation, a.resume_step, a.observed, a.rules_json, a.rules_source,
                  a.attachment) ==
         std::tie(b.run_id, b.world_size, b.attempt, b.last_step, b.created_ms, b.last_seen_ms,
                  b.incarnation, b.resume_step, b.observed, b.rules_json, b.rules_source,
                  b.attachment);
}

// How an attempt began (operator.proto's AttemptStart).
enum class AttemptStart : int { kFirst = 1, kRollback = 2, kResume = 3 };

// One attempt of a run, as the operator sees it.
struct AttemptRow {
  int64_t attempt = 0;
  AttemptStart start = AttemptStart::kFirst;
  int64_t incident_id = 0;   // kRollback: the incident rolled back (0: not recorded)
  std::string incarnation;   // kResume: the incarnation that resumed
  int64_t from_step = -1;    // the step it resumed after
  int64_t first_step = -1;   // stored steps; -1 when none
  int64_t last_step = -1;
  int64_t started_ms = 0;
};

// An incarnation a run has seen.
struct IncarnationRow {
  std::string run_id;
  std::string incarnation;
  int64_t seen_ms = 0;
};

enum class IncidentState : int {
  kOpen = 1,
  kAcknowledged = 2,
  kAwaitingDecision = 3,
  kRollingBack = 4,
  kResolved = 5,
  kDismissed = 6,
};

struct IncidentRow {
  int64_t id = 0;
  std::string run_id;
  uint64_t episode = 0;
  int tier = 0;
  IncidentState state = IncidentState::kOpen;
  core::EventKind kind = core::EventKind::kSpike;  // the event that opened it
  std::string title;
  int64_t onset_step = 0;
  int64_t detection_step = 0;
  int64_t recommended_checkpoint_step = -1;
  std::string recommended_checkpoint_uri;
  std::vector<uint64_t> shards;
  std::vector<std::string> shard_names;  // the named shards, like `shards`
  std::vector<core::RecommendedAction> actions;  // what the rules recommend
  int64_t opened_ms = 0;
  int64_t updated_ms = 0;
  int64_t closed_ms = 0;     // 0 while open
  // Opened in a followed run (RunRow::observed): nothing was skipped or
  // halted, its pages say so and its rollback is a manual restart.
  bool observed = false;

  // "I-42": short enough to type.
  std::string public_id() const { return "I-" + std::to_string(id); }
};

struct CheckpointRow {
  std::string run_id;
  int64_t step = 0;
  std::string uri;
  int64_t reported_ms = 0;
};

struct EventRow {
  std::string run_id;
  int64_t incident_id = 0;
  core::Event event;
  int64_t created_ms = 0;
};

struct RankStepRow {
  std::string run_id;
  int64_t attempt = 0;
  int32_t rank = 0;
  int64_t step = 0;
  std::string report;  // the serialized StepReport, as received
};

struct CommandAckRow {
  std::string command_id;
  std::string run_id;
  int32_t rank = 0;
  int status = 0;
  std::string message;
  int64_t resumed_step = -1;
  int64_t at_ms = 0;
};

struct DecisionRow {
  int64_t id = 0;
  int64_t incident_id = 0;
  std::string run_id;
  std::string actor;
  std::string kind;     // "approve_rollback" | "reject_rollback"
  std::string comment;
  std::string payload;  // the serialized trainwatch.v1.Decision
  std::string idempotency_key;  // empty: none
  int64_t at_ms = 0;
};

struct CommandRow {
  std::string id;
  std::string run_id;
  int64_t incident_id = 0;
  std::string kind;     // "rollback"
  std::string payload;  // the serialized trainwatch.v1.Command
  int64_t created_ms = 0;
};

// An id range [first, last], or, when `name` is not empty, one named shard
// (first and last unused).
struct QuarantineRow {
  std::string run_id;
  uint64_t first = 0;
  uint64_t last = 0;
  int64_t incident_id = 0;
  int64_t decision_id = 0;
  int64_t created_ms = 0;
  std::string name;
};

// Starts a new attempt of a run after a rollback or a resume: its steps up
// to the checkpoint are carried over, so the new attempt's history is
// complete, and how it began is recorded.
struct AttemptCopy {
  std::string run_id;
  int64_t from_attempt = 0;
  int64_t to_attempt = 0;
  int64_t up_to_step = 0;
  AttemptStart start = AttemptStart::kRollback;
  int64_t incident_id = 0;  // kRollback
  std::string incarnation;  // kResume
  int64_t started_ms = 0;
};

// One page to deliver: an incident's state change for one receiver.
struct OutboxRow {
  int64_t id = 0;  // assigned by the store
  int64_t incident_id = 0;
  std::string channel;  // the receiver's name
  std::string kind;     // "trigger:<state>", "update:<state>", "resolve:<state>"
  std::string payload;  // the HTTP body
  std::string state = "pending";  // pending | sent
  int attempts = 0;
  int64_t next_attempt_ms = 0;
  std::string last_error;
  int64_t created_ms = 0;
  int64_t sent_ms = 0;
};

// A rule-engine snapshot of one run's attempt after `step`
// (RuleEngine::SaveState), with the attempt's counts up to that step, so a
// rebuild starts from it (engine_snapshots.cc).
struct EngineSnapshotRow {
  std::string run_id;
  int64_t attempt = 0;
  int64_t step = 0;
  int64_t skipped = 0;    // steps decided kSkipUpdate, up to `step`
  int64_t overflows = 0;  // loss-scale overflow steps, up to `step`
  int64_t written_ms = 0;
  std::string state;
};

// Everything one ingest cycle writes, in one transaction.
struct WriteBatch {
  std::vector<RunRow> runs;  // upserts
  struct Step {
    std::string run_id;
    int64_t attempt = 0;
    StepRow step;
  };
  std::vector<Step> steps;
  std::vector<RankStepRow> rank_steps;
  std::vector<CheckpointRow> checkpoints;
  std::vector<EventRow> events;
  std::vector<IncidentRow> incidents;  // upserts by id
  std::vector<CommandAckRow> command_acks;
  std::vector<DecisionRow> decisions;
  std::vector<CommandRow> commands;
  std::vector<QuarantineRow> quarantines;
  std::vector<AttemptCopy> attempt_copies;  // run after the steps of this batch
  std::vector<IncarnationRow> incarnations;  // a repeated one is ignored
  std::vector<OutboxRow> outbox;  // new pages; one per (incident, channel, kind)
  std::vector<EngineSnapshotRow> engine_snapshots;

  bool empty() const {
    return runs.empty() && steps.empty() && rank_steps.empty() && checkpoints.empty() &&
           events.empty() && incidents.empty() && command_acks.empty() && decisions.empty() &&
           commands.empty() && quarantines.empty() && attempt_copies.empty() &&
           incarnations.empty() && outbox.empty() && engine_snapshots.empty();
  }
  void clear();
};

struct IncidentFilter {
  std::string run_id;  // empty: every run
  bool open_only = false;
  int tier = -1;       // -1: every tier
  int64_t after_id = 0;  // paging: ids greater than this
  int limit = 100;
};

struct StoreOptions {
  enum class Synchronous { kFull, kNormal };
  // SQLite: what a commit waits for (sqlite_store.h). kFull is the safe
  // default. PostgreSQL takes only kFull: there the server's
  // synchronous_commit decides, and the ack rule holds whatever it says.
  Synchronous synchronous = Synchronous::kFull;
  // SQLite: a quota on the database file (PRAGMA max_page_count on every
  // connection): past it a write fails as on a full disk (SQLITE_FULL), the
  // batch is not acknowledged and the agents re-send it later (ingest.h).
  // 0: no quota. A quota below the file's current size holds it at that
  // size. PostgreSQL takes only 0: its quotas are the server's.
  int64_t max_bytes = 0;
  // SQLite: how long a write waits for another connection's lock before it
  // fails (SQLITE_BUSY, handled like any store error). Unused by PostgreSQL,
  // where nothing on the commit path is timed out.
  int busy_timeout_ms = 5000;
  // Rule-engine snapshots kept per run attempt, the newest (>= 1): the
  // newest serves a restart, older ones a resume or rollback to an earlier
  // step. Each is ~0.3 MB with the default windows.
  int engine_snapshots_kept = 3;
  // PostgreSQL with replicas (trainwatchd --replica): this replica's shard
  // leases. Every write transaction then checks them (ShardLeases::
  // CheckFence) and a commit is acknowledged only while they hold; nullptr:
  // no fencing (one trainwatchd per database). Must outlive the store.
  ShardLeases* fence = nullptr;
};

// A counter a backend keeps of its own work, read live at scrape time
// (Store::Counters): the exporter prints each under its name.
struct StoreCounter {
  std::string name;  // a Prometheus counter name, trainwatch_store_..._total
  std::string help;
  int64_t value = 0;
};

class Store {
 public:
  // Opens (creating if needed) and migrates the database `db`: a
  // "postgresql://" or "postgres://" URI, or a libpq keyword string
  // ("host=... dbname=..."), selects PostgreSQL; anything else is the path
  // of a SQLite file.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& db,
                                                     const StoreOptions& options = {});
  // Whether Open would take `db` for PostgreSQL.
  static bool IsPostgres(const std::string& db);

  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Writes the batch in one transaction; durable when it returns OK. A
  // repeated step (same run, attempt and step) or rank record is ignored:
  // this is where (run, rank, step) deduplication becomes durable.
  virtual absl::Status Write(const WriteBatch& batch) = 0;

  // ---- rebuild on start (writer thread)
  virtual absl::StatusOr<std::vector<RunRow>> LoadRuns() = 0;
  // Every evaluated (not late) step of the run's attempt after `after_step`
  // in step order, with the checkpoint uri reported at that step (empty if
  // none).
  virtual absl::Status ForEachStep(
      const std::string& run_id, int64_t attempt,
      const std::function<void(const StepRow&, const std::string&)>& fn,
      int64_t after_step = -1) = 0;
  // The attempt's newest rule-engine snapshot at or before `max_step`.
  virtual absl::StatusOr<std::optional<EngineSnapshotRow>> LatestEngineSnapshot(
      const std::string& run_id, int64_t attempt, int64_t max_step) = 0;
  // Per-rank reports of one step (any thread), by rank.
  virtual absl::StatusOr<std::vector<RankStepRow>> RankStepsAt(const std::string& run_id,
                                                               int64_t attempt, int64_t step) = 0;
  // Per-rank reports after `step`, by step then rank.
  virtual absl::StatusOr<std::vector<RankStepRow>> LoadRankStepsAfter(const std::string& run_id,
                                                                      int64_t attempt,
                                                                      int64_t step) = 0;
  // Every incarnation the run has seen.
  virtual absl::StatusOr<std::vector<std::string>> Incarnations(const std::string& run_id) = 0;
  // The largest id stored; 0 when none.
  virtual absl::StatusOr<int64_t> MaxIncidentId() = 0;
  virtual absl::StatusOr<int64_t> MaxDecisionId() = 0;
  // The decision recorded under an idempotency key, if any.
  virtual absl::StatusOr<std::optional<DecisionRow>> FindDecisionByKey(const std::string& key) = 0;
  // The latest rollback command of an incident, and every acknowledgement
  // of it by `run_id`'s agents: (rank, status, resumed step).
  virtual absl::StatusOr<std::optional<CommandRow>> LatestCommand(int64_t incident_id) = 0;
  virtual absl::StatusOr<std::vector<CommandAckRow>> CommandAcks(
      const std::string& run_id, const std::string& command_id) = 0;

  // ---- queries (any thread)
  virtual absl::StatusOr<std::vector<IncidentRow>> ListIncidents(const IncidentFilter& filter) = 0;
  virtual absl::StatusOr<std::optional<IncidentRow>> GetIncident(int64_t id) = 0;
  virtual absl::StatusOr<std::vector<EventRow>> EventsOfIncident(int64_t id) = 0;
  // The last `limit` steps of the run's attempt, oldest first.
  virtual absl::StatusOr<std::vector<StepRow>> RecentSteps(const std::string& run_id,
                                                           int64_t attempt, int limit) = 0;
  virtual absl::StatusOr<std::vector<StepRow>> StepsBetween(const std::string& run_id,
                                                            int64_t attempt, int64_t first,
                                                            int64_t last) = 0;
  virtual absl::StatusOr<std::vector<CheckpointRow>> Checkpoints(const std::string& run_id) = 0;
  // (shard, incident id), by shard.
  virtual absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> FlaggedShards(
      const std::string& run_id) = 0;
  // Steps of every attempt of the run.
  virtual absl::StatusOr<int64_t> CountSteps(const std::string& run_id) = 0;
  // The run's attempts, 0 first, up to `current` (the run's attempt), each
  // with the first and last step stored in it.
  virtual absl::StatusOr<std::vector<AttemptRow>> Attempts(const std::string& run_id,
                                                           int64_t current) = 0;
  // Evaluated (not late) steps of the attempt whose update the rules
  // skipped, and those with a loss-scale overflow; read from partial
  // indexes, at any history's length.
  virtual absl::StatusOr<int64_t> CountSkipped(const std::string& run_id, int64_t attempt) = 0;
  virtual absl::StatusOr<int64_t> CountLossScaleOverflows(const std::string& run_id,
                                                          int64_t attempt) = 0;
  virtual absl::StatusOr<std::vector<DecisionRow>> DecisionsOfIncident(int64_t incident_id) = 0;
  virtual absl::StatusOr<std::vector<QuarantineRow>> Quarantines(const std::string& run_id) = 0;
  // Pages due for delivery (pending, next attempt reached), oldest first.
  virtual absl::StatusOr<std::vector<OutboxRow>> DueOutbox(int64_t now_ms, int limit) = 0;
  virtual absl::StatusOr<std::vector<OutboxRow>> Outbox(int64_t incident_id) = 0;
  // Records a delivery attempt's outcome.
  virtual absl::Status MarkOutbox(int64_t id, bool sent, int attempts, int64_t next_attempt_ms,
                                  const std::string& error, int64_t now_ms) = 0;

  // Schema version after migrations (each backend counts its own).
  virtual int schema_version() const = 0;
  // The backend's own counters, read live (any thread).
  virtual std::vector<StoreCounter> Counters() const = 0;

 protected:
  Store() = default;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_STORE_H_
