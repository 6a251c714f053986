// The store's per-table row code alone, on a migrated in-memory database:
// rows written by each table's writer come back from its readers, with the
// table's rule for a repeated key.

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "memory_db.h"
#include "store/store_decision_rows.h"
#include "store/store_incident_rows.h"
#include "store/store_migrations.h"
#include "store/store_outbox_rows.h"
#include "store/store_step_rows.h"

namespace trainwatch::server {
namespace {

using testing::MemoryDb;

struct MigratedDb : MemoryDb {
  MigratedDb() { REQUIRE(MigrateSchema(get()).ok()); }
};

StepRow Step(int64_t step, double loss) {
  StepRow s;
  s.step = step;
  s.Set(core::Signal::kLoss, loss);
  s.shards = {4, 5};
  s.received_ms = 100 + step;
  return s;
}

TEST_CASE("store rows: steps round-trip and the first write of a step wins", "[server][store]") {
  MigratedDb db;
  StepRow full = Step(1, 2.0);
  full.Set(core::Signal::kGradNorm, std::nan(""));
  full.loss_ema_ratio = 1.25;
  full.nonfinite = 3;
  full.elements = 1000;
  full.decision = 2;
  full.missing_ranks = "3,7";
  full.late = true;
  REQUIRE(rows::InsertSteps(db.get(), {{"r", 0, Step(0, 3.0)}, {"r", 0, full}}).ok());
  REQUIRE(rows::InsertSteps(db.get(), {{"r", 0, Step(1, 9.0)}, {"r", 0, Step(2, 1.0)}}).ok());

  auto steps = rows::StepsBetween(db.get(), "r", 0, 0, 10);
  REQUIRE(steps.ok());
  REQUIRE(steps->size() == 3);
  const StepRow& got = (*steps)[1];
  CHECK(got.Get(core::Signal::kLoss) == 2.0);  // not 9.0
  CHECK(got.Has(core::Signal::kGradNorm));
  CHECK(std::isnan(got.Get(core::Signal::kGradNorm)));
  CHECK_FALSE(got.Has(core::Signal::kLogZ));
  CHECK(got.present() == full.present());
  CHECK(got.loss_ema_ratio == 1.25);
  CHECK(got.nonfinite == 3);
  CHECK(got.elements == 1000);
  CHECK(got.decision == 2);
  CHECK(got.shards == std::vector<uint64_t>{4, 5});
  CHECK(got.missing_ranks == "3,7");
  CHECK(got.late);
  CHECK(got.received_ms == 101);
  CHECK_FALSE((*steps)[0].has_counts());  // not reported stays not reported

  auto recent = rows::RecentSteps(db.get(), "r", 0, 2);
  REQUIRE(recent.ok());
  REQUIRE(recent->size() == 2);
  CHECK((*recent)[0].step == 1);  // the last two, oldest first
  CHECK((*recent)[1].step == 2);

  // ForEachStep skips late steps and names the checkpoint of a step.
  REQUIRE(rows::ReplaceCheckpoints(db.get(), {{"r", 2, "ckpt://old", 1}}).ok());
  REQUIRE(rows::ReplaceCheckpoints(db.get(), {{"r", 2, "ckpt://2", 2}}).ok());
  std::vector<std::pair<int64_t, std::string>> seen;
  REQUIRE(rows::ForEachStep(db.get(), "r", 0, [&](const StepRow& s, const std::string& c) {
            seen.emplace_back(s.step, c);
          }).ok());
  CHECK(seen == std::vector<std::pair<int64_t, std::string>>{{0, ""}, {2, "ckpt://2"}});

  // A new attempt starts with the steps up to the checkpoint.
  REQUIRE(rows::CopyAttempts(db.get(), {{"r", 0, 1, 1}}).ok());
  auto copied = rows::StepsBetween(db.get(), "r", 1, 0, 10);
  REQUIRE(copied.ok());
  REQUIRE(copied->size() == 2);
  CHECK((*copied)[1].Get(core::Signal::kLoss) == 2.0);
  auto count = rows::CountSteps(db.get(), "r");
  REQUIRE(count.ok());
  CHECK(*count == 5);
}

TEST_CASE("store rows: runs upsert and rank steps read by step", "[server][store]") {
  MigratedDb db;
  REQUIRE(rows::UpsertRuns(db.get(), {{"b", 2, 0, -1, 10, 10}, {"a", 4, 0, 5, 1, 2}}).ok());
  REQUIRE(rows::UpsertRuns(db.get(), {{"a", 8, 1, 7, 99, 30}}).ok());
  auto runs = rows::Runs(db.get());
  REQUIRE(runs.ok());
  REQUIRE(runs->size() == 2);
  const RunRow& a = (*runs)[0];
  CHECK(a.run_id == "a");
  CHECK(a.world_size == 8);
  CHECK(a.attempt == 1);
  CHECK(a.last_step == 7);
  CHECK(a.created_ms == 1);  // kept from the first write
  CHECK(a.last_seen_ms == 30);

  REQUIRE(rows::InsertRankSteps(db.get(), {{"a", 1, 1, 5, "r1s5"},
                                           {"a", 1, 0, 5, "r0s5"},
                                           {"a", 1, 0, 6, "r0s6"},
                                           {"a", 1, 0, 5, "again"}})
              .ok());
  auto at = rows::RankStepsAt(db.get(), "a", 1, 5);
  REQUIRE(at.ok());
  REQUIRE(at->size() == 2);
  CHECK((*at)[0].rank == 0);
  CHECK((*at)[0].report == "r0s5");  // the repeat was ignored
  CHECK((*at)[0].step == 5);
  CHECK((*at)[1].report == "r1s5");
  auto after = rows::RankStepsAfter(db.get(), "a", 1, 5);
  REQUIRE(after.ok());
  REQUIRE(after->size() == 1);
  CHECK((*after)[0].step == 6);
  CHECK((*after)[0].attempt == 1);
}

TEST_CASE("store rows: recommended actions round-trip typed - a damaged column fails the read",
          "[server][store]") {
  MigratedDb db;
  IncidentRow inc;
  inc.id = 5;
  inc.run_id = "r";
  core::RecommendedAction q;
  q.kind = core::RecommendedAction::Kind::kQuarantineShards;
  q.shard_first = (uint64_t{1} << 60) + 1;  // beyond a double's exact integers
  q.shard_last = (uint64_t{1} << 60) + 3;
  q.text = "quarantine";
  core::RecommendedAction w;
  w.kind = core::RecommendedAction::Kind::kWidenPrecision;
  w.tensor = "lm_head.weight";
  w.text = "widen";
  inc.actions = {q, w};
  REQUIRE(rows::UpsertIncidents(db.get(), {inc}).ok());
  auto got = rows::GetIncident(db.get(), 5);
  REQUIRE(got.ok());
  REQUIRE((*got)->actions.size() == 2);
  CHECK((*got)->actions[0].shard_first == q.shard_first);
  CHECK((*got)->actions[0].shard_last == q.shard_last);
  CHECK((*got)->actions[1].tensor == "lm_head.weight");

  REQUIRE(sqlite3_exec(db.get(),
                       "UPDATE incidents SET actions = '[{\"kind\":\"quarantine_shards\"}]'",
                       nullptr, nullptr, nullptr) == SQLITE_OK);
  auto damaged = rows::GetIncident(db.get(), 5);
  CHECK(damaged.status().code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(damaged.status().message()).find("I-5") != std::string::npos);
  IncidentFilter all;
  CHECK(rows::ListIncidents(db.get(), all).status().code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("store rows: incidents upsert - flag shards - and list by filter", "[server][store]") {
  MigratedDb db;
  IncidentRow inc;
  inc.id = 3;
  inc.run_id = "r";
  inc.episode = 2;
  inc.tier = 2;
  inc.kind = core::EventKind::kSpike;
  inc.title = "spike";
  inc.shards = {11, 12};
  inc.actions.clear();
  REQUIRE(rows::UpsertIncidents(db.get(), {inc}).ok());
  inc.state = IncidentState::kResolved;
  inc.shards = {12, 13};
  inc.closed_ms = 50;
  REQUIRE(rows::UpsertIncidents(db.get(), {inc}).ok());

  auto got = rows::GetIncident(db.get(), 3);
  REQUIRE(got.ok());
  REQUIRE(got->has_value());
  CHECK((*got)->state == IncidentState::kResolved);
  CHECK((*got)->shards == std::vector<uint64_t>{12, 13});
  CHECK((*got)->closed_ms == 50);
  auto missing = rows::GetIncident(db.get(), 4);
  REQUIRE(missing.ok());
  CHECK_FALSE(missing->has_value());
  auto flagged = rows::FlaggedShards(db.get(), "r");
  REQUIRE(flagged.ok());
  CHECK(flagged->size() == 3);  // 11 stays flagged
  IncidentFilter open;
  open.open_only = true;
  auto list = rows::ListIncidents(db.get(), open);
  REQUIRE(list.ok());
  CHECK(list->empty());
  auto max = rows::MaxIncidentId(db.get());
  REQUIRE(max.ok());
  CHECK(*max == 3);

  EventRow ev;
  ev.run_id = "r";
  ev.incident_id = 3;
  ev.event.step = 40;
  ev.event.reason = "loss spike";
  ev.event.shards = {12};
  ev.created_ms = 7;
  REQUIRE(rows::InsertEvents(db.get(), {ev, ev}).ok());
  auto events = rows::EventsOfIncident(db.get(), 3);
  REQUIRE(events.ok());
  REQUIRE(events->size() == 2);  // appended, not deduplicated
  CHECK((*events)[0].event.reason == "loss spike");
  CHECK((*events)[0].event.shards == std::vector<uint64_t>{12});
}

TEST_CASE("store rows: decisions - commands - acks and quarantines round-trip", "[server][store]") {
  MigratedDb db;
  REQUIRE(
      rows::InsertDecisions(db.get(), {{1, 3, "r", "ann", "approve_rollback", "ok", "p1", "", 10},
                                       {2, 3, "r", "bob", "reject_rollback", "", "p2", "", 11},
                                       {3, 3, "r", "ann", "approve_rollback", "", "p3", "k", 12}})
          .ok());  // two empty keys: both are "none"
  CHECK_FALSE(
      rows::InsertDecisions(db.get(), {{4, 3, "r", "ann", "approve_rollback", "", "", "k", 13}})
          .ok());
  auto by_key = rows::FindDecisionByKey(db.get(), "k");
  REQUIRE(by_key.ok());
  REQUIRE(by_key->has_value());
  CHECK((*by_key)->id == 3);
  CHECK((*by_key)->payload == "p3");
  auto decisions = rows::DecisionsOfIncident(db.get(), 3);
  REQUIRE(decisions.ok());
  REQUIRE(decisions->size() == 3);
  CHECK((*decisions)[0].idempotency_key.empty());
  auto max = rows::MaxDecisionId(db.get());
  REQUIRE(max.ok());
  CHECK(*max == 3);

  REQUIRE(rows::InsertCommands(db.get(), {{"c1", "r", 3, "rollback", "x", 5},
                                          {"c2", "r", 3, "rollback", "y", 6},
                                          {"c1", "r", 3, "rollback", "z", 9}})
              .ok());
  auto latest = rows::LatestCommand(db.get(), 3);
  REQUIRE(latest.ok());
  REQUIRE(latest->has_value());
  CHECK((*latest)->id == "c2");
  REQUIRE(rows::InsertCommandAcks(db.get(), {{"c2", "r", 1, 2, "done", 40, 8},
                                             {"c2", "r", 0, 2, "done", 40, 7},
                                             {"c2", "r", 0, 2, "again", 41, 9},
                                             {"c2", "other", 2, 2, "forged", 41, 9}})
              .ok());
  auto acks = rows::CommandAcks(db.get(), "r", "c2");
  REQUIRE(acks.ok());
  REQUIRE(acks->size() == 2);  // run "other"'s row is not run "r"'s
  CHECK((*acks)[0].rank == 0);  // by time
  CHECK((*acks)[0].message == "done");

  REQUIRE(rows::InsertQuarantines(db.get(), {{"r", 10, 19, 3, 1, 5}}).ok());
  auto q = rows::Quarantines(db.get(), "r");
  REQUIRE(q.ok());
  REQUIRE(q->size() == 1);
  CHECK((*q)[0].first == 10);
  CHECK((*q)[0].last == 19);
  CHECK((*q)[0].decision_id == 1);
}

TEST_CASE("store rows: shard names round-trip in steps - incidents and quarantines",
          "[server][store][shards]") {
  MigratedDb db;
  // Names hold what no separator would survive: ';', ',', quotes, UTF-8.
  const std::vector<std::string> names = {"a;b", "train-00012-of-01024.parquet:7",
                                          "q\"uote,x", "\xc3\xa9"};
  StepRow named = Step(1, 2.0);
  named.shard_names = names;
  REQUIRE(rows::InsertSteps(db.get(), {{"r", 0, Step(0, 3.0)}, {"r", 0, named}}).ok());
  REQUIRE(rows::CopyAttempts(db.get(), {{"r", 0, 1, 1}}).ok());
  for (int64_t attempt : {0, 1}) {
    auto steps = rows::StepsBetween(db.get(), "r", attempt, 0, 10);
    REQUIRE(steps.ok());
    REQUIRE(steps->size() == 2);
    CHECK((*steps)[0].shard_names.empty());
    CHECK((*steps)[1].shard_names == names);
    CHECK((*steps)[1].shards == std::vector<uint64_t>{4, 5});
    // The engine's view carries them too, for a rebuild after a restart.
    CHECK((*steps)[1].View().shard_names.size() == names.size());
  }

  IncidentRow inc;
  inc.id = 3;
  inc.run_id = "r";
  inc.shard_names = names;
  REQUIRE(rows::UpsertIncidents(db.get(), {inc}).ok());
  auto got = rows::GetIncident(db.get(), 3);
  REQUIRE(got.ok());
  REQUIRE(got->has_value());
  CHECK((*got)->shard_names == names);

  QuarantineRow range{"r", 10, 19, 3, 1, 5};
  QuarantineRow name{"r", 0, 0, 3, 1, 6, "train-00012-of-01024.parquet"};
  REQUIRE(rows::InsertQuarantines(db.get(), {range, name}).ok());
  auto q = rows::Quarantines(db.get(), "r");
  REQUIRE(q.ok());
  REQUIRE(q->size() == 2);
  CHECK((*q)[0].name.empty());
  CHECK((*q)[0].last == 19);
  CHECK((*q)[1].name == "train-00012-of-01024.parquet");
  CHECK((*q)[1].created_ms == 6);
}

TEST_CASE("store rows: the outbox holds a page once until it is marked sent", "[server][store]") {
  MigratedDb db;
  OutboxRow page;
  page.incident_id = 3;
  page.channel = "oncall";
  page.kind = "trigger:open";
  page.payload = "{}";
  page.next_attempt_ms = 100;
  page.created_ms = 90;
  REQUIRE(rows::InsertOutbox(db.get(), {page, page}).ok());
  auto due = rows::DueOutbox(db.get(), 99, 10);
  REQUIRE(due.ok());
  CHECK(due->empty());  // not yet
  due = rows::DueOutbox(db.get(), 100, 10);
  REQUIRE(due.ok());
  REQUIRE(due->size() == 1);  // the repeat was ignored
  CHECK((*due)[0].state == "pending");
  const int64_t id = (*due)[0].id;

  REQUIRE(rows::MarkOutbox(db.get(), id, false, 1, 200, "503", 150).ok());
  due = rows::DueOutbox(db.get(), 150, 10);
  REQUIRE(due.ok());
  CHECK(due->empty());
  REQUIRE(rows::MarkOutbox(db.get(), id, true, 2, 200, "", 250).ok());
  auto all = rows::OutboxOfIncident(db.get(), 3);
  REQUIRE(all.ok());
  REQUIRE(all->size() == 1);
  CHECK((*all)[0].state == "sent");
  CHECK((*all)[0].attempts == 2);
  CHECK((*all)[0].sent_ms == 250);
  CHECK((*all)[0].payload == "{}");
}

}  // namespace
}  // namespace trainwatch::server
