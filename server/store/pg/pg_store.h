// The PostgreSQL backend of the Store (store.h), through libpq
// (pg_connection.h): the same tables as the SQLite backend, with their own
// migrations (pg_migrations.h), so that trainwatchd's system of record can
// live on a server that is replicated.
//
// What durable means here: Write() returns OK only when PostgreSQL's COMMIT
// did, which with synchronous_commit=on and a synchronous standby means the
// batch is flushed on two machines; a commit whose wait for the standby was
// cancelled is refused ("replication doubt", the ack rule) and comes back as
// an error, so the ingest does not acknowledge it and the agents re-send
// it. Nothing on the commit path has a timeout or is cancelled.
//
// Connections: the writer's (Write and the rebuild readers, on the writer
// thread), and one for the queries of any thread under a mutex, as the
// SQLite backend's read connection. A connection that failed as unavailable
// is dropped and opened again at its next use, so a restarted server (or,
// with a multi-host conninfo, a promoted standby) is reached again without
// restarting trainwatchd.
//
// The batch's inserts are pg_store_writes.cc, the text formats and query
// helpers both use pg_values.h; this file is the connections and the reads.

#ifndef TRAINWATCH_SERVER_STORE_PG_PG_STORE_H_
#define TRAINWATCH_SERVER_STORE_PG_PG_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "store/pg/pg_connection.h"
#include "store/store.h"

namespace trainwatch::server {

class PgStore final : public Store {
 public:
  // Connects with `conninfo` (a postgresql:// URI or libpq keywords) and
  // migrates the database's schema. StoreOptions' SQLite knobs must be left
  // at their defaults (max_bytes 0, synchronous kFull): a quota or a weaker
  // commit is the PostgreSQL server's to set.
  static absl::StatusOr<std::unique_ptr<PgStore>> Open(const std::string& conninfo,
                                                       const StoreOptions& options = {});
  ~PgStore() override;

  absl::Status Write(const WriteBatch& batch) override;

  absl::StatusOr<std::vector<RunRow>> LoadRuns() override;
  absl::Status ForEachStep(const std::string& run_id, int64_t attempt,
                           const std::function<void(const StepRow&, const std::string&)>& fn,
                           int64_t after_step) override;
  absl::StatusOr<std::optional<EngineSnapshotRow>> LatestEngineSnapshot(
      const std::string& run_id, int64_t attempt, int64_t max_step) override;
  absl::StatusOr<std::vector<RankStepRow>> RankStepsAt(const std::string& run_id,
                                                       int64_t attempt, int64_t step) override;
  absl::StatusOr<std::vector<RankStepRow>> LoadRankStepsAfter(const std::string& run_id,
                                                              int64_t attempt,
                                                              int64_t step) override;
  absl::StatusOr<std::vector<std::string>> Incarnations(const std::string& run_id) override;
  absl::StatusOr<int64_t> MaxIncidentId() override;
  absl::StatusOr<int64_t> MaxDecisionId() override;
  absl::StatusOr<std::optional<DecisionRow>> FindDecisionByKey(const std::string& key) override;
  absl::StatusOr<std::optional<CommandRow>> LatestCommand(int64_t incident_id) override;
  absl::StatusOr<std::vector<CommandAckRow>> CommandAcks(const std::string& run_id,
                                                         const std::string& command_id) override;

  absl::StatusOr<std::vector<IncidentRow>> ListIncidents(const IncidentFilter& filter) override;
  absl::StatusOr<std::optional<IncidentRow>> GetIncident(int64_t id) override;
  absl::StatusOr<std::vector<EventRow>> EventsOfIncident(int64_t id) override;
  absl::StatusOr<std::vector<StepRow>> RecentSteps(const std::string& run_id, int64_t attempt,
                                                   int limit) override;
  absl::StatusOr<std::vector<StepRow>> StepsBetween(const std::string& run_id, int64_t attempt,
                                                    int64_t first, int64_t last) override;
  absl::StatusOr<std::vector<CheckpointRow>> Checkpoints(const std::string& run_id) override;
  absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> FlaggedShards(
      const std::string& run_id) override;
  absl::StatusOr<int64_t> CountSteps(const std::string& run_id) override;
  absl::StatusOr<std::vector<AttemptRow>> Attempts(const std::string& run_id,
                                                   int64_t current) override;
  absl::StatusOr<int64_t> CountSkipped(const std::string& run_id, int64_t attempt) override;
  absl::StatusOr<int64_t> CountLossScaleOverflows(const std::string& run_id,
                                                  int64_t attempt) override;
  absl::StatusOr<std::vector<DecisionRow>> DecisionsOfIncident(int64_t incident_id) override;
  absl::StatusOr<std::vector<QuarantineRow>> Quarantines(const std::string& run_id) override;
  absl::StatusOr<std::vector<OutboxRow>> DueOutbox(int64_t now_ms, int limit) override;
  absl::StatusOr<std::vector<OutboxRow>> Outbox(int64_t incident_id) override;
  absl::Status MarkOutbox(int64_t id, bool sent, int attempts, int64_t next_attempt_ms,
                          const std::string& error, int64_t now_ms) override;

  int schema_version() const override { return schema_version_; }
  // Commits refused by the ack rule.
  std::vector<StoreCounter> Counters() const override;
  int64_t replication_doubts() const { return counters_.replication_doubts(); }

 private:
  PgStore(std::string conninfo, int engine_snapshots_kept, ShardLeases* fence)
      : conninfo_(std::move(conninfo)),
        engine_snapshots_kept_(engine_snapshots_kept),
        fence_(fence) {}

  // Runs fn on the writer's connection (the writer thread), connecting first
  // if there is none; a connection that failed as unavailable is dropped.
  template <typename Fn>
  auto OnWriter(Fn fn) -> decltype(fn(std::declval<PgConnection&>()));
  // The same on the read connection, under read_mu_.
  template <typename Fn>
  auto OnReader(Fn fn) -> decltype(fn(std::declval<PgConnection&>()));

  const std::string conninfo_;
  const int engine_snapshots_kept_;
  ShardLeases* const fence_;  // StoreOptions::fence
  int schema_version_ = 0;
  PgCommitCounters counters_;  // shared by every connection, over reconnects
  std::unique_ptr<PgConnection> writer_;
  absl::Mutex read_mu_;
  std::unique_ptr<PgConnection> reader_ ABSL_GUARDED_BY(read_mu_);
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_STORE_PG_PG_STORE_H_
