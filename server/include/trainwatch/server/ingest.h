// The write path of trainwatchd. Streams hand every agent message to
// Submit() without waiting; one writer thread takes them in batches, keeps
// each run's state (the rule engine, per-rank aggregation, the incidents of
// its episodes), writes the batch to the store in one transaction, and only
// then tells the streams which steps are durable.
//
// Per-run modes, fixed by the run's first step report:
//   global: rank 0 streams the reduced record (REPORT_SCOPE_GLOBAL); other
//           ranks' reports are rank-specific extras, stored but not merged.
//   ranks:  every rank streams its own record (REPORT_SCOPE_RANK); a step
//           completes when all world_size ranks reported or after the
//           aggregation timeout, and the missing ranks are named.
// Aggregation: loss and log_z are means, grad_norm the maximum (a rank whose
// gradients explode shows), nonfinite and element counts sums (nan_frac is
// their ratio), shard ids the union.
//
// Thread-safety: Submit(), Snapshot(), Stats() and Flush() from any thread;
// everything else is the writer thread's.

#ifndef TRAINWATCH_SERVER_INGEST_H_
#define TRAINWATCH_SERVER_INGEST_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "trainwatch/core/config.h"
#include "trainwatch/server/clock.h"
#include "trainwatch/server/store.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::server {

struct IngestItem {
  uint64_t stream_id = 0;
  int64_t received_ms = 0;
  trainwatch::v1::AgentMessage message;
};

// Told about durable steps and incident changes, on the writer thread. An
// implementation must not block.
// What happened to an incident, as its listeners hear it.
enum class IncidentChange {
  kOpened,
  kUpdated,       // new evidence; the state is as it was
  kStateChanged,  // resolved, re-opened, approved, rejected, ...
};

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
};

// An operator's decision on an incident, carried out on the writer thread
// so that decisions and ingest never race.
struct DecisionRequest {
  bool approve = true;
  int64_t incident_id = 0;
  std::optional<int64_t> to_step;
  // Ranges to quarantine; unset: the incident's recommendation.
  std::optional<std::vector<std::pair<uint64_t, uint64_t>>> quarantine;
  std::optional<double> z_loss_alpha;
  // Steps whose batches every rank skips; unset: the recommendation; a
  // range with last < first: none.
  std::optional<std::pair<int64_t, int64_t>> skip_steps;
  std::string comment;
  std::string idempotency_key;
  std::string actor;  // from the caller's authentication
  bool dry_run = false;
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
  StoredStep latest;  // the last evaluated global step
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
  Ingestor(Store* store, const IngestOptions& options, Clock* clock);
  // The steps whose batches every rank skips by default when `incident` is
  // rolled back to the checkpoint at `checkpoint_step`: for a page, from just
  // before its onset to its detection, after the checkpoint (earlier steps
  // are not served again anyway); none for other tiers or an empty range.
  // Any thread (reads only the options fixed at construction).
  std::optional<std::pair<int64_t, int64_t>> DefaultSkipSteps(const IncidentRow& incident,
                                                              int64_t checkpoint_step) const;
  ~Ingestor();
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
  struct RunState;
  void Loop();
  void ProcessBatch(std::vector<IngestItem>& items);
  RunState* RunFor(const std::string& run_id, int32_t world_size, int64_t now);
  void Handle(IngestItem& item, int64_t now);
  void HandleStep(RunState& run, const trainwatch::v1::StepReport& r, uint64_t stream,
                  int64_t now);
  // `tensors`: the report's per-tensor statistics, if any (names the source
  // of a numerical failure).
  void Evaluate(RunState& run, StoredStep step, int64_t now,
                absl::Span<const core::TensorStat> tensors = {});
  void CompletePending(RunState& run, int64_t now, bool force);
  void RecordEvents(RunState& run, const std::vector<core::Event>& events, int64_t now);
  // Writes the incident with this batch and tells the listener after commit.
  void RecordIncident(const IncidentRow& incident, IncidentChange change);
  void PublishSnapshot();
  DecisionOutcome RunDecision(const DecisionRequest& r, int64_t now);
  void HandleCommandAck(RunState& run, const trainwatch::v1::CommandAck& a, int64_t now);
  void CompleteRollback(RunState& run, int64_t now);
  void SendPendingCommand(RunState& run, uint64_t stream, int32_t rank);
  std::string QuarantineMessage(const RunState& run) const;

  Store* store_;
  IngestOptions options_;
  Clock* clock_;
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
  int64_t next_incident_id_ = 1;
  int64_t next_decision_id_ = 1;
  std::vector<std::pair<std::function<void(DecisionOutcome)>, DecisionOutcome>> answers_;
  std::vector<std::tuple<std::string, uint64_t, std::string>> outgoing_;  // after commit
  WriteBatch batch_;
  // (stream, run, rank) -> highest step in this batch, for acks.
  std::map<std::tuple<uint64_t, std::string, int32_t>, int64_t> acks_;
  std::vector<std::pair<IncidentRow, IncidentChange>> changed_incidents_;

  mutable absl::Mutex snap_mu_;
  std::vector<RunSnapshot> snapshot_ ABSL_GUARDED_BY(snap_mu_);
  IngestStats stats_ ABSL_GUARDED_BY(snap_mu_);
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_H_
