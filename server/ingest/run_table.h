// The runs the writer holds: at most IngestOptions::max_runs_in_memory
// keep their state (run_state.h); the least recently used beyond it is
// evicted and rebuilt from the store when a message or a decision needs it
// again. Every run, held or evicted, keeps a RunView (run_views.h) that
// readers see.
//
// At a restart Recover() reads only the runs' rows and stored figures, so
// trainwatchd listens at once whatever the history; the most recently seen
// runs that fit are then rebuilt one at a time while the writer is idle
// (RebuildNextAtStartup), and any run a message needs first is rebuilt
// before it: nothing is ever judged by an empty engine.
//
// Writer thread only; the views it publishes are thread-safe.

#ifndef TRAINWATCH_SERVER_INGEST_RUN_TABLE_H_
#define TRAINWATCH_SERVER_INGEST_RUN_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ingest/batch.h"
#include "ingest/engine_snapshots.h"
#include "ingest/ingest_options.h"
#include "ingest/per_run_rules.h"
#include "ingest/run_state.h"
#include "ingest/run_views.h"
#include "store/store.h"
#include "trainwatch/core/clock.h"

namespace trainwatch::server {

class RunTable {
 public:
  // REQUIRES: every pointer outlives this.
  RunTable(Store* store, const IngestOptions* options, core::Clock* clock, RunViews* views,
           PerRunRules* rules, EngineSnapshots* snapshots, Batch* batch)
      : store_(store), options_(options), clock_(clock), views_(views), rules_(rules),
        snapshots_(snapshots), batch_(batch) {}

  // Reads the runs from the store (each gets its stored view) and the id
  // counters; queues the most recently seen that fit to be rebuilt.
  absl::Status Recover();

  // Starts a batch: the runs it touches are not evicted until the next.
  void BeginBatch() { ++batch_seq_; }
  // The run's state, creating the run when `create`, rebuilding it from the
  // store when it was evicted; null for an unknown run (when !create) or when
  // the rebuild failed (logged).
  RunState* Get(const std::string& run_id, int32_t world_size, int64_t now, bool create = true);
  bool IsEvicted(const std::string& run_id) const { return evicted_.count(run_id) > 0; }
  // The held run with the open incident `incident_id`, and the incident.
  std::pair<RunState*, IncidentRow*> FindOpenIncident(int64_t incident_id);
  // The runs held in memory, by id.
  const std::map<std::string, std::unique_ptr<RunState>>& held() const { return runs_; }

  // Rebuilds the next run queued by Recover() that is still evicted, while
  // room is left (a background rebuild never evicts); true when one was.
  bool RebuildNextAtStartup();
  bool HasStartupWork() const { return startup_next_ < startup_order_.size(); }

  // A run whose state may hold a failed batch's effects, until rebuilt.
  void MarkStale(const std::string& run_id) { stale_.insert(run_id); }
  size_t stale_count() const { return stale_.size(); }
  // Rebuilds the stale runs from the store; OK when none is left.
  absl::Status RebuildStale();

  // The view of a run built from the store alone: startup, runs beyond the
  // bound, and a standby replica's reads (api/standby_reads.h). Any thread
  // that may read `store`.
  static absl::StatusOr<RunView> StoredView(Store* store, const RunRow& row);

  // The held runs' views, for readers (after a commit).
  void Publish();

 private:
  absl::StatusOr<RunState*> RecoverRun(const RunRow& row);
  // Rebuilds the evicted run `it` and takes it out of evicted_ and
  // rebuilding_; logs and returns null when the store fails.
  RunState* RebuildEvicted(std::map<std::string, RunRow>::iterator it);
  // Evicts the least recently used run not touched by the current batch
  // while more than max_runs_in_memory - 1 runs are held.
  void MakeRoom();
  static RunView ViewOf(const RunState& run);

  Store* store_;
  const IngestOptions* options_;
  core::Clock* clock_;
  RunViews* views_;
  PerRunRules* rules_;
  EngineSnapshots* snapshots_;
  Batch* batch_;

  std::map<std::string, std::unique_ptr<RunState>> runs_;
  // Runs known to the store but not held in memory, by id.
  std::map<std::string, RunRow> evicted_;
  // Runs Recover() queued to be rebuilt, most recently seen first, the next
  // at startup_next_; and those of them not yet rebuilt (by any path).
  std::vector<std::string> startup_order_;
  size_t startup_next_ = 0;
  std::set<std::string> rebuilding_;
  std::set<std::string> stale_;
  uint64_t batch_seq_ = 0;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_RUN_TABLE_H_
