#include "store/pg/pg_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "store/pg/pg_migrations.h"
#include "store/pg/pg_store_writes.h"
#include "store/pg/pg_values.h"
#include "store/pg/shard_leases.h"
#include "store/row_readers.h"
#include "trainwatch/core/event.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server {

namespace {

using rows::kDecisionColumns;
using rows::kIncidentColumns;
using rows::kOutboxColumns;
using rows::kStepColumnCount;
using rows::kStepColumns;
using rows::ReadDecision;
using rows::ReadIncident;
using rows::ReadOutbox;
using rows::ReadStep;
using pg::Bool;
using pg::Cells;
using pg::Params;
using pg::Query;
using pg::QueryFirst;
using pg::QueryInt;
using pg::Run;
using pg::WriteTables;

// Phase 1 (active/standby): a writer owns every shard, and a batch's rows
// (runs, incidents, the outbox) are checked against all of them.
std::vector<int> AllShards(const ShardLeases& leases) {
  std::vector<int> all(static_cast<size_t>(leases.shards()));
  for (int s = 0; s < leases.shards(); ++s) all[static_cast<size_t>(s)] = s;
  return all;
}

absl::StatusOr<std::vector<RunRow>> Runs(PgConnection& c) {
  return Query(c,
               "SELECT runs.run_id, world_size, attempt, last_step, created_ms, last_seen_ms, "
               "incarnation, resume_step, observed, COALESCE(rules_json, ''), "
               "COALESCE(rules_source, ''), COALESCE(attachment, '') FROM runs "
               "LEFT JOIN run_rules USING (run_id) LEFT JOIN run_attachments USING (run_id) "
               "ORDER BY runs.run_id",
               {}, rows::ReadRun<Cells>);
}

absl::StatusOr<std::vector<AttemptRow>> Attempts(PgConnection& c, const std::string& run_id,
                                                 int64_t current) {
  std::vector<AttemptRow> out(static_cast<size_t>(std::max<int64_t>(current, 0)) + 1);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].attempt = static_cast<int64_t>(i);
    out[i].start = i == 0 ? AttemptStart::kFirst : AttemptStart::kRollback;
  }
  absl::StatusOr<PgRows> how = c.Execute(
      "SELECT attempt, start, incident_id, incarnation, from_step, started_ms FROM attempts "
      "WHERE run_id = $1::text AND attempt >= 0 AND attempt <= $2::bigint",
      {run_id, current});
  if (!how.ok()) return how.status();
  for (int i = 0; i < how->rows(); ++i) {
    const Cells r(*how, i);
    AttemptRow& a = out[static_cast<size_t>(r.Int(0))];
    a.start = static_cast<AttemptStart>(r.Int(1));
    a.incident_id = r.Int(2);
    a.incarnation = r.Text(3);
    a.from_step = r.Int(4);
    a.started_ms = r.Int(5);
  }
  absl::StatusOr<PgRows> range = c.Execute(
      "SELECT attempt, MIN(step), MAX(step) FROM steps WHERE run_id = $1::text AND "
      "attempt >= 0 AND attempt <= $2::bigint GROUP BY attempt",
      {run_id, current});
  if (!range.ok()) return range.status();
  for (int i = 0; i < range->rows(); ++i) {
    const Cells r(*range, i);
    AttemptRow& a = out[static_cast<size_t>(r.Int(0))];
    a.first_step = r.Int(1);
    a.last_step = r.Int(2);
  }
  return out;
}

absl::StatusOr<std::vector<RankStepRow>> SelectRankSteps(PgConnection& c,
                                                         const std::string& run_id,
                                                         int64_t attempt, absl::string_view op,
                                                         int64_t step) {
  return Query(c,
               absl::StrCat("SELECT rank, step, report FROM rank_steps WHERE run_id = $1::text "
                            "AND attempt = $2::bigint AND step ",
                            op, " $3::bigint ORDER BY step, rank"),
               {run_id, attempt, step},
               [&](const Cells& r) { return rows::ReadRankStep(r, run_id, attempt); });
}

const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

