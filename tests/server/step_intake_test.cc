// The step intake alone (step_intake.h), with the per-run rules and the
// views it writes to: no store, no writer thread, no clock.

#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "ingest/batch.h"
#include "ingest/engine_snapshots.h"
#include "ingest/per_run_rules.h"
#include "ingest/run_state.h"
#include "ingest/run_views.h"
#include "ingest/step_intake.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;

v1::StepReport Report(int64_t step) {
  v1::StepReport r;
  r.set_run_id("r");
  r.set_step(step);
  r.mutable_metrics()->set_loss(2.0);
  return r;
}

TEST_CASE("step intake: a re-sent step is late - a far step waits for the next to confirm it",
          "[server][step_intake]") {
  IngestOptions options;
  options.max_step_jump = 100;
  RunViews views;
  Batch batch;
  // No snapshot is due in these few steps: the store is never read.
  EngineSnapshots snapshots(/*store=*/nullptr, &options, &views, &batch);
  PerRunRules rules(&options, &batch);
  StepIntake intake(&options, &views, &batch, &snapshots, &rules);
  RunRow row;
  row.run_id = "r";
  RunState run(row);
  rules.Assign(run);
  run.engine = std::make_unique<core::RuleEngine>(run.rules);

  intake.Take(run, Report(1), /*stream=*/7, /*now=*/0);
  CHECK(run.row.last_step == 1);
  intake.Take(run, Report(1), 7, 0);  // a re-send after a reconnect
  CHECK(views.Stats().duplicates_total == 1);
  REQUIRE(batch.rows.steps.size() == 2);
  CHECK(batch.rows.steps[1].step.late);  // stored (the store keeps the first), not evaluated

  intake.Take(run, Report(1000), 7, 0);  // past max_step_jump
  CHECK(views.Stats().far_steps_total == 1);
  CHECK(run.row.last_step == 1);
  intake.Take(run, Report(1001), 7, 0);  // follows it: the run really jumped
  CHECK(run.row.last_step == 1001);

  CHECK(batch.records == 4);
  REQUIRE(batch.acks.size() == 1);  // one key: stream 7, run r, rank 0
  CHECK(batch.acks.begin()->second == 1001);
}

}  // namespace
}  // namespace trainwatch::server
