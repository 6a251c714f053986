// The ingestor's pieces, each constructed alone: cross-rank aggregation of a
// step, the incidents of a run, and the rules of a rollback decision. No
// gRPC server, no store, no clock.

#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ingest/incident_tracker.h"
#include "ingest/rollback.h"
#include "ingest/step_aggregation.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server {
namespace {

using core::Signal;
namespace v1 = trainwatch::v1;

// `shards` must outlive the record (a view).
wire::ReportedStep Report(int64_t step, double loss, double grad, uint64_t nonfinite,
                          uint64_t elements, const std::vector<uint64_t>& shards) {
  wire::ReportedStep r;
  r.step = step;
  r.Set(Signal::kLoss, loss).Set(Signal::kGradNorm, grad).Set(Signal::kLogZ, 8.0);
  r.nonfinite = nonfinite;
  r.elements = elements;
  r.shards = shards;
  return r;
}

TEST_CASE("step aggregation: means - maxima - sums - union and the missing ranks",
          "[server][aggregation]") {
  StepAggregate a(/*first_ms=*/100);
  const std::vector<uint64_t> shards0 = {5, 3}, shards2 = {3, 9};
  CHECK(a.Add(0, Report(7, 2.0, 1.0, 0, 100, shards0)));
  CHECK(a.Add(2, Report(7, 4.0, 3.0, 10, 100, shards2)));
  CHECK_FALSE(a.Add(2, Report(7, 99.0, 99.0, 99, 99, {})));  // a re-send merges nothing
  CHECK(a.count() == 2);
  CHECK(a.first_ms() == 100);
  const StepRow s = a.Finish(7, 3);
  CHECK(s.step == 7);
  CHECK(s.Get(Signal::kLoss) == Approx(3.0));
  CHECK(s.Get(Signal::kGradNorm) == Approx(3.0));
  CHECK(s.Get(Signal::kLogZ) == Approx(8.0));
  CHECK(s.nonfinite == 10);
  CHECK(s.elements == 200);
  CHECK(s.Get(Signal::kNanFrac) == Approx(0.05));
  CHECK(s.shards == std::vector<uint64_t>{3, 5, 9});
  CHECK(s.missing_ranks == "1");
  CHECK(a.Finish(7, 2).missing_ranks == "1");
  CHECK(a.Finish(7, 1).missing_ranks.empty());
}

TEST_CASE("step aggregation: one nonfinite loss makes the mean NaN - absent stays absent",
          "[server][aggregation]") {
  StepAggregate a(0);
  a.Add(0, Report(1, 2.0, 1.0, 0, 10, {}));
  a.Add(1, Report(1, std::nan(""), 1.0, 0, 10, {}));
  const StepRow s = a.Finish(1, 2);
  REQUIRE(s.Has(Signal::kLoss));
  CHECK(std::isnan(s.Get(Signal::kLoss)));
  CHECK_FALSE(s.Has(Signal::kLearningRate));
  CHECK_FALSE(s.Has(Signal::kActivationMax));
}

TEST_CASE("step aggregation: activation and attention maxima - a nonfinite attention p99 wins",
          "[server][aggregation]") {
  StepAggregate a(0);
  wire::ReportedStep r0 = Report(4, 1.0, 1.0, 0, 10, {});
  r0.Set(Signal::kActivationMax, 3.0).Set(Signal::kAttentionLogitP99, 20.0);
  wire::ReportedStep r1 = Report(4, 1.0, 1.0, 0, 10, {});
  r1.Set(Signal::kActivationMax, 5.0).Set(Signal::kAttentionLogitP99, std::nan(""));
  wire::ReportedStep r2 = Report(4, 1.0, 1.0, 0, 10, {});
  r2.Set(Signal::kAttentionLogitP99, 30.0);
  a.Add(0, r0);
  a.Add(1, r1);
  a.Add(2, r2);
  const StepRow s = a.Finish(4, 3);
  CHECK(s.Get(Signal::kActivationMax) == 5.0);
  REQUIRE(s.Has(Signal::kAttentionLogitP99));
  CHECK(std::isnan(s.Get(Signal::kAttentionLogitP99)));
}

TEST_CASE("step aggregation: a global record keeps its nan_frac when it has no counts",
          "[server][aggregation]") {
  wire::ReportedStep r;
  r.step = 3;
  r.Set(Signal::kNanFrac, 0.25).Set(Signal::kLearningRate, 1e-3);
  const StepRow s = GlobalStep(r);
  CHECK(s.step == 3);
  CHECK(s.Get(Signal::kNanFrac) == Approx(0.25));
  CHECK(s.Get(Signal::kLearningRate) == Approx(1e-3));
  CHECK(s.missing_ranks.empty());
}

core::Event Page(int64_t step, uint64_t episode) {
  core::Event e;
  e.step = step;
  e.onset_step = step - 5;
  e.tier = 2;
  e.action = core::Action::kPage;
  e.kind = core::EventKind::kSpike;
  e.episode = episode;
  e.reason = "loss spike";
  e.recommended_checkpoint_step = 100;
  return e;
}

struct Collected {
  WriteBatch batch;
  std::vector<std::pair<IncidentRow, IncidentChange>> changes;
  IncidentSink sink() { return {&batch, &changes}; }
};

TEST_CASE("incident tracker: a page opens an incident - its episode's close resolves it",
          "[server][incidents]") {
  IncidentTracker t("run-a");
  IdCounters ids;
  Collected c;
  t.OnEvents(0, {Page(200, 1)}, 1000, &ids, c.sink());
  REQUIRE(c.changes.size() == 1);
  CHECK(c.changes[0].second == IncidentChange::kOpened);
  const IncidentRow& opened = c.changes[0].first;
  CHECK(opened.id == 1);
  CHECK(opened.state == IncidentState::kAwaitingDecision);
  CHECK(opened.detection_step == 200);
  CHECK(opened.recommended_checkpoint_step == 100);
  CHECK(t.open().size() == 1);
  CHECK(t.totals()[2] == 1);
  CHECK(c.batch.events.size() == 1);
  CHECK(c.batch.decisions.empty());  // a page waits for a human

  core::Event close = Page(210, 1);
  close.action = core::Action::kNone;
  close.tier = 0;
  close.closes_episode = true;
  t.OnEvents(0, {close}, 2000, &ids, c.sink());
  REQUIRE(c.changes.size() == 2);
  CHECK(c.changes[1].second == IncidentChange::kStateChanged);
  CHECK(c.changes[1].first.state == IncidentState::kResolved);
  CHECK(c.changes[1].first.closed_ms == 2000);
  CHECK(t.open().empty());
  CHECK(ids.next_incident == 2);
}

TEST_CASE("incident tracker: an agent's skip is recorded as the rule's decision",
          "[server][incidents]") {
  IncidentTracker t("run-a");
  IdCounters ids;
  Collected c;
  core::Event skip = Page(50, 3);
  skip.tier = 1;
  skip.action = core::Action::kSkipUpdate;
  skip.kind = core::EventKind::kDataAnomaly;
  t.OnEvents(0, {skip}, 1000, &ids, c.sink());
  REQUIRE(c.batch.decisions.size() == 1);
  CHECK(c.batch.decisions[0].kind == "skip_update");
  CHECK(c.batch.decisions[0].actor.rfind("rule:", 0) == 0);
  CHECK(ids.next_decision == 2);
  CHECK(c.changes[0].first.state == IncidentState::kOpen);
}

TEST_CASE("incident tracker: a watched rollback resolves when it holds - re-opens when not",
          "[server][incidents]") {
  IdCounters ids;
  for (bool recurs : {false, true}) {
    IncidentTracker t("run-a");
    Collected c;
    t.OnEvents(0, {Page(200, 1)}, 1000, &ids, c.sink());
    IncidentRow inc = c.changes.back().first;
    inc.state = IncidentState::kRollingBack;
    t.Update(inc);
    t.Watch(inc.id, 200);
    t.OnEvaluated(150, 1100, c.sink());  // not there yet
    CHECK(c.changes.size() == 1);
    if (recurs) {
      t.OnEvents(1, {Page(180, 1)}, 1200, &ids, c.sink());
      CHECK(c.changes[1].second == IncidentChange::kStateChanged);
      CHECK(c.changes[1].first.state == IncidentState::kAwaitingDecision);
      CHECK(c.changes[1].first.title.rfind("recurred after rollback: ", 0) == 0);
    } else {
      t.OnEvaluated(200, 1300, c.sink());
      REQUIRE(c.changes.size() == 2);
      CHECK(c.changes[1].first.state == IncidentState::kResolved);
      CHECK(t.open().empty());
    }
  }
}

IncidentRow PagedIncident() {
  IncidentRow inc;
  inc.id = 4;
  inc.run_id = "run-a";
  inc.tier = 2;
  inc.state = IncidentState::kAwaitingDecision;
  inc.onset_step = 600;
  inc.detection_step = 652;
  inc.recommended_checkpoint_step = 500;
  core::RecommendedAction q;
  q.kind = core::RecommendedAction::Kind::kQuarantineShards;
  q.shard_first = 10;
  q.shard_last = 20;
  q.text = "quarantine shards 10..20";
  core::RecommendedAction z;
  z.kind = core::RecommendedAction::Kind::kSetZLossAlpha;
  z.z_loss_alpha = 1e-4;
  z.text = "set z-loss";
  inc.actions = {q, z};
  return inc;
}

TEST_CASE("rollback: the plan takes the recommendation unless the operator overrides it",
          "[server][rollback]") {
  const IncidentRow inc = PagedIncident();
  const std::vector<CheckpointRow> retained = {{"run-a", 400, "ck/400", 0},
                                               {"run-a", 500, "ck/500", 0}};
  ApprovalRequest r;
  absl::StatusOr<v1::RollbackPlan> plan = PlanRollback(inc, r, retained, 8);
  REQUIRE(plan.ok());
  CHECK(plan->target_step() == 500);
  CHECK(plan->checkpoint_uri() == "ck/500");
  CHECK(plan->skip_steps().first() == 592);
  CHECK(plan->skip_steps().last() == 652);
  REQUIRE(plan->quarantine().ranges_size() == 1);
  CHECK(plan->quarantine().ranges(0).first() == 10);
  REQUIRE(plan->settings_size() == 1);
  CHECK(plan->settings(0).z_loss_alpha() == Approx(1e-4));

  r.to_step = 400;
  r.quarantine = ShardQuarantine{};
  r.skip_steps = std::make_pair(int64_t{1}, int64_t{0});  // none
  plan = PlanRollback(inc, r, retained, 8);
  REQUIRE(plan.ok());
  CHECK(plan->target_step() == 400);
  CHECK(plan->quarantine().ranges_size() == 0);
  CHECK_FALSE(plan->has_skip_steps());

  r.to_step = 450;
  plan = PlanRollback(inc, r, retained, 8);
  CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(plan.status().message()).find("the retained ones are at steps 400, 500; pass --to-step with one of them") != std::string::npos);
}

