// The ingest write path's settings (trainwatchd's flags of the same names).

#ifndef TRAINWATCH_SERVER_INGEST_INGEST_OPTIONS_H_
#define TRAINWATCH_SERVER_INGEST_INGEST_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trainwatch/core/config.h"

namespace trainwatch::server {

// Rules for the runs whose id matches `pattern` (a glob: * ? [...], as
// fnmatch(3)); trainwatchd --run_rules.
struct RunRules {
  std::string pattern;
  core::RuleConfig rules;
};

// Stall and lost-rank detection (liveness.h); trainwatchd's flags.
struct LivenessOptions {
  int64_t stall_floor_ms = 120'000;      // --stall_floor_seconds
  double stall_step_multiple = 10.0;     // --stall_step_multiple
  int64_t stall_startup_ms = 1'800'000;  // --stall_startup_seconds
  int64_t long_phase_ms = 1'800'000;     // --stall_long_phase_seconds
  // A rank silent this many heartbeat intervals, and at least lost_min_ms,
  // is lost: the ranks of a job that ends stop within seconds of each other
  // (a closing agent says so, but a killed one cannot).
  int lost_heartbeats = 4;
  int64_t lost_min_ms = 30'000;
  int64_t check_interval_ms = 1'000;
  double straggler_ratio = 1.2;          // --straggler_ratio
  int64_t straggler_steps = 100;         // --straggler_steps
};

struct IngestOptions {
  // The rules of a run whose agent announces none and that no run_rules
  // pattern matches (trainwatchd --rules), and how runs record their source.
  core::RuleConfig rules;
  std::string rules_source = "server defaults";
  // Tried in order; the first match wins (per_run_rules.h).
  std::vector<RunRules> run_rules;
  int64_t aggregation_timeout_ms = 30'000;
  // Upper bound on one batch, to keep commits short under a flood.
  size_t max_batch_items = 50'000;
  // Group commit: a batch of fewer than IngestQueue::kCommitEarlyItems
  // records waits for more until this long after the previous batch began
  // (why: IngestQueue::LingerForMore). 0: commit as soon as anything is
  // queued.
  int64_t commit_interval_ms = 5;
  // Runs holding their engine state in memory; the least recently used
  // beyond it is evicted and rebuilt from the store on demand. At least 1.
  size_t max_runs_in_memory = 256;
  // A step further than this past the run's last step is stored, not
  // evaluated, unless the next record confirms the jump. At least 1. Small
  // on purpose: a bad record within the bound makes the run's next real
  // steps late for up to this many steps, while a real jump costs one
  // step's evaluation whatever the bound.
  int64_t max_step_jump = 1'000;
  // A run's engine state is saved into the store every this many evaluated
  // steps, and at eviction and at a clean shutdown when a tenth of them
  // passed since, so that a rebuild replays only the steps after the newest
  // (engine_snapshots.h). 0: every rebuild replays the attempt's history.
  int64_t engine_snapshot_steps = 10'000;
  LivenessOptions liveness;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_INGEST_OPTIONS_H_
