// A step report's way into its run: duplicates and late records stored,
// not evaluated; a far-future step held back until the next record
// confirms the jump; per-rank records merged (ranks mode) until every rank
// reported or the aggregation timeout; then the run's engine judges the
// step and its events become incidents.
//
// Per-run modes, fixed by the run's first step report:
//   global: rank 0 streams the reduced record (REPORT_SCOPE_GLOBAL); other
//           ranks' reports are rank-specific extras, stored but not merged.
//   ranks:  every rank streams its own record (REPORT_SCOPE_RANK); a step
//           completes when all world_size ranks reported or after the
//           aggregation timeout, and the missing ranks are named.
//
// Writer thread only.

#ifndef TRAINWATCH_SERVER_INGEST_STEP_INTAKE_H_
#define TRAINWATCH_SERVER_INGEST_STEP_INTAKE_H_

#include <cstdint>

#include "absl/types/span.h"
#include "ingest/batch.h"
#include "ingest/engine_snapshots.h"
#include "ingest/ingest_options.h"
#include "ingest/per_run_rules.h"
#include "ingest/run_state.h"
#include "ingest/run_views.h"
#include "trainwatch/core/step_record.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::server {

class StepIntake {
 public:
  // REQUIRES: every pointer outlives this.
  StepIntake(const IngestOptions* options, RunViews* views, Batch* batch,
             EngineSnapshots* snapshots, PerRunRules* rules)
      : options_(options), views_(views), batch_(batch), snapshots_(snapshots), rules_(rules) {}

  // Takes `r`, received on `stream`: stored in the batch, and acknowledged
  // with it.
  void Take(RunState& run, const trainwatch::v1::StepReport& r, uint64_t stream, int64_t now);
  // Evaluates the run's merged steps that are complete, timed out, or all
  // of them when `force`.
  void CompletePending(RunState& run, int64_t now, bool force);

 private:
  // True when `step` is too far ahead of the run to be evaluated (counted
  // and logged); `rank_scope`: another rank's record of a confirmed step is
  // taken too.
  bool FarAhead(RunState& run, int64_t step, bool rank_scope);
  // `tensors`: the report's per-tensor statistics, if any (names the source
  // of a numerical failure).
  void Evaluate(RunState& run, StepRow step, int64_t now,
                absl::Span<const core::TensorStat> tensors = {});

  const IngestOptions* options_;
  RunViews* views_;
  Batch* batch_;
  EngineSnapshots* snapshots_;
  PerRunRules* rules_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_STEP_INTAKE_H_
