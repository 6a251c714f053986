// The shared state's event helpers alone: the shard history, the retained
// checkpoints and the recommendation they give an event.

#include <catch2/catch.hpp>

#include "engine_state.h"

namespace trainwatch::core {
namespace {

TEST_CASE("engine state: shard history keeps the last steps - events get a capped range",
          "[core][state]") {
  RuleConfig c;
  c.shard_history_steps = 4;
  c.max_shards_per_step = 2;
  c.max_event_shards = 4;
  EngineState s{c};
  for (int64_t step = 0; step < 6; ++step) {
    // Three shards a step: one more than a step keeps.
    const uint64_t shards[] = {uint64_t(10 * step), uint64_t(10 * step + 1),
                               uint64_t(10 * step + 2)};
    StepRecord r;
    r.step = step;
    r.shards = shards;
    s.RecordShards(r);
  }
  SECTION("steps 0 and 1 left the ring") {
    Event e;
    s.CollectShards(0, 2, &e);
    CHECK(e.shards == std::vector<uint64_t>{20, 21});
    CHECK(e.shards_truncated);  // the third shard of step 2 was not kept
  }
  SECTION("past max_event_shards both ends are kept") {
    Event e;
    s.CollectShards(2, 5, &e);
    CHECK(e.shards == std::vector<uint64_t>{20, 21, 50, 51});
    s.AddShardAction(RecommendedAction::Kind::kQuarantineShards, &e);
    REQUIRE(e.recommended_actions.size() == 1);
    CHECK(e.recommended_actions[0].text == "quarantine shards 20..51");
  }
  SECTION("no shards in range: no shard action") {
    Event e;
    s.CollectShards(100, 200, &e);
    s.AddShardAction(RecommendedAction::Kind::kInspectShards, &e);
    CHECK(e.shards.empty());
    CHECK(e.recommended_actions.empty());
  }
}

TEST_CASE("engine state: checkpoints - the last retained before the onset",
          "[core][state]") {
  RuleConfig c;
  c.checkpoints_retained = 2;
  EngineState s{c};
  s.AddCheckpoint(2000, "b");
  s.AddCheckpoint(1000, "a");  // out of order: kept in step order
  s.AddCheckpoint(3000, "c");  // drops 1000
  s.AddCheckpoint(3000, "c2");  // a repeated notice replaces the uri
  Event e;
  e.onset_step = 3000;
  e.tier = 2;
  s.RecommendCheckpoint(&e);
  CHECK(e.recommended_checkpoint_step == 3000);
  CHECK(e.recommended_checkpoint_uri == "c2");
  // A numerical failure at the checkpoint's own step takes the one before.
  e.tier = 3;
  s.RecommendCheckpoint(&e);
  CHECK(e.recommended_checkpoint_step == 2000);
  // Nothing retained before the onset: no recommendation.
  Event early;
  early.onset_step = 1500;
  early.recommended_checkpoint_step = -1;
  s.RecommendCheckpoint(&early);
  CHECK(early.recommended_checkpoint_step == -1);
}

TEST_CASE("engine state: z-loss is added - or raised tenfold up to 1e-3", "[core][state]") {
  EngineState s{RuleConfig()};
  Event e;
  s.AddZLossAction(std::numeric_limits<double>::quiet_NaN(), &e);
  s.AddZLossAction(5e-5, &e);
  s.AddZLossAction(5e-4, &e);
  REQUIRE(e.recommended_actions.size() == 3);
  CHECK(e.recommended_actions[0].z_loss_alpha == 1e-4);
  CHECK(e.recommended_actions[1].z_loss_alpha == Approx(5e-4));
  CHECK(e.recommended_actions[2].z_loss_alpha == 1e-3);
}

}  // namespace
}  // namespace trainwatch::core