// Runs fn on *conn, connecting first when there is none. A connection that
// failed as unavailable (lost, or a commit refused under the ack rule) is
// dropped, and the next call connects again: to the same server after it
// restarted, or, with a multi-host conninfo, to whichever is the primary.
template <typename Fn>
auto WithConnection(std::unique_ptr<PgConnection>& conn, const std::string& conninfo,
                    PgCommitCounters* counters, Fn fn)
    -> decltype(fn(std::declval<PgConnection&>())) {
  if (conn == nullptr) {
    absl::StatusOr<std::unique_ptr<PgConnection>> c = PgConnection::Connect(conninfo, counters);
    if (!c.ok()) return c.status();
    conn = *std::move(c);
  }
  auto result = fn(*conn);
  if (StatusOf(result).code() == absl::StatusCode::kUnavailable) conn.reset();
  return result;
}

// ForEachStep reads the history this many steps at a time: a long run's
// whole history would otherwise be one result in memory.
constexpr int64_t kStepsPerRead = 10000;

}  // namespace

template <typename Fn>
auto PgStore::OnWriter(Fn fn) -> decltype(fn(std::declval<PgConnection&>())) {
  return WithConnection(writer_, conninfo_, &counters_, std::move(fn));
}

template <typename Fn>
auto PgStore::OnReader(Fn fn) -> decltype(fn(std::declval<PgConnection&>())) {
  absl::MutexLock lock(&read_mu_);
  return WithConnection(reader_, conninfo_, &counters_, std::move(fn));
}

absl::StatusOr<std::unique_ptr<PgStore>> PgStore::Open(const std::string& conninfo,
                                                       const StoreOptions& options) {
  if (options.engine_snapshots_kept < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine snapshots kept must be >= 1, got ", options.engine_snapshots_kept));
  }
  if (options.max_bytes != 0) {
    return absl::InvalidArgumentError(
        "a database quota (--db_max_bytes) applies to SQLite only: PostgreSQL's quotas are its "
        "server's");
  }
  if (options.synchronous != StoreOptions::Synchronous::kFull) {
    return absl::InvalidArgumentError(
        "--db_synchronous normal applies to SQLite only: with PostgreSQL, what a commit waits "
        "for is the server's synchronous_commit");
  }
  std::unique_ptr<PgStore> store(
      new PgStore(conninfo, options.engine_snapshots_kept, options.fence));
  absl::StatusOr<std::unique_ptr<PgConnection>> writer =
      PgConnection::Connect(conninfo, &store->counters_);
  if (!writer.ok()) return writer.status();
  store->writer_ = *std::move(writer);
  absl::StatusOr<int> version = MigratePgSchema(*store->writer_);
  if (!version.ok()) return version.status();
  store->schema_version_ = *version;
  absl::StatusOr<std::unique_ptr<PgConnection>> reader =
      PgConnection::Connect(conninfo, &store->counters_);
  if (!reader.ok()) return reader.status();
  absl::MutexLock lock(&store->read_mu_);
  store->reader_ = *std::move(reader);
  return store;
}

PgStore::~PgStore() = default;

std::vector<StoreCounter> PgStore::Counters() const {
  return {{"trainwatch_store_replication_doubts_total",
           "Commits PostgreSQL reported done whose wait for the synchronous standby was "
           "cancelled: refused, never acknowledged.",
           counters_.replication_doubts()}};
}

absl::Status PgStore::Write(const WriteBatch& b) {
  if (b.empty()) return absl::OkStatus();
  return OnWriter([&](PgConnection& c) -> absl::Status {
    if (absl::Status s = c.Begin(); !s.ok()) return s;
    // Fenced first: the lease rows read FOR SHARE make a takeover wait for
    // this commit, or this transaction sees the takeover's epoch.
    absl::Status s = fence_ != nullptr ? fence_->CheckFence(c, AllShards(*fence_))
                                       : absl::OkStatus();
    if (s.ok()) s = WriteTables(c, b, engine_snapshots_kept_);
    if (s.ok()) {
      s = c.Commit();  // the ack rule is Commit's
      // Committed, but the lease may have lapsed while the commit waited (a
      // slow standby, a pause): acknowledged now, it could follow a
      // takeover. The agents re-send it to the new owner, which stores it
      // once.
      if (s.ok() && fence_ != nullptr && !fence_->MayAcknowledge(0)) {
        return absl::UnavailableError("fenced: the lease lapsed during the commit; not acknowledged");
      }
      return s;
    }
    if (absl::Status r = c.Rollback(); !r.ok()) {
      // A connection left inside a transaction would refuse every later
      // batch: as unavailable, it is dropped and opened again.
      return absl::UnavailableError(
          absl::StrCat(s.message(), "; and the rollback failed: ", r.message()));
    }
    return s;
  });
}

