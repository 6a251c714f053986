// The write path of trainwatchd. Streams hand every agent message to
// Submit() without waiting; one writer thread takes them in batches, keeps
// each run's state (the rule engine, per-rank aggregation, the incidents of
// its episodes), writes the batch to the store in one transaction, and only
// then tells the streams which steps are durable.
//
// The invariant: a record is acknowledged only once it is durable, and a
// run's in-memory state only ever reflects durable records. When a batch's
// transaction fails (disk full, the --db_max_bytes quota, an I/O error, a
// lock held past the busy timeout):
//   - nothing of it is acknowledged, and every run it touched is rebuilt
//     from the store (RecoverRun, as at a restart), so the engine, the
//     aggregation and the incidents forget the batch;
//   - every stream with a message in it is ended with UNAVAILABLE (the
//     listener's OnStreamFailed), and step reports still queued from such a
//     stream are dropped: its agent reconnects and re-sends everything after
//     its last acknowledged step, in order, so a NaN in the lost batch is
//     evaluated again and opens its incident;
//   - checkpoints and command acks (which agents send once and never again)
//     are kept and retried with the next batch;
//   - a decision in it is answered UNAVAILABLE, its command not sent;
//   - its pages never reach the outbox (same transaction); they are made
//     again when the re-sent records reopen the incident.
// While a rebuild itself fails (the store cannot even be read), every batch
// and decision is refused the same way until it succeeds.
//
// Per-run modes, fixed by the run's first step report:
//   global: rank 0 streams the reduced record (REPORT_SCOPE_GLOBAL); other
//           ranks' reports are rank-specific extras, stored but not merged.
//   ranks:  every rank streams its own record (REPORT_SCOPE_RANK); a step
//           completes when all world_size ranks reported or after the
//           aggregation timeout, and the missing ranks are named.
// The pieces it drives, each in its own file: step_aggregation.h (ranks
// mode), incident_tracker.h (events to incidents), rollback.h (decisions and
// commands).
//
// Thread-safety: Submit(), Snapshot(), Stats() and Flush() from any thread;
// everything else is the writer thread's.

#ifndef TRAINWATCH_SERVER_INGEST_H_
#define TRAINWATCH_SERVER_INGEST_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/clock.h"
#include "store.h"
#include "incident_tracker.h"
#include "rollback.h"
#include "step_aggregation.h"
#include "trainwatch/core/rule_engine.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::server {

struct IngestItem {
  uint64_t stream_id = 0;
  int64_t received_ms = 0;
  trainwatch::v1::AgentMessage message;
};

// Told about durable steps and incident changes, on the writer thread. An
// implementation must not block.
class IngestListener {
 public:
  virtual ~IngestListener() = default;
  // Every step report from `stream_id` for (run, rank) up to `step` is durable.
  virtual void OnDurable(uint64_t stream_id, const std::string& run_id, int32_t rank,
                         int64_t step) = 0;
  virtual void OnIncident(const IncidentRow& incident, IncidentChange change) = 0;
  // A server message (a command, the quarantine list) for every stream of
  // `run_id`, or only for `stream_id` when it is not 0.
  virtual void OnServerMessage(const std::string& run_id, uint64_t stream_id,
                               const std::string& serialized) = 0;
  // The store failed a batch holding messages from `stream_id`: end that
  // stream with `status` (UNAVAILABLE, retryable) so that its agent
  // reconnects and re-sends what was not acknowledged. No ack may reach the
  // stream after this call.
  virtual void OnStreamFailed(uint64_t stream_id, const absl::Status& status) = 0;
};

struct DecisionOutcome {
  // OK; FAILED_PRECONDITION when the incident's state refuses the decision
  // (the message says why); NOT_FOUND; INVALID_ARGUMENT.
  absl::Status status;
  std::string decision;  // the serialized trainwatch.v1.Decision
  bool replayed = false;
  IncidentState state = IncidentState::kOpen;
};

// What the exporter and the operator API read about a run.
struct RunSnapshot {
  RunRow row;
  bool rank_mode = false;
  StepRow latest;  // the last evaluated global step
  bool has_latest = false;
  int64_t skipped_total = 0;
  int64_t incidents_total[4] = {0, 0, 0, 0};  // by tier
  int64_t open_incidents[4] = {0, 0, 0, 0};
  int64_t missing_rank_steps_total = 0;
};

struct IngestStats {
  int64_t records_total = 0;      // step reports taken
  int64_t duplicates_total = 0;   // step reports already stored
  int64_t late_total = 0;         // stored, not evaluated
  int64_t rejected_total = 0;     // malformed, dropped with a log line
  int64_t batches_total = 0;
  int64_t queue_depth = 0;
  int64_t store_errors_total = 0;
  double last_commit_seconds = 0;
  double commit_seconds_sum = 0;
  int64_t last_lag_ms = 0;        // receipt to durable, last batch
};

struct IngestOptions {
  core::RuleConfig rules;
  int64_t aggregation_timeout_ms = 30'000;
  // Upper bound on one batch, to keep commits short under a flood.
  size_t max_batch_items = 50'000;
};

class Ingestor {
 public:
  Ingestor(Store* store, const IngestOptions& options, core::Clock* clock);
  ~Ingestor();
  // Fixed at construction; any thread.
  const IngestOptions& options() const { return options_; }
  Ingestor(const Ingestor&) = delete;
  Ingestor& operator=(const Ingestor&) = delete;

