// A run's engine and its history in the store: engine snapshots written
// every IngestOptions::engine_snapshot_steps steps, the replay that rebuilds
// an engine from the newest usable one, and the new attempt a rollback or a
// resume opens from a step. The engine is deterministic, so a replay from a
// snapshot gives the engine a full replay gives, decision for decision; a
// snapshot that cannot be used is logged and the whole attempt replayed,
// never half trusted.
//
// Writer thread only.

#ifndef TRAINWATCH_SERVER_INGEST_ENGINE_SNAPSHOTS_H_
#define TRAINWATCH_SERVER_INGEST_ENGINE_SNAPSHOTS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "ingest/batch.h"
#include "ingest/ingest_options.h"
#include "ingest/run_state.h"
#include "ingest/run_views.h"
#include "store/store.h"
#include "trainwatch/core/rule_engine.h"

namespace trainwatch::server {

// A replay of one attempt's history into a fresh engine, or into one
// restored from the attempt's newest snapshot at or before the replay's end:
// the caller feeds the stored steps after `after()` (ForEachStep's
// after_step), the snapshot's own row included (the engine refuses it; the
// caller still sees the latest row), then the checkpoints, then finishes.
struct EngineReplay {
  core::EngineRebuilder rebuild;
  int64_t snapshot_step = -1;  // -1: a full replay
  int64_t skipped = 0;         // the attempt's counts up to the last row taken
  int64_t overflows = 0;
  int64_t after() const { return snapshot_step - 1; }
  // True when the engine took the row.
  bool Feed(const StepRow& s, const std::string& checkpoint_uri);
};

class EngineSnapshots {
 public:
  // REQUIRES: every pointer outlives this.
  EngineSnapshots(Store* store, const IngestOptions* options, RunViews* views, Batch* batch)
      : store_(store), options_(options), views_(views), batch_(batch) {}

  // A snapshot that does not decode or was built under other rules than
  // `rules` (the run's) is logged and a full replay happens; an error only
  // when the store cannot be read.
  absl::StatusOr<EngineReplay> StartReplay(const std::string& run_id, int64_t attempt,
                                           int64_t up_to, const core::RuleConfig& rules);
  // Adds the run's engine snapshot to the batch when engine_snapshot_steps
  // passed since the last, or when `force` (eviction, shutdown) and a tenth
  // of them did.
  void MaybeSave(RunState& run, bool force, int64_t now);
  // Opens the run's next attempt from `up_to_step` (a rollback of
  // `incident_id`, or a resume by the current incarnation): the copy goes
  // into the batch, the engine is rebuilt from the old attempt's records up
  // to that step, the run continues from it with `world_size` ranks.
  // Returns the number of records rebuilt from.
  int64_t OpenAttempt(RunState& run, int64_t up_to_step, AttemptStart start,
                      int64_t incident_id, int32_t world_size, int64_t now);

 private:
  Store* store_;
  const IngestOptions* options_;
  RunViews* views_;
  Batch* batch_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_ENGINE_SNAPSHOTS_H_