// ---- the writer's connection (the writer thread)

absl::StatusOr<std::vector<RunRow>> PgStore::LoadRuns() {
  return OnWriter([](PgConnection& c) { return Runs(c); });
}

absl::Status PgStore::ForEachStep(
    const std::string& run_id, int64_t attempt,
    const std::function<void(const StepRow&, const std::string&)>& fn, int64_t after_step) {
  return OnWriter([&](PgConnection& c) -> absl::Status {
    const std::string sql = absl::StrCat(
        "SELECT ", kStepColumns,
        ", (SELECT uri FROM checkpoints c WHERE c.run_id = s.run_id AND c.step = s.step) "
        "FROM steps s WHERE run_id = $1::text AND attempt = $2::bigint AND NOT late AND "
        "step > $3::bigint ORDER BY step LIMIT $4::bigint");
    for (int64_t after = after_step;;) {
      absl::StatusOr<PgRows> rows = c.Execute(sql, {run_id, attempt, after, kStepsPerRead});
      if (!rows.ok()) return rows.status();
      for (int i = 0; i < rows->rows(); ++i) {
        const Cells r(*rows, i);
        const StepRow step = ReadStep(r);
        after = step.step;
        fn(step, r.Text(kStepColumnCount));
      }
      if (rows->rows() < kStepsPerRead) return absl::OkStatus();
    }
  });
}

absl::StatusOr<std::optional<EngineSnapshotRow>> PgStore::LatestEngineSnapshot(
    const std::string& run_id, int64_t attempt, int64_t max_step) {
  return OnWriter([&](PgConnection& c) {
    return QueryFirst(c,
                      "SELECT step, skipped, overflows, written_ms, state FROM engine_snapshots "
                      "WHERE run_id = $1::text AND attempt = $2::bigint AND step <= $3::bigint "
                      "ORDER BY step DESC LIMIT 1",
                      {run_id, attempt, max_step}, [&](const Cells& r) {
                        return EngineSnapshotRow{run_id,   attempt,  r.Int(0),  r.Int(1),
                                                 r.Int(2), r.Int(3), r.Blob(4)};
                      });
  });
}

absl::StatusOr<std::vector<RankStepRow>> PgStore::LoadRankStepsAfter(const std::string& run_id,
                                                                     int64_t attempt,
                                                                     int64_t step) {
  return OnWriter(
      [&](PgConnection& c) { return SelectRankSteps(c, run_id, attempt, ">", step); });
}

absl::StatusOr<std::vector<std::string>> PgStore::Incarnations(const std::string& run_id) {
  return OnWriter([&](PgConnection& c) {
    return Query(c, "SELECT incarnation FROM incarnations WHERE run_id = $1::text", {run_id},
                 [](const Cells& r) { return r.Text(0); });
  });
}

absl::StatusOr<int64_t> PgStore::MaxIncidentId() {
  return OnWriter([](PgConnection& c) {
    return QueryInt(c, "SELECT COALESCE(MAX(id), 0) FROM incidents", {});
  });
}

absl::StatusOr<int64_t> PgStore::MaxDecisionId() {
  return OnWriter([](PgConnection& c) {
    return QueryInt(c, "SELECT COALESCE(MAX(id), 0) FROM decisions", {});
  });
}

absl::StatusOr<std::optional<DecisionRow>> PgStore::FindDecisionByKey(const std::string& key) {
  return OnWriter([&](PgConnection& c) {
    return QueryFirst(
        c,
        absl::StrCat("SELECT ", kDecisionColumns,
                     " FROM decisions WHERE idempotency_key = $1::text"),
        {key}, ReadDecision<Cells>);
  });
}

absl::StatusOr<std::optional<CommandRow>> PgStore::LatestCommand(int64_t incident_id) {
  return OnWriter([&](PgConnection& c) {
    return QueryFirst(c,
                      "SELECT id, run_id, incident_id, kind, payload, created_ms FROM commands "
                      "WHERE incident_id = $1::bigint ORDER BY created_ms DESC, id DESC LIMIT 1",
                      {incident_id}, [](const Cells& r) {
                        return CommandRow{r.Text(0), r.Text(1),  r.Int(2),
                                          r.Text(3), r.Blob(4), r.Int(5)};
                      });
  });
}

