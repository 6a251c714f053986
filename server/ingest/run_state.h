// One run's state on the writer thread: its rules and engine, the steps
// waiting for ranks, its incidents, the rollback under way. The components
// of ingest (ingest.h) each change their part of it; the run table
// (run_table.h) holds it, evicts it and rebuilds it from the store.
//
// Writer thread only.

#ifndef TRAINWATCH_SERVER_INGEST_RUN_STATE_H_
#define TRAINWATCH_SERVER_INGEST_RUN_STATE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "ingest/incident_tracker.h"
#include "ingest/rollback.h"
#include "ingest/step_aggregation.h"
#include "store/store.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/rule_engine.h"

namespace trainwatch::server {

struct RunState {
  explicit RunState(const RunRow& r) : row(r), incidents(r.run_id) {
    incidents.set_observed(r.observed);
  }
  RunRow row;
  core::RuleConfig rules;  // what the engine judges by (row.rules_json)
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
  int64_t skips_recommended_total = 0;  // followed runs' tier 1 verdicts
  int64_t loss_scale_overflows_total = 0;
  int64_t missing_rank_steps_total = 0;
  // The current attempt's counts as a replay of it gives them (the totals
  // above carry over attempts), for the engine snapshots; and the step of
  // the newest snapshot written or loaded, -1 for none.
  int64_t attempt_skipped = 0;
  int64_t attempt_overflows = 0;
  int64_t snapshot_step = -1;
  int64_t agent_decisions_total = 0;
  int64_t decision_divergences_total = 0;
  // The approved rollback being carried out, until every rank applied it.
  std::optional<RollbackCommand> command;
  ShardQuarantine quarantined;
  // A step refused as too far ahead, which the next record may confirm.
  std::optional<int64_t> far_step;
  // Every incarnation the run has seen (the current one included).
  std::set<std::string> incarnations;
  uint64_t last_batch = 0;  // the batch that last touched it, for eviction
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_RUN_STATE_H_
