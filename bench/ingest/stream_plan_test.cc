// The pure pieces of the load generator: the stream plans of a load and the
// messages a stream sends. The streams themselves are exercised against a
// real trainwatchd by the ingest_load_* tests (tests/integration).
#include "stream_plan.h"

#include <catch2/catch.hpp>

#include "stream_messages.h"

namespace trainwatch::bench {
namespace {

LoadConfig Config(int runs, int ranks, bool per_rank, double rate) {
  LoadConfig c;
  c.target = "127.0.0.1:1";
  c.runs = runs;
  c.ranks_per_run = ranks;
  c.per_rank = per_rank;
  c.rate = rate;
  c.steps = 100;
  c.window = 16;
  return c;
}

TEST_CASE("ingest load: global loads send from rank 0 of each run only", "[bench][ingest]") {
  const LoadConfig c = Config(2, 3, false, 0);
  REQUIRE(SendingStreams(c) == 2);
  REQUIRE(PacingIntervalNs(c) == 0);
  const std::vector<StreamPlan> plans = PlanStreams(c, "p", 1000);
  REQUIRE(plans.size() == 6);
  for (const StreamPlan& p : plans) {
    CHECK(p.run_id == (p.run_index == 0 ? "p-0" : "p-1"));
    CHECK(p.world_size == 3);
    CHECK(p.window == 16);
    CHECK(p.steps == (p.rank == 0 ? 100 : 0));
    CHECK(p.scope == trainwatch::v1::REPORT_SCOPE_GLOBAL);
    CHECK(p.ack_key == 0);
    CHECK(p.first_due_ns == 0);
  }
  CHECK(plans[4].run_index == 1);
  CHECK(plans[4].rank == 1);
}

TEST_CASE("ingest load: paced per-rank streams share the rate and stagger", "[bench][ingest]") {
  // 4 sending streams at 1,000 records/s: each sends every 4 ms.
  const LoadConfig c = Config(2, 2, true, 1000);
  REQUIRE(SendingStreams(c) == 4);
  REQUIRE(PacingIntervalNs(c) == 4'000'000);
  const std::vector<StreamPlan> plans = PlanStreams(c, "p", 1000);
  REQUIRE(plans.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(plans[i].steps == 100);
    CHECK(plans[i].scope == trainwatch::v1::REPORT_SCOPE_RANK);
    CHECK(plans[i].ack_key == plans[i].rank);
    CHECK(plans[i].interval_ns == 4'000'000);
    CHECK(plans[i].first_due_ns == 1000 + 1'000'000 * i);
  }
}

TEST_CASE("ingest load: step reports carry the stream's key and healthy metrics",
          "[bench][ingest]") {
  StreamPlan plan;
  plan.run_id = "r-1";
  plan.rank = 3;
  plan.world_size = 4;
  trainwatch::v1::AgentMessage out;

  plan.scope = trainwatch::v1::REPORT_SCOPE_GLOBAL;
  FillStepReport(plan, 7, &out);
  REQUIRE(out.has_step_report());
  CHECK(out.step_report().rank() == 0);
  CHECK(out.step_report().step() == 7);
  CHECK(out.step_report().shard_ids_size() == 2);
  CHECK(out.step_report().shard_ids(1) == 15);
  CHECK(out.step_report().metrics().nan_frac() == 0.0);
  CHECK(out.step_report().metrics().loss() > 2.5);

  plan.scope = trainwatch::v1::REPORT_SCOPE_RANK;
  FillStepReport(plan, 8, &out);
  CHECK(out.step_report().rank() == 3);
  CHECK(out.step_report().scope() == trainwatch::v1::REPORT_SCOPE_RANK);

  // Each fill replaces the last message.
  FillHeartbeat(plan, 8, 5, 16, &out);
  REQUIRE(out.has_heartbeat());
  CHECK_FALSE(out.has_step_report());
  CHECK(out.heartbeat().queue_depth() == 3);
  CHECK(out.heartbeat().queue_capacity() == 16);
  CHECK(out.heartbeat().last_step() == 8);

  FillHello(plan, &out);
  REQUIRE(out.has_hello());
  CHECK(out.hello().run_id() == "r-1");
  CHECK(out.hello().next_step() == 1);
  CHECK(out.hello().agent_version() == kLoadAgentVersion);
}

}  // namespace
}  // namespace trainwatch::bench