absl::StatusOr<std::vector<CommandAckRow>> PgStore::CommandAcks(const std::string& run_id,
                                                                const std::string& command_id) {
  return OnWriter([&](PgConnection& c) {
    return Query(c,
                 "SELECT command_id, run_id, rank, status, message, resumed_step, at_ms FROM "
                 "command_acks WHERE command_id = $1::text AND run_id = $2::text "
                 "ORDER BY at_ms, rank, status",
                 {command_id, run_id}, [](const Cells& r) {
                   return CommandAckRow{r.Text(0),
                                        r.Text(1),
                                        static_cast<int32_t>(r.Int(2)),
                                        static_cast<int>(r.Int(3)),
                                        r.Text(4),
                                        r.Int(5),
                                        r.Int(6)};
                 });
  });
}

// ---- the read connection (any thread, one at a time)

absl::StatusOr<std::vector<RankStepRow>> PgStore::RankStepsAt(const std::string& run_id,
                                                              int64_t attempt, int64_t step) {
  return OnReader(
      [&](PgConnection& c) { return SelectRankSteps(c, run_id, attempt, "=", step); });
}

absl::StatusOr<std::vector<IncidentRow>> PgStore::ListIncidents(const IncidentFilter& f) {
  return OnReader([&](PgConnection& c) -> absl::StatusOr<std::vector<IncidentRow>> {
    absl::Status bad;
    absl::StatusOr<std::vector<IncidentRow>> rows = Query(
        c,
        absl::StrCat("SELECT ", kIncidentColumns,
                     " FROM incidents WHERE ($1::text = '' OR run_id = $1::text) AND "
                     "($2::boolean = false OR state NOT IN (5, 6)) AND "
                     "($3::integer < 0 OR tier = $3::integer) AND id > $4::bigint "
                     "ORDER BY id LIMIT $5::bigint"),
        {f.run_id, Bool(f.open_only), f.tier, f.after_id, f.limit},
        [&bad](const Cells& r) { return ReadIncident(r, &bad); });
    if (!bad.ok()) return bad;
    return rows;
  });
}

absl::StatusOr<std::optional<IncidentRow>> PgStore::GetIncident(int64_t id) {
  return OnReader([&](PgConnection& c) -> absl::StatusOr<std::optional<IncidentRow>> {
    absl::Status bad;
    absl::StatusOr<std::optional<IncidentRow>> row = QueryFirst(
        c, absl::StrCat("SELECT ", kIncidentColumns, " FROM incidents WHERE id = $1::bigint"),
        {id}, [&bad](const Cells& r) { return ReadIncident(r, &bad); });
    if (!bad.ok()) return bad;
    return row;
  });
}

absl::StatusOr<std::vector<EventRow>> PgStore::EventsOfIncident(int64_t id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 absl::StrCat("SELECT ", rows::kEventColumns,
                              " FROM events WHERE incident_id = $1::bigint ORDER BY id"),
                 {id}, [&](const Cells& q) { return rows::ReadEvent(q, id); });
  });
}

absl::StatusOr<std::vector<StepRow>> PgStore::RecentSteps(const std::string& run_id,
                                                          int64_t attempt, int limit) {
  return OnReader([&](PgConnection& c) {
    absl::StatusOr<std::vector<StepRow>> out =
        Query(c,
              absl::StrCat("SELECT ", kStepColumns,
                           " FROM steps WHERE run_id = $1::text AND attempt = $2::bigint "
                           "ORDER BY step DESC LIMIT $3::bigint"),
              {run_id, attempt, limit}, ReadStep<Cells>);
    if (out.ok()) std::reverse(out->begin(), out->end());
    return out;
  });
}

absl::StatusOr<std::vector<StepRow>> PgStore::StepsBetween(const std::string& run_id,
                                                           int64_t attempt, int64_t first,
                                                           int64_t last) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 absl::StrCat("SELECT ", kStepColumns,
                              " FROM steps WHERE run_id = $1::text AND attempt = $2::bigint AND "
                              "step >= $3::bigint AND step <= $4::bigint ORDER BY step"),
                 {run_id, attempt, first, last}, ReadStep<Cells>);
  });
}