  // Rebuilds every run's state from the store: the rule engine by feeding it
  // the stored records again (deterministic, so windows and episodes come
  // back exactly), open incidents by episode, pending per-rank steps.
  // REQUIRES: before Start().
  absl::Status Recover();

  // REQUIRES: listener outlives the Ingestor; set before Start().
  void SetListener(IngestListener* listener) { listener_ = listener; }
  // Pages go into the outbox with the incident changes that cause them.
  // REQUIRES: pager outlives the Ingestor; set before Start().
  void SetPager(class Pager* pager) { pager_ = pager; }
  void Start();
  // Drains what was submitted, writes it, and joins the writer.
  void Stop();

  // Never blocks on the store.
  void Submit(IngestItem item);
  // Waits until everything submitted before the call is durable (tests,
  // shutdown).
  void Flush();

  std::vector<RunSnapshot> Snapshot() const;
  IngestStats Stats() const;

  // Queues a decision; `done` runs on the writer thread once it is durable
  // (or refused). Never blocks.
  void Decide(DecisionRequest request, std::function<void(DecisionOutcome)> done);

 private:
  // One run's state, rebuilt by Recover() after a restart.
  struct RunState {
    explicit RunState(const RunRow& r) : row(r), incidents(r.run_id) {}
    RunRow row;
    bool mode_known = false;
    bool rank_mode = false;
    std::unique_ptr<core::RuleEngine> engine;
    core::StepOutcome out;
    std::map<int64_t, StepAggregate> pending;  // ranks mode: steps not complete
    IncidentTracker incidents;
    StepRow latest;
    bool has_latest = false;
    bool row_dirty = false;
    int64_t skipped_total = 0;
    int64_t missing_rank_steps_total = 0;
    // The approved rollback being carried out, until every rank applied it.
    std::optional<RollbackCommand> command;
    ShardRanges quarantined;
  };

  void Loop();
  void ProcessBatch(std::vector<IngestItem>& items);
  // The failure path of ProcessBatch (see the invariant above): the runs
  // the batch touched are rebuilt, the streams of `items` ended, control
  // messages kept for the next batch.
  void FailBatch(std::vector<IngestItem>& items, const absl::Status& st, int64_t now);
  // Rebuilds the runs in stale_runs_ from the store; OK when none is left.
  absl::Status RebuildStaleRuns();
  absl::Status RecoverRun(const RunRow& row);
  RunState* RunFor(const std::string& run_id, int32_t world_size, int64_t now);
  void Handle(IngestItem& item, int64_t now);
  void HandleStep(RunState& run, const trainwatch::v1::StepReport& r, uint64_t stream,
                  int64_t now);
  // `tensors`: the report's per-tensor statistics, if any (names the source
  // of a numerical failure).
  void Evaluate(RunState& run, StepRow step, int64_t now,
                absl::Span<const core::TensorStat> tensors = {});
  void CompletePending(RunState& run, int64_t now, bool force);
  // Incident changes are written with this batch and heard after commit.
  IncidentSink sink() { return {&batch_, &changed_incidents_}; }
  void PublishSnapshot();
  // ingest_decisions.cc: the operator's decisions and the commands they
  // become.
  DecisionOutcome RunDecision(const DecisionRequest& r, int64_t now);
  void HandleCommandAck(RunState& run, const trainwatch::v1::CommandAck& a, int64_t now);
  void CompleteRollback(RunState& run, int64_t now);
  void SendPendingCommand(RunState& run, uint64_t stream, int32_t rank);

  Store* store_;
  IngestOptions options_;
  core::Clock* clock_;
  IngestListener* listener_ = nullptr;
  class Pager* pager_ = nullptr;

  mutable absl::Mutex mu_;
  std::vector<IngestItem> queue_ ABSL_GUARDED_BY(mu_);
  struct Task {
    DecisionRequest request;
    std::function<void(DecisionOutcome)> done;
  };
  std::vector<Task> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;

  // Writer thread only.
  std::map<std::string, std::unique_ptr<RunState>> runs_;
  IdCounters ids_;
  std::vector<std::pair<std::function<void(DecisionOutcome)>, DecisionOutcome>> answers_;
  std::vector<std::tuple<std::string, uint64_t, std::string>> outgoing_;  // after commit
  WriteBatch batch_;
  // (stream, run, rank) -> highest step in this batch, for acks.
  std::map<std::tuple<uint64_t, std::string, int32_t>, int64_t> acks_;
  std::vector<std::pair<IncidentRow, IncidentChange>> changed_incidents_;
  // Runs whose in-memory state may hold a failed batch's effects, until
  // rebuilt from the store.
  std::set<std::string> stale_runs_;
  // Streams ended after a failed batch -> when; their step reports still in
  // the queue are dropped (the agent re-sends them in order). Kept a minute:
  // an ended stream delivers at most the one read already under way.
  std::map<uint64_t, int64_t> ended_streams_;
  // Checkpoints and command acks of failed batches (stream 0), retried
  // first in the next one: agents send them once. Few: one per checkpoint
  // or rollback per rank while the store fails.
  std::vector<IngestItem> carried_;

  mutable absl::Mutex snap_mu_;
  std::vector<RunSnapshot> snapshot_ ABSL_GUARDED_BY(snap_mu_);
  IngestStats stats_ ABSL_GUARDED_BY(snap_mu_);
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_H_
