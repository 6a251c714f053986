// The SQLite backend of the Store (store.h): one file in WAL mode, the
// default and the embedded single-node choice.
//
// What durable means is StoreOptions::synchronous (trainwatchd
// --db_synchronous):
//   kFull (default): the commit is fsynced before Write() returns, so an
//     acknowledged record survives a crash of trainwatchd, of the kernel,
//     and a power loss.
//   kNormal: the commit is in the OS's page cache (written to the WAL file)
//     when Write() returns, and fsynced at the next WAL checkpoint (about
//     every 1,000 pages, 8 MB). An acknowledged record survives a crash of
//     trainwatchd (SIGKILL, abort, OOM kill); a power loss or kernel crash
//     may lose the commits since the last checkpoint, never the database's
//     consistency. Agents hold records only until acknowledged, so such
//     records are lost for good; choose it where the disk's fsync is slow
//     and a host's power loss is acceptable to lose seconds of records.
//
// Connections: the writer's (Write and the rebuild readers), one for the
// queries of any thread under a mutex (WAL readers do not block the
// writer), and one for WAL checkpoints, which run on a thread of their own
// (SqliteStore::Checkpointer): a commit does not wait for one.

#ifndef TRAINWATCH_SERVER_STORE_SQLITE_STORE_H_
#define TRAINWATCH_SERVER_STORE_SQLITE_STORE_H_

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
#include "store/store.h"

struct sqlite3;

namespace trainwatch::server {

class StatementCache;  // sql_statement.h

class SqliteStore final : public Store {
 public:
  // Opens (creating if needed) and migrates the database file at `path`.
  static absl::StatusOr<std::unique_ptr<SqliteStore>> Open(const std::string& path,
                                                           const StoreOptions& options = {});
  ~SqliteStore() override;

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
  // The WAL checkpoint counters below, under their metric names.
  std::vector<StoreCounter> Counters() const override;

  // WAL checkpoints done off the writer's thread, and by the writer itself
  // when the WAL outgrew them (Checkpointer); any thread.
  int64_t background_checkpoints() const;
  int64_t writer_checkpoints() const;
  // Returns once no background checkpoint is due or running: commits spaced
  // by this are spaced as a steady rate spaces them, whatever else loads the
  // machine (the checkpoint's own test).
  void AwaitBackgroundCheckpoint();

 private:
  SqliteStore() = default;
  absl::Status Migrate();
  class Checkpointer;

  sqlite3* db_ = nullptr;  // the writer's connection
  std::unique_ptr<Checkpointer> checkpointer_;
  // db_'s prepared statements, kept between commits.
  std::unique_ptr<StatementCache> statements_;
  absl::Mutex read_mu_;
  sqlite3* read_db_ ABSL_GUARDED_BY(read_mu_) = nullptr;
  int schema_version_ = 0;
  int engine_snapshots_kept_ = 3;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_STORE_SQLITE_STORE_H_