absl::StatusOr<std::vector<CheckpointRow>> PgStore::Checkpoints(const std::string& run_id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 "SELECT step, uri, reported_ms FROM checkpoints WHERE run_id = $1::text "
                 "ORDER BY step",
                 {run_id}, [&](const Cells& r) {
                   return CheckpointRow{run_id, r.Int(0), r.Text(1), r.Int(2)};
                 });
  });
}

absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> PgStore::FlaggedShards(
    const std::string& run_id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 "SELECT shard, incident_id FROM flagged_shards WHERE run_id = $1::text "
                 "ORDER BY shard, incident_id",
                 {run_id}, [](const Cells& r) {
                   return std::pair<uint64_t, int64_t>(static_cast<uint64_t>(r.Int(0)),
                                                       r.Int(1));
                 });
  });
}

absl::StatusOr<int64_t> PgStore::CountSteps(const std::string& run_id) {
  return OnReader([&](PgConnection& c) {
    return QueryInt(c, "SELECT COUNT(*) FROM steps WHERE run_id = $1::text", {run_id});
  });
}

absl::StatusOr<std::vector<AttemptRow>> PgStore::Attempts(const std::string& run_id,
                                                          int64_t current) {
  return OnReader([&](PgConnection& c) { return server::Attempts(c, run_id, current); });
}

absl::StatusOr<int64_t> PgStore::CountSkipped(const std::string& run_id, int64_t attempt) {
  // The WHERE implies the partial index's own (migration 1), so the planner
  // reads the rare rows it holds.
  static_assert(static_cast<int>(core::Decision::kSkipUpdate) == 1);
  return OnReader([&](PgConnection& c) {
    return QueryInt(c,
                    "SELECT COUNT(*) FROM steps WHERE run_id = $1::text AND attempt = $2::bigint "
                    "AND decision = 1 AND NOT late",
                    {run_id, attempt});
  });
}

absl::StatusOr<int64_t> PgStore::CountLossScaleOverflows(const std::string& run_id,
                                                         int64_t attempt) {
  return OnReader([&](PgConnection& c) {
    return QueryInt(c,
                    "SELECT COUNT(*) FROM steps WHERE run_id = $1::text AND attempt = $2::bigint "
                    "AND loss_scale_overflow AND NOT late",
                    {run_id, attempt});
  });
}

absl::StatusOr<std::vector<DecisionRow>> PgStore::DecisionsOfIncident(int64_t incident_id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 absl::StrCat("SELECT ", kDecisionColumns,
                              " FROM decisions WHERE incident_id = $1::bigint ORDER BY id"),
                 {incident_id}, ReadDecision<Cells>);
  });
}

absl::StatusOr<std::vector<QuarantineRow>> PgStore::Quarantines(const std::string& run_id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 "SELECT first_shard, last_shard, incident_id, decision_id, created_ms, name "
                 "FROM quarantined_shards WHERE run_id = $1::text ORDER BY id",
                 {run_id}, [&](const Cells& r) { return rows::ReadQuarantine(r, run_id); });
  });
}

absl::StatusOr<std::vector<OutboxRow>> PgStore::DueOutbox(int64_t now_ms, int limit) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 absl::StrCat("SELECT ", kOutboxColumns,
                              " FROM outbox WHERE state = 'pending' AND "
                              "next_attempt_ms <= $1::bigint ORDER BY id LIMIT $2::bigint"),
                 {now_ms, limit}, ReadOutbox<Cells>);
  });
}

absl::StatusOr<std::vector<OutboxRow>> PgStore::Outbox(int64_t incident_id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 absl::StrCat("SELECT ", kOutboxColumns,
                              " FROM outbox WHERE incident_id = $1::bigint ORDER BY id"),
                 {incident_id}, ReadOutbox<Cells>);
  });
}

absl::Status PgStore::MarkOutbox(int64_t id, bool sent, int attempts, int64_t next_attempt_ms,
                                 const std::string& error, int64_t now_ms) {
  // On the read connection under its mutex, as the SQLite backend does; the
  // statement commits by itself, under the ack rule like any commit.
  return OnReader([&](PgConnection& c) {
    return Run(c,
               "UPDATE outbox SET state = $2::text, attempts = $3::integer, "
               "next_attempt_ms = $4::bigint, last_error = $5::text, sent_ms = $6::bigint "
               "WHERE id = $1::bigint",
               {id, sent ? "sent" : "pending", attempts, next_attempt_ms, error,
                sent ? now_ms : int64_t{0}});
  });
}

}  // namespace trainwatch::server
