// The write path of trainwatchd (docs/ingest.md tells the whole story).
// Streams hand every agent message to Submit() without waiting; one writer
// thread takes them in batches, hands each to the component it concerns,
// writes the batch to the store in one transaction, and only then tells the
// streams which steps are durable.
//
// The invariant: a record is acknowledged only once it is durable, and a
// run's in-memory state only ever reflects durable records. When a batch's
// transaction fails, nothing of it is acknowledged, every run it touched is
// rebuilt from the store, every stream with a message in it is ended with
// UNAVAILABLE (its agent re-sends everything after its last acknowledged
// step), checkpoints and command acks are kept for the next batch, and a
// decision in it is answered UNAVAILABLE. While a rebuild itself fails,
// every batch is refused the same way.
//
// The components, each with its own state and test:
//   ingest_queue.h   the queue and group commit;
//   run_table.h      runs in memory, eviction, rebuild; run_views.h, what
//                    readers see;
//   step_intake.h    a step report into its run, the engine's verdict;
//   incarnations.h   Hellos, launches of a job, resumes;
//   per_run_rules.h  which rules judge a run, the agents' own decisions;
//   approvals.h      approvals, rollback commands, command acks;
//   engine_snapshots.h  the engine's saved state and replays.
//
// Thread-safety: Submit(), SubmitApproval(), views(), Stats() and Flush()
// from any thread; the rest before Start() or after Stop().

#ifndef TRAINWATCH_SERVER_INGEST_INGEST_H_
#define TRAINWATCH_SERVER_INGEST_INGEST_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "ingest/batch.h"
#include "ingest/approvals.h"
#include "ingest/engine_snapshots.h"
#include "ingest/incarnations.h"
#include "ingest/ingest_listener.h"
#include "ingest/ingest_options.h"
#include "ingest/ingest_queue.h"
#include "ingest/liveness.h"
#include "ingest/per_run_rules.h"
#include "ingest/run_table.h"
#include "ingest/run_views.h"
#include "ingest/step_intake.h"
#include "store/store.h"
#include "trainwatch/core/clock.h"

namespace trainwatch::server {

// The run whose state a message touches ("" for a heartbeat: none).
const std::string& RunIdOf(const trainwatch::v1::AgentMessage& m);

class Ingestor {
 public:
  // A batch this large commits without waiting for the commit interval.
  static constexpr size_t kCommitEarlyItems = IngestQueue::kCommitEarlyItems;

  Ingestor(Store* store, const IngestOptions& options, core::Clock* clock);
  ~Ingestor();
  Ingestor(const Ingestor&) = delete;
  Ingestor& operator=(const Ingestor&) = delete;
  // Fixed at construction; any thread.
  const IngestOptions& options() const { return options_; }

  // Reads the runs from the store: each gets its stored view at once, and
  // the most recently seen are rebuilt by the writer after Start()
  // (run_table.h). REQUIRES: before Start().
  absl::Status Recover();
  // REQUIRES: outlives the Ingestor; set before Start().
  void SetListener(IngestListener* listener);
  // Pages go into the outbox with the incident changes that cause them
  // (the pager).
  // REQUIRES: outlives the Ingestor; set before Start().
  void SetPager(IncidentOutbox* pager) { pager_ = pager; }
  void Start();
  // Drains what was submitted, writes it, and joins the writer.
  void Stop();

  // Never blocks on the store.
  void Submit(IngestItem item) { queue_.Submit(std::move(item)); }
  // Queues a decision; `done` runs on the writer thread once it is durable
  // (or refused). Never blocks.
  void SubmitApproval(ApprovalRequest request, std::function<void(ApprovalOutcome)> done);
  // Waits until everything submitted before the call is durable (tests,
  // shutdown).
  void Flush() { queue_.Flush(); }

  // What readers see of every run; thread-safe, lives as long as this.
  const RunViews& views() const { return views_; }
  IngestStats Stats() const;

 private:
  void Loop();
  // Processes `items` in batches that each touch at most max_runs_in_memory
  // runs, so that every run of a batch stays in memory until its commit.
  void ProcessInBatches(std::vector<IngestItem>& items);
  void ProcessBatch(std::vector<IngestItem>& items);
  // The failure path of ProcessBatch (the invariant above).
  void FailBatch(std::vector<IngestItem>& items, const absl::Status& st, int64_t now);
  void Handle(IngestItem& item, int64_t now);

  Store* store_;
  const IngestOptions options_;
  core::Clock* clock_;
  IngestListener* listener_ = nullptr;
  IncidentOutbox* pager_ = nullptr;

  IngestQueue queue_;
  RunViews views_;
  // The writer thread's from here on.
  Batch batch_;
  EngineSnapshots snapshots_;
  PerRunRules rules_;
  RunTable runs_;
  Approvals approvals_;
  Incarnations incarnations_;
  StepIntake intake_;
  Liveness liveness_;
  // Streams ended after a failed batch -> when; their step reports still
  // queued are dropped (the agent re-sends them in order). Kept a minute.
  std::map<uint64_t, int64_t> ended_streams_;
  // Checkpoints and command acks of failed batches (stream 0), retried
  // first in the next one: agents send them once.
  std::vector<IngestItem> carried_;
  std::thread writer_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_INGEST_H_