TEST_CASE("rollback: the incident's state refuses a second decision and says who made the first",
          "[server][rollback]") {
  IncidentRow inc = PagedIncident();
  CHECK(RefuseDecision(inc, true, {}).ok());
  inc.state = IncidentState::kDismissed;
  DecisionRow d;
  d.id = 9;
  d.kind = "reject_rollback";
  d.actor = "alice";
  d.comment = "noise";
  const std::vector<DecisionRow> prior = {d};
  const absl::Status st = RefuseDecision(inc, true, prior);
  CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(st.message()).find("rejected by alice, D-9") != std::string::npos);
  inc.state = IncidentState::kOpen;
  inc.tier = 1;
  CHECK(RefuseDecision(inc, true, {}).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(RefuseDecision(inc, false, {}).ok());
}

TEST_CASE("rollback: default skipped steps only for a page - never before the checkpoint",
          "[server][rollback]") {
  IncidentRow inc = PagedIncident();
  auto skip = DefaultSkipSteps(inc, 620, 8);
  REQUIRE(skip);
  CHECK(skip->first == 621);
  CHECK(skip->second == 652);
  CHECK_FALSE(DefaultSkipSteps(inc, 700, 8));
  inc.tier = 3;
  CHECK_FALSE(DefaultSkipSteps(inc, 500, 8));
}

TEST_CASE("rollback: the command completes when every rank applied it", "[server][rollback]") {
  RollbackCommand c;
  CHECK_FALSE(c.OnAck(0, v1::ACK_STATUS_APPLIED, 2));
  CHECK_FALSE(c.OnAck(1, v1::ACK_STATUS_FAILED, 2));
  CHECK(c.failed.count(1) == 1);
  CHECK_FALSE(c.OnAck(0, v1::ACK_STATUS_APPLIED, 2));  // a repeat counts once
  CHECK(c.OnAck(1, v1::ACK_STATUS_APPLIED, 2));
  CHECK(c.failed.empty());
}

}  // namespace
}  // namespace trainwatch::server
