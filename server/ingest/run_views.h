// What readers see of the runs: one RunView per run, held in memory or
// evicted, and the ingest counters. The writer thread publishes; the
// exporter and the operator API read at any time.
//
// Thread-safe: every method takes the one mutex.

#ifndef TRAINWATCH_SERVER_INGEST_RUN_VIEWS_H_
#define TRAINWATCH_SERVER_INGEST_RUN_VIEWS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "store/store.h"
#include "trainwatch/core/rule_engine.h"

namespace trainwatch::server {

// What the exporter and the operator API read about a run.
// One rank's pace against the run's (liveness.h): its own time per step
// over the median rank's.
struct RankTiming {
  int32_t rank = 0;
  std::string host;
  double ratio = 1.0;
  int64_t lead_ms = 0;
};

// What the heartbeats say of a run (liveness.h), for /metrics and
// `twctl status`.
struct LivenessView {
  int64_t last_step_ms = 0;  // when its last step was taken (server clock)
  int64_t bound_ms = 0;      // the stall bound now
  bool stalled = false;
  int32_t ranks_alive = 0;
  int32_t ranks_lost = 0;
  int64_t step_ms_median = 0;
  // The run's net progress at its median step time over the wall time since
  // this trainwatchd first saw it step, in [0, 1]; -1: not known yet.
  double goodput = -1;
  std::vector<RankTiming> slowest;  // the slowest ranks, slowest first (at most 5)
  // Every rank's agent closed (its last heartbeat said so): the job ended,
  // rather than went silent. Kept while no rank is alive.
  bool ended = false;
};

struct RunView {
  RunRow row;
  // The server engine's warm-up, once it has judged a step.
  std::optional<core::WarmUpState> warm_up;
  bool rank_mode = false;
  StepRow latest;  // the last evaluated global step
  bool has_latest = false;
  int64_t skipped_total = 0;
  // A followed run's tier 1 verdicts: skips recommended, not applied.
  int64_t skips_recommended_total = 0;
  // Evaluated steps on which the fp16 loss scaler overflowed (and skipped).
  int64_t loss_scale_overflows_total = 0;
  int64_t incidents_total[4] = {0, 0, 0, 0};  // by tier
  int64_t open_incidents[4] = {0, 0, 0, 0};
  int64_t missing_rank_steps_total = 0;
  // Skips and halts agents decided (each stored as a decision), and steps
  // where the agent's verdict and the server's engine's differ.
  int64_t agent_decisions_total = 0;
  int64_t decision_divergences_total = 0;
  // After a restart, until the run's engine is rebuilt: the figures above
  // are the store's (docs/ingest.md, "Restart").
  bool rebuilding = false;
  // Filled by All() and Get() from SetLiveness (the liveness check's, apart
  // from the run's state the other writers replace).
  LivenessView liveness;
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
  int64_t refused_acks_total = 0;  // command acks for another run's or no command
  int64_t far_steps_total = 0;     // stored, not evaluated: past max_step_jump
  int64_t runs_in_memory = 0;      // runs holding engine state
  int64_t runs_evicted_total = 0;
  int64_t runs_rebuilt_total = 0;  // evicted (or left at startup), rebuilt on demand
  int64_t runs_rebuilding = 0;     // after a restart, still to be rebuilt
  int64_t resumes_total = 0;       // attempts opened by a new incarnation
  // Older incarnations' streams ended by a newer one, and their Hellos refused.
  int64_t incarnation_conflicts_total = 0;
  // Rebuilds started from an engine snapshot, and snapshots refused (damaged,
  // another version or other rules: the whole history was replayed).
  int64_t engine_snapshots_loaded_total = 0;
  int64_t engine_snapshots_refused_total = 0;
};

class RunViews {
 public:
  // Every run's view, in run id order (the operator API lists runs by id).
  std::vector<RunView> All() const;
  std::optional<RunView> Get(const std::string& run_id) const;
  // The counters; queue_depth is the caller's to fill.
  IngestStats Stats() const;

  // Writer thread.
  void Set(const std::string& run_id, RunView view);
  // A run's liveness; one with no rank heard from is forgotten.
  void SetLiveness(const std::string& run_id, LivenessView liveness);
  void Erase(const std::string& run_id);
  // Adds `n` to one counter.
  void Count(int64_t IngestStats::*counter, int64_t n = 1);
  // Runs `edit` on the views and counters under the lock, so that readers
  // see its changes together.
  using Editor = std::function<void(std::map<std::string, RunView>& views, IngestStats& stats)>;
  void Edit(const Editor& edit);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, RunView> views_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, LivenessView> liveness_ ABSL_GUARDED_BY(mu_);
  IngestStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_RUN_VIEWS_H_
