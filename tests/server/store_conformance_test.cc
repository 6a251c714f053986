// One conformance suite for every Store backend (store.h): each section runs
// against SQLite (a file in a temporary folder) and PostgreSQL (a fresh
// database on a real PostgreSQL 15 primary, tests/testing/pg_cluster.h),
// both opened by Store::Open from the database's name, as trainwatchd does.
// Whatever a caller can observe through the interface must be the same.
//
// A backend's test case starts at most one cluster, shared by its sections
// (each section gets a database of its own): starting one costs seconds.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "store/pg/pg_connection.h"
#include "store/store.h"
#include "testing/pg_cluster.h"
#include "testing/temp_dir.h"
#include "trainwatch/core/event.h"

namespace trainwatch::server {
namespace {

using testing::PgCluster;

#define REQUIRE_OK(expr)                 \
  do {                                   \
    const absl::Status status_ = (expr); \
    INFO(status_.ToString());            \
    REQUIRE(status_.ok());               \
  } while (false)

template <typename T>
T Get(absl::StatusOr<T> v) {
  INFO(v.status().ToString());
  REQUIRE(v.ok());
  return *std::move(v);
}

// ---- the backends

class SqliteBackend {
 public:
  SqliteBackend() : dir_("store_conformance_"), db_(dir_.path() + "/tw.db") {}
  const std::string& db() const { return db_; }

 private:
  testing::ScopedTempDir dir_;
  std::string db_;
};

// One primary for the whole executable run, stopped at exit.
PgCluster& SharedCluster() {
  static std::unique_ptr<PgCluster> cluster = [] {
    absl::StatusOr<std::unique_ptr<PgCluster>> c = PgCluster::Start(/*with_standby=*/false);
    if (!c.ok()) FAIL("cannot start PostgreSQL: " << c.status().ToString());
    return *std::move(c);
  }();
  return *cluster;
}

class PgBackend {
 public:
  PgBackend() {
    static int databases = 0;
    const std::string name = "conformance" + std::to_string(++databases);
    PgCluster& cluster = SharedCluster();
    auto admin = Get(PgConnection::Connect(cluster.Conninfo(PgCluster::Node::kPrimary)));
    Get(admin->Execute("CREATE DATABASE " + name));
    // libpq takes the last value of a keyword given twice.
    db_ = cluster.Conninfo(PgCluster::Node::kPrimary) + " dbname=" + name;
  }
  const std::string& db() const { return db_; }

 private:
  std::string db_;
};

std::unique_ptr<Store> Open(const std::string& db, const StoreOptions& options = {}) {
  return Get(Store::Open(db, options));
}

// ---- rows

bool Same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

StepRow Step(int64_t n, double loss) {
  StepRow s;
  s.step = n;
  s.Set(core::Signal::kLoss, loss);
  s.Set(core::Signal::kGradNorm, 0.5 + static_cast<double>(n));
  s.loss_ema_ratio = 1.25;
  s.received_ms = 1000 + n;
  return s;
}

WriteBatch::Step In(const std::string& run, int64_t attempt, StepRow s) {
  return WriteBatch::Step{run, attempt, std::move(s)};
}

void CheckSameStep(const StepRow& got, const StepRow& want) {
  INFO("step " << want.step);
  CHECK(got.step == want.step);
  CHECK(got.present() == want.present());
  for (int i = 0; i < core::kNumSignals; ++i) {
    const auto signal = static_cast<core::Signal>(i);
    CHECK(got.Has(signal) == want.Has(signal));
    CHECK(Same(got.Get(signal), want.Get(signal)));
  }
  CHECK(Same(got.loss_ema_ratio, want.loss_ema_ratio));
  CHECK(got.has_counts() == want.has_counts());
  CHECK(got.nonfinite == want.nonfinite);
  CHECK(got.elements == want.elements);
  CHECK(got.decision == want.decision);
  CHECK(got.shards == want.shards);
  CHECK(got.shard_names == want.shard_names);
  CHECK(got.missing_ranks == want.missing_ranks);
  CHECK(got.late == want.late);
  CHECK(got.received_ms == want.received_ms);
  CHECK(got.HasLossScale() == want.HasLossScale());
  CHECK(Same(got.loss_scale(), want.loss_scale()));
  CHECK(got.loss_scale_overflow() == want.loss_scale_overflow());
}

IncidentRow Incident(int64_t id, const std::string& run, int tier, IncidentState state) {
  IncidentRow r;
  r.id = id;
  r.run_id = run;
  r.episode = static_cast<uint64_t>(id);
  r.tier = tier;
  r.state = state;
  r.kind = core::EventKind::kSpike;
  r.title = "loss spike \"x\" in " + run;
  r.onset_step = 10 * id;
  r.detection_step = 10 * id + 3;
  r.recommended_checkpoint_step = 5;
  r.recommended_checkpoint_uri = "s3://bucket/ckpt-5";
  r.opened_ms = 100 + id;
  r.updated_ms = 200 + id;
  return r;
}

// Bytes no text column could hold: a serialized message's.
std::string Binary(int seed) {
  std::string b = {'\0', '\xff', '\x01', '\\', 'x', '\'', '\0'};
  b += std::to_string(seed);
  return b;
}

TEMPLATE_TEST_CASE("store conformance", "[server][store][conformance]", SqliteBackend,
                   PgBackend) {
  TestType backend;
  const std::string& db = backend.db();

  SECTION("an empty store reads as empty") {
    auto store = Open(db);
    CHECK(store->schema_version() > 0);
    CHECK(Get(store->LoadRuns()).empty());
    CHECK(Get(store->MaxIncidentId()) == 0);
    CHECK(Get(store->MaxDecisionId()) == 0);
    CHECK(Get(store->CountSteps("r")) == 0);
    CHECK(Get(store->CountSkipped("r", 0)) == 0);
    CHECK(Get(store->CountLossScaleOverflows("r", 0)) == 0);
    CHECK(Get(store->RecentSteps("r", 0, 10)).empty());
    CHECK(!Get(store->GetIncident(1)).has_value());
    CHECK(Get(store->ListIncidents({})).empty());
    CHECK(!Get(store->FindDecisionByKey("k")).has_value());
    CHECK(!Get(store->LatestCommand(1)).has_value());
    CHECK(!Get(store->LatestEngineSnapshot("r", 0, 100)).has_value());
    CHECK(Get(store->DueOutbox(1 << 30, 10)).empty());
    CHECK(Get(store->Incarnations("r")).empty());
    REQUIRE_OK(store->Write(WriteBatch{}));  // an empty batch is fine
    std::vector<AttemptRow> attempts = Get(store->Attempts("r", 0));
    REQUIRE(attempts.size() == 1);
    CHECK(attempts[0].start == AttemptStart::kFirst);
    CHECK(attempts[0].first_step == -1);
  }

  SECTION("steps come back as written: values, NaN and absent signals, counts, shards") {
    auto store = Open(db);
    std::vector<StepRow> want;
    StepRow plain = Step(0, 2.5);
    want.push_back(plain);
    StepRow nan = Step(1, std::numeric_limits<double>::quiet_NaN());  // reported NaN
    nan.Set(core::Signal::kLearningRate, std::numeric_limits<double>::infinity());
    nan.Set(core::Signal::kNanFrac, -std::numeric_limits<double>::infinity());
    nan.loss_ema_ratio = std::numeric_limits<double>::quiet_NaN();
    nan.nonfinite = 3;
    nan.elements = 1000;
    nan.decision = static_cast<int>(core::Decision::kSkipUpdate);
    want.push_back(nan);
    StepRow absent;  // no signal at all, no counts
    absent.step = 2;
    absent.received_ms = 7;
    want.push_back(absent);
    StepRow shards = Step(3, 0.1 + 0.2);  // a double with no short decimal
    shards.shards = {0, 7, std::numeric_limits<uint64_t>::max()};
    shards.shard_names = {"a,b", "quote\"d", "back\\slash", "new\nline", "\xc3\xa9t\xc3\xa9",
                          "nul\x01"};
    shards.missing_ranks = "3,7-9";
    shards.elements = 5;  // counts with none nonfinite
    shards.SetLossScale(65536.0, false);
    want.push_back(shards);
    StepRow overflow = Step(4, 1.0);
    overflow.SetLossScale(std::numeric_limits<double>::quiet_NaN(), true);
    overflow.decision = static_cast<int>(core::Decision::kSkipUpdate);
    want.push_back(overflow);
    StepRow late = Step(5, 9.0);
    late.late = true;
    late.decision = static_cast<int>(core::Decision::kSkipUpdate);
    late.SetLossScale(2.0, true);
    want.push_back(late);

    WriteBatch b;
    for (const StepRow& s : want) b.steps.push_back(In("run-a", 0, s));
    b.steps.push_back(In("run-b", 0, Step(0, 4.0)));
    b.steps.push_back(In("run-a", 1, Step(0, 5.0)));
    REQUIRE_OK(store->Write(b));

    std::vector<StepRow> recent = Get(store->RecentSteps("run-a", 0, 100));
    REQUIRE(recent.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) CheckSameStep(recent[i], want[i]);
    std::vector<StepRow> last2 = Get(store->RecentSteps("run-a", 0, 2));
    REQUIRE(last2.size() == 2);
    CHECK(last2[0].step == 4);
    CHECK(last2[1].step == 5);
    std::vector<StepRow> between = Get(store->StepsBetween("run-a", 0, 1, 3));
    REQUIRE(between.size() == 3);
    for (size_t i = 0; i < between.size(); ++i) CheckSameStep(between[i], want[i + 1]);

    // The rebuild's reader leaves out late steps and starts after a step.
    std::vector<int64_t> seen;
    REQUIRE_OK(store->ForEachStep("run-a", 0, [&](const StepRow& s, const std::string& uri) {
      seen.push_back(s.step);
      CHECK(uri.empty());
      CheckSameStep(s, want[static_cast<size_t>(s.step)]);
    }));
    CHECK(seen == std::vector<int64_t>{0, 1, 2, 3, 4});
    seen.clear();
    REQUIRE_OK(store->ForEachStep(
        "run-a", 0, [&](const StepRow& s, const std::string&) { seen.push_back(s.step); }, 2));
    CHECK(seen == std::vector<int64_t>{3, 4});

    CHECK(Get(store->CountSteps("run-a")) == 7);  // both attempts
    CHECK(Get(store->CountSteps("run-b")) == 1);
    CHECK(Get(store->CountSkipped("run-a", 0)) == 2);  // not the late one
    CHECK(Get(store->CountLossScaleOverflows("run-a", 0)) == 1);
    CHECK(Get(store->CountSkipped("run-a", 1)) == 0);
  }

  SECTION("the rebuild reads a long history whole and in order") {
    // Past any chunk a backend reads a history in (PostgreSQL's: 10,000).
    constexpr int64_t kSteps = 20'005;
    auto store = Open(db);
    WriteBatch b;
    for (int64_t s = 0; s < kSteps; ++s) b.steps.push_back(In("r", 0, Step(s, 1.0)));
    REQUIRE_OK(store->Write(b));
    int64_t next = 0;
    bool in_order = true;
    REQUIRE_OK(store->ForEachStep("r", 0, [&](const StepRow& s, const std::string&) {
      in_order = in_order && s.step == next;
      ++next;
    }));
    CHECK(in_order);
    CHECK(next == kSteps);
    next = 10'000;
    REQUIRE_OK(store->ForEachStep(
        "r", 0, [&](const StepRow& s, const std::string&) { next += s.step == next + 1; },
        10'000));
    CHECK(next == kSteps - 1);
  }

  SECTION("a repeated step or rank report is ignored: the first write wins") {
    auto store = Open(db);
    WriteBatch b;
    b.steps.push_back(In("r", 0, Step(1, 1.0)));
    b.steps.push_back(In("r", 0, Step(1, 2.0)));  // repeated within the batch
    b.rank_steps.push_back({"r", 0, 0, 1, "first"});
    b.rank_steps.push_back({"r", 0, 0, 1, "second"});
    REQUIRE_OK(store->Write(b));
    WriteBatch again;  // and in a later batch, with new rows beside it
    again.steps.push_back(In("r", 0, Step(1, 3.0)));
    again.steps.push_back(In("r", 0, Step(2, 4.0)));
    again.rank_steps.push_back({"r", 0, 0, 1, "third"});
    again.rank_steps.push_back({"r", 0, 1, 1, "rank 1"});
    REQUIRE_OK(store->Write(again));
    std::vector<StepRow> steps = Get(store->RecentSteps("r", 0, 10));
    REQUIRE(steps.size() == 2);
    CHECK(steps[0].Get(core::Signal::kLoss) == 1.0);
    CHECK(steps[1].Get(core::Signal::kLoss) == 4.0);
    std::vector<RankStepRow> ranks = Get(store->RankStepsAt("r", 0, 1));
    REQUIRE(ranks.size() == 2);
    CHECK(ranks[0].report == "first");
    CHECK(ranks[1].report == "rank 1");
    CHECK(Get(store->CountSteps("r")) == 2);
  }

  SECTION("rank reports: bytes kept exactly, read by step then rank") {
    auto store = Open(db);
    WriteBatch b;
    for (int64_t step = 0; step < 4; ++step) {
      for (int32_t rank = 2; rank >= 0; --rank) {
        b.rank_steps.push_back({"r", 0, rank, step, Binary(static_cast<int>(step * 10 + rank))});
      }
    }
    b.rank_steps.push_back({"r", 1, 0, 2, "other attempt"});
    REQUIRE_OK(store->Write(b));
    std::vector<RankStepRow> at = Get(store->RankStepsAt("r", 0, 2));
    REQUIRE(at.size() == 3);
    for (int32_t rank = 0; rank < 3; ++rank) {
      CHECK(at[rank].run_id == "r");
      CHECK(at[rank].attempt == 0);
      CHECK(at[rank].rank == rank);
      CHECK(at[rank].step == 2);
      CHECK(at[rank].report == Binary(20 + rank));
    }
    std::vector<RankStepRow> after = Get(store->LoadRankStepsAfter("r", 0, 1));
    REQUIRE(after.size() == 6);
    CHECK(after[0].step == 2);
    CHECK(after[0].rank == 0);
    CHECK(after[5].step == 3);
    CHECK(after[5].rank == 2);
    CHECK(Get(store->RankStepsAt("r", 1, 2)).size() == 1);
  }

  SECTION("runs are upserted: the first creation time stays, the rest follows") {
    auto store = Open(db);
    RunRow run;
    run.run_id = "job-1";
    run.world_size = 8;
    run.created_ms = 100;
    run.last_seen_ms = 100;
    run.rules_json = R"({"spike_sigma": 6})";
    run.rules_source = "hello";
    run.attachment = "ranks: 8; optimizers: AdamW; mode: enforcing (skip and halt)";
    WriteBatch b;
    b.runs.push_back(run);
    RunRow other;
    other.run_id = "job-0";
    other.created_ms = 5;
    other.last_seen_ms = 5;
    b.runs.push_back(other);
    REQUIRE_OK(store->Write(b));
    run.created_ms = 999;  // ignored by the upsert
    run.attempt = 2;
    run.last_step = 41;
    run.last_seen_ms = 300;
    run.incarnation = "inc-2";
    run.resume_step = 40;
    run.observed = true;
    run.rules_json = R"({"spike_sigma": 7})";
    run.rules_source = "run_rules";
    run.attachment = "not attached: the layout is unknown";  // the next launch's
    b.clear();
    b.runs.push_back(run);
    b.runs.push_back(run);  // twice in a batch
    REQUIRE_OK(store->Write(b));
    std::vector<RunRow> runs = Get(store->LoadRuns());
    REQUIRE(runs.size() == 2);
    CHECK(runs[0].run_id == "job-0");
    CHECK(!runs[0].resume_step.has_value());
    CHECK(runs[0].world_size == 1);
    CHECK(runs[0].rules_json.empty());
    CHECK(runs[0].attachment.empty());
    const RunRow& got = runs[1];
    CHECK(got.run_id == "job-1");
    CHECK(got.world_size == 8);
    CHECK(got.attempt == 2);
    CHECK(got.last_step == 41);
    CHECK(got.created_ms == 100);
    CHECK(got.last_seen_ms == 300);
    CHECK(got.incarnation == "inc-2");
    CHECK(got.resume_step == std::optional<int64_t>(40));
    CHECK(got.observed);
    CHECK(got.rules_json == R"({"spike_sigma": 7})");
    CHECK(got.rules_source == "run_rules");
    CHECK(got.attachment == "not attached: the layout is unknown");
  }

  SECTION("incidents: upserted whole, filtered and paged; events and flagged shards") {
    auto store = Open(db);
    WriteBatch b;
    IncidentRow first = Incident(1, "run-a", 2, IncidentState::kOpen);
    first.shards = {3, 9, std::numeric_limits<uint64_t>::max()};
    first.shard_names = {"train-00017", "ü"};
    core::RecommendedAction quarantine;
    quarantine.kind = core::RecommendedAction::Kind::kQuarantineShards;
    quarantine.shard_first = 3;
    quarantine.shard_last = 9;
    first.actions.push_back(quarantine);
    first.observed = true;
    b.incidents.push_back(first);
    b.incidents.push_back(Incident(2, "run-a", 1, IncidentState::kResolved));
    b.incidents.push_back(Incident(3, "run-b", 2, IncidentState::kAwaitingDecision));
    b.incidents.push_back(Incident(4, "run-b", 3, IncidentState::kDismissed));
    b.incidents.push_back(Incident(5, "run-a", 2, IncidentState::kAcknowledged));
    EventRow e;
    e.run_id = "run-a";
    e.incident_id = 1;
    e.event.step = 13;
    e.event.onset_step = 10;
    e.event.tier = 2;
    e.event.action = core::Action::kPage;
    e.event.kind = core::EventKind::kSpike;
    e.event.episode = 1;
    e.event.reason = "loss 9.1 > 6 sigma";
    e.event.shards = {3, 9};
    e.event.recommended_checkpoint_step = 5;
    e.created_ms = 77;
    b.events.push_back(e);
    e.event.step = 14;
    e.event.reason = "still high";
    b.events.push_back(e);
    REQUIRE_OK(store->Write(b));

    std::optional<IncidentRow> got = Get(store->GetIncident(1));
    REQUIRE(got.has_value());
    CHECK(got->run_id == "run-a");
    CHECK(got->episode == 1);
    CHECK(got->tier == 2);
    CHECK(got->state == IncidentState::kOpen);
    CHECK(got->title == first.title);
    CHECK(got->onset_step == 10);
    CHECK(got->detection_step == 13);
    CHECK(got->recommended_checkpoint_step == 5);
    CHECK(got->recommended_checkpoint_uri == "s3://bucket/ckpt-5");
    CHECK(got->shards == first.shards);
    CHECK(got->shard_names == first.shard_names);
    REQUIRE(got->actions.size() == 1);
    CHECK(got->actions[0].kind == core::RecommendedAction::Kind::kQuarantineShards);
    CHECK(got->actions[0].shard_last == 9);
    CHECK(got->opened_ms == 101);
    CHECK(got->updated_ms == 201);
    CHECK(got->closed_ms == 0);
    CHECK(got->observed);
    CHECK(Get(store->MaxIncidentId()) == 5);

    // An upsert replaces the row.
    first.state = IncidentState::kResolved;
    first.closed_ms = 500;
    first.title = "resolved";
    first.actions.clear();
    b.clear();
    b.incidents.push_back(first);
    REQUIRE_OK(store->Write(b));
    got = Get(store->GetIncident(1));
    REQUIRE(got.has_value());
    CHECK(got->state == IncidentState::kResolved);
    CHECK(got->closed_ms == 500);
    CHECK(got->title == "resolved");
    CHECK(got->actions.empty());

    auto ids = [](const std::vector<IncidentRow>& rows) {
      std::vector<int64_t> out;
      for (const IncidentRow& r : rows) out.push_back(r.id);
      return out;
    };
    CHECK(ids(Get(store->ListIncidents({}))) == std::vector<int64_t>{1, 2, 3, 4, 5});
    IncidentFilter f;
    f.run_id = "run-a";
    CHECK(ids(Get(store->ListIncidents(f))) == std::vector<int64_t>{1, 2, 5});
    f.open_only = true;
    CHECK(ids(Get(store->ListIncidents(f))) == std::vector<int64_t>{5});
    f = IncidentFilter{};
    f.open_only = true;
    CHECK(ids(Get(store->ListIncidents(f))) == std::vector<int64_t>{3, 5});
    f = IncidentFilter{};
    f.tier = 2;
    CHECK(ids(Get(store->ListIncidents(f))) == std::vector<int64_t>{1, 3, 5});
    f = IncidentFilter{};
    f.limit = 2;
    CHECK(ids(Get(store->ListIncidents(f))) == std::vector<int64_t>{1, 2});
    f.after_id = 2;
    CHECK(ids(Get(store->ListIncidents(f))) == std::vector<int64_t>{3, 4});
    f.after_id = 4;
    CHECK(ids(Get(store->ListIncidents(f))) == std::vector<int64_t>{5});

    std::vector<EventRow> events = Get(store->EventsOfIncident(1));
    REQUIRE(events.size() == 2);
    CHECK(events[0].run_id == "run-a");
    CHECK(events[0].incident_id == 1);
    CHECK(events[0].event.step == 13);
    CHECK(events[0].event.onset_step == 10);
    CHECK(events[0].event.tier == 2);
    CHECK(events[0].event.action == core::Action::kPage);
    CHECK(events[0].event.episode == 1);
    CHECK(events[0].event.reason == "loss 9.1 > 6 sigma");
    CHECK(events[0].event.shards == std::vector<uint64_t>{3, 9});
    CHECK(events[0].event.recommended_checkpoint_step == 5);
    CHECK(events[0].created_ms == 77);
    CHECK(events[1].event.reason == "still high");
    CHECK(Get(store->EventsOfIncident(2)).empty());

    // Flagged by the shards of incident 1, once whatever the upserts.
    std::vector<std::pair<uint64_t, int64_t>> flagged = Get(store->FlaggedShards("run-a"));
    // By shard as stored: the int64 bits, so the largest uint64 comes first.
    REQUIRE(flagged.size() == 3);
    CHECK(flagged[0] == std::pair<uint64_t, int64_t>(std::numeric_limits<uint64_t>::max(), 1));
    CHECK(flagged[1] == std::pair<uint64_t, int64_t>(3, 1));
    CHECK(flagged[2] == std::pair<uint64_t, int64_t>(9, 1));
    CHECK(Get(store->FlaggedShards("run-b")).empty());
  }

  SECTION("checkpoints: one per step, the last report wins; the rebuild sees its uri") {
    auto store = Open(db);
    WriteBatch b;
    b.steps.push_back(In("r", 0, Step(5, 1.0)));
    b.steps.push_back(In("r", 0, Step(6, 1.0)));
    b.checkpoints.push_back({"r", 10, "s3://b/ckpt-10", 30});
    b.checkpoints.push_back({"r", 5, "s3://b/old", 10});
    REQUIRE_OK(store->Write(b));
    b.clear();
    b.checkpoints.push_back({"r", 5, "s3://b/ckpt-5", 20});
    REQUIRE_OK(store->Write(b));
    std::vector<CheckpointRow> rows = Get(store->Checkpoints("r"));
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].run_id == "r");
    CHECK(rows[0].step == 5);
    CHECK(rows[0].uri == "s3://b/ckpt-5");
    CHECK(rows[0].reported_ms == 20);
    CHECK(rows[1].step == 10);
    std::vector<std::string> uris;
    REQUIRE_OK(store->ForEachStep("r", 0, [&](const StepRow&, const std::string& uri) {
      uris.push_back(uri);
    }));
    CHECK(uris == std::vector<std::string>{"s3://b/ckpt-5", ""});
  }

  SECTION("decisions, commands, acknowledgements and quarantines") {
    auto store = Open(db);
    WriteBatch b;
    DecisionRow d;
    d.id = 7;
    d.incident_id = 3;
    d.run_id = "r";
    d.actor = "alice";
    d.kind = "approve_rollback";
    d.comment = "go";
    d.payload = Binary(7);
    d.idempotency_key = "key-1";
    d.at_ms = 50;
    b.decisions.push_back(d);
    DecisionRow no_key = d;
    no_key.id = 8;
    no_key.idempotency_key.clear();
    b.decisions.push_back(no_key);
    DecisionRow no_key2 = no_key;  // any number of decisions without a key
    no_key2.id = 9;
    b.decisions.push_back(no_key2);
    b.commands.push_back({"cmd-1", "r", 3, "rollback", Binary(1), 60});
    b.commands.push_back({"cmd-2", "r", 3, "rollback", Binary(2), 70});
    b.commands.push_back({"cmd-0", "r", 4, "rollback", Binary(0), 10});
    b.command_acks.push_back({"cmd-2", "r", 0, 1, "ok", 40, 80});
    b.command_acks.push_back({"cmd-2", "r", 1, 1, "ok", 40, 81});
    b.command_acks.push_back({"cmd-2", "r", 1, 1, "again", 40, 82});  // ignored
    b.command_acks.push_back({"cmd-2", "other-run", 0, 1, "forged", 40, 83});
    b.quarantines.push_back({"r", 3, 9, 3, 7, 90, ""});
    b.quarantines.push_back({"r", 0, 0, 3, 7, 91, "train-00017"});
    REQUIRE_OK(store->Write(b));

    std::optional<DecisionRow> found = Get(store->FindDecisionByKey("key-1"));
    REQUIRE(found.has_value());
    CHECK(found->id == 7);
    CHECK(found->incident_id == 3);
    CHECK(found->run_id == "r");
    CHECK(found->actor == "alice");
    CHECK(found->kind == "approve_rollback");
    CHECK(found->comment == "go");
    CHECK(found->payload == Binary(7));
    CHECK(found->idempotency_key == "key-1");
    CHECK(found->at_ms == 50);
    CHECK(!Get(store->FindDecisionByKey("key-2")).has_value());
    std::vector<DecisionRow> of3 = Get(store->DecisionsOfIncident(3));
    REQUIRE(of3.size() == 3);
    CHECK(of3[1].id == 8);
    CHECK(of3[1].idempotency_key.empty());
    CHECK(Get(store->MaxDecisionId()) == 9);

    // A repeated idempotency key fails the batch, and nothing of it stays.
    WriteBatch dup;
    DecisionRow again = d;
    again.id = 10;
    dup.decisions.push_back(again);
    dup.steps.push_back(In("r", 0, Step(1, 1.0)));
    dup.incidents.push_back(Incident(42, "r", 2, IncidentState::kOpen));
    CHECK_FALSE(store->Write(dup).ok());
    CHECK(Get(store->MaxDecisionId()) == 9);
    CHECK(Get(store->CountSteps("r")) == 0);
    CHECK(!Get(store->GetIncident(42)).has_value());
    // The store is usable after the failed batch.
    dup.decisions.clear();
    REQUIRE_OK(store->Write(dup));
    CHECK(Get(store->CountSteps("r")) == 1);

    std::optional<CommandRow> latest = Get(store->LatestCommand(3));
    REQUIRE(latest.has_value());
    CHECK(latest->id == "cmd-2");
    CHECK(latest->run_id == "r");
    CHECK(latest->incident_id == 3);
    CHECK(latest->kind == "rollback");
    CHECK(latest->payload == Binary(2));
    CHECK(latest->created_ms == 70);
    CHECK(Get(store->LatestCommand(4))->id == "cmd-0");

    std::vector<CommandAckRow> acks = Get(store->CommandAcks("r", "cmd-2"));
    REQUIRE(acks.size() == 2);
    CHECK(acks[0].command_id == "cmd-2");
    CHECK(acks[0].run_id == "r");
    CHECK(acks[0].rank == 0);
    CHECK(acks[0].status == 1);
    CHECK(acks[0].message == "ok");
    CHECK(acks[0].resumed_step == 40);
    CHECK(acks[0].at_ms == 80);
    CHECK(acks[1].rank == 1);
    CHECK(acks[1].message == "ok");
    CHECK(Get(store->CommandAcks("other-run", "cmd-2")).size() == 1);
    CHECK(Get(store->CommandAcks("r", "cmd-1")).empty());

    std::vector<QuarantineRow> q = Get(store->Quarantines("r"));
    REQUIRE(q.size() == 2);
    CHECK(q[0].run_id == "r");
    CHECK(q[0].first == 3);
    CHECK(q[0].last == 9);
    CHECK(q[0].incident_id == 3);
    CHECK(q[0].decision_id == 7);
    CHECK(q[0].created_ms == 90);
    CHECK(q[0].name.empty());
    CHECK(q[1].name == "train-00017");
    CHECK(Get(store->Quarantines("other")).empty());
  }

  SECTION("attempts: a copy carries the steps up to its step; incarnations once each") {
    auto store = Open(db);
    WriteBatch b;
    for (int64_t s = 0; s < 10; ++s) b.steps.push_back(In("r", 0, Step(s, 1.0)));
    // The copy runs after this batch's steps.
    b.attempt_copies.push_back({"r", 0, 1, 6, AttemptStart::kRollback, 3, "", 500});
    b.incarnations.push_back({"r", "inc-a", 10});
    b.incarnations.push_back({"r", "inc-a", 11});
    b.incarnations.push_back({"r", "inc-b", 12});
    REQUIRE_OK(store->Write(b));
    b.clear();
    b.steps.push_back(In("r", 1, Step(7, 2.0)));
    b.attempt_copies.push_back({"r", 1, 2, 7, AttemptStart::kResume, 0, "inc-b", 600});
    b.incarnations.push_back({"r", "inc-a", 13});
    REQUIRE_OK(store->Write(b));

    std::vector<StepRow> copied = Get(store->StepsBetween("r", 1, 0, 100));
    REQUIRE(copied.size() == 8);  // 0..6 copied, 7 new
    CHECK(copied.back().Get(core::Signal::kLoss) == 2.0);
    CHECK(Get(store->StepsBetween("r", 2, 0, 100)).size() == 8);
    CHECK(Get(store->CountSteps("r")) == 26);

    std::vector<AttemptRow> attempts = Get(store->Attempts("r", 2));
    REQUIRE(attempts.size() == 3);
    CHECK(attempts[0].start == AttemptStart::kFirst);
    CHECK(attempts[0].first_step == 0);
    CHECK(attempts[0].last_step == 9);
    CHECK(attempts[1].attempt == 1);
    CHECK(attempts[1].start == AttemptStart::kRollback);
    CHECK(attempts[1].incident_id == 3);
    CHECK(attempts[1].from_step == 6);
    CHECK(attempts[1].started_ms == 500);
    CHECK(attempts[1].first_step == 0);
    CHECK(attempts[1].last_step == 7);
    CHECK(attempts[2].start == AttemptStart::kResume);
    CHECK(attempts[2].incarnation == "inc-b");
    CHECK(attempts[2].from_step == 7);
    CHECK(Get(store->Attempts("r", 1)).size() == 2);

    std::vector<std::string> incarnations = Get(store->Incarnations("r"));
    std::sort(incarnations.begin(), incarnations.end());
    CHECK(incarnations == std::vector<std::string>{"inc-a", "inc-b"});
  }

  SECTION("the outbox: one page per incident, receiver and kind; due pages; marks") {
    auto store = Open(db);
    WriteBatch b;
    OutboxRow page;
    page.incident_id = 1;
    page.channel = "ops";
    page.kind = "trigger:open";
    page.payload = R"({"text": "I-1"})";
    page.next_attempt_ms = 100;
    page.created_ms = 90;
    b.outbox.push_back(page);
    OutboxRow later = page;
    later.channel = "oncall";
    later.next_attempt_ms = 200;
    b.outbox.push_back(later);
    OutboxRow other = page;
    other.incident_id = 2;
    b.outbox.push_back(other);
    REQUIRE_OK(store->Write(b));
    b.clear();
    OutboxRow repeated = page;
    repeated.payload = "again";
    b.outbox.push_back(repeated);  // ignored
    REQUIRE_OK(store->Write(b));

    std::vector<OutboxRow> due = Get(store->DueOutbox(150, 10));
    REQUIRE(due.size() == 2);
    CHECK(due[0].incident_id == 1);
    CHECK(due[0].channel == "ops");
    CHECK(due[0].kind == "trigger:open");
    CHECK(due[0].payload == R"({"text": "I-1"})");
    CHECK(due[0].state == "pending");
    CHECK(due[0].attempts == 0);
    CHECK(due[0].next_attempt_ms == 100);
    CHECK(due[0].created_ms == 90);
    CHECK(due[0].sent_ms == 0);
    CHECK(due[1].incident_id == 2);
    CHECK(due[0].id < due[1].id);
    CHECK(Get(store->DueOutbox(150, 1)).size() == 1);
    CHECK(Get(store->DueOutbox(250, 10)).size() == 3);

    REQUIRE_OK(store->MarkOutbox(due[0].id, /*sent=*/true, 1, 0, "", 160));
    REQUIRE_OK(store->MarkOutbox(due[1].id, /*sent=*/false, 1, 400, "503 from receiver", 160));
    CHECK(Get(store->DueOutbox(250, 10)).size() == 1);  // "oncall" alone
    std::vector<OutboxRow> of1 = Get(store->Outbox(1));
    REQUIRE(of1.size() == 2);
    CHECK(of1[0].state == "sent");
    CHECK(of1[0].attempts == 1);
    CHECK(of1[0].sent_ms == 160);
    CHECK(of1[1].state == "pending");
    std::vector<OutboxRow> of2 = Get(store->Outbox(2));
    REQUIRE(of2.size() == 1);
    CHECK(of2[0].last_error == "503 from receiver");
    CHECK(of2[0].next_attempt_ms == 400);
  }

  SECTION("engine snapshots: the newest at or before a step; only the kept count stays") {
    StoreOptions options;
    options.engine_snapshots_kept = 2;
    auto store = Open(db, options);
    for (int64_t step : {100, 200, 300}) {
      WriteBatch b;
      b.engine_snapshots.push_back(
          {"r", 0, step, step / 100, 1, step + 5, Binary(static_cast<int>(step))});
      REQUIRE_OK(store->Write(b));
    }
    WriteBatch other;
    other.engine_snapshots.push_back({"r", 1, 50, 0, 0, 1, "attempt 1"});
    REQUIRE_OK(store->Write(other));
    std::optional<EngineSnapshotRow> s = Get(store->LatestEngineSnapshot("r", 0, 1000));
    REQUIRE(s.has_value());
    CHECK(s->run_id == "r");
    CHECK(s->attempt == 0);
    CHECK(s->step == 300);
    CHECK(s->skipped == 3);
    CHECK(s->overflows == 1);
    CHECK(s->written_ms == 305);
    CHECK(s->state == Binary(300));
    CHECK(Get(store->LatestEngineSnapshot("r", 0, 250))->step == 200);
    CHECK(!Get(store->LatestEngineSnapshot("r", 0, 150)).has_value());  // 100 pruned
    CHECK(Get(store->LatestEngineSnapshot("r", 1, 1000))->state == "attempt 1");
  }

  SECTION("a reopened store keeps everything and migrates nothing twice") {
    int version = 0;
    {
      auto store = Open(db);
      version = store->schema_version();
      WriteBatch b;
      RunRow run;
      run.run_id = "r";
      run.created_ms = 1;
      run.last_seen_ms = 2;
      b.runs.push_back(run);
      for (int64_t s = 0; s < 3; ++s) b.steps.push_back(In("r", 0, Step(s, 1.0)));
      b.rank_steps.push_back({"r", 0, 0, 2, Binary(2)});
      b.incidents.push_back(Incident(4, "r", 2, IncidentState::kOpen));
      b.decisions.push_back({6, 4, "r", "bob", "reject_rollback", "", "p", "k", 9});
      b.outbox.push_back({0, 4, "ops", "trigger:open", "body", "pending", 0, 5, "", 5, 0});
      b.engine_snapshots.push_back({"r", 0, 2, 0, 0, 3, "state"});
      b.incarnations.push_back({"r", "inc", 1});
      REQUIRE_OK(store->Write(b));
    }
    auto store = Open(db);
    CHECK(store->schema_version() == version);
    CHECK(Get(store->LoadRuns()).size() == 1);
    CHECK(Get(store->CountSteps("r")) == 3);
    CHECK(Get(store->RankStepsAt("r", 0, 2)).at(0).report == Binary(2));
    CHECK(Get(store->MaxIncidentId()) == 4);
    CHECK(Get(store->MaxDecisionId()) == 6);
    CHECK(Get(store->FindDecisionByKey("k"))->id == 6);
    CHECK(Get(store->Outbox(4)).size() == 1);
    CHECK(Get(store->LatestEngineSnapshot("r", 0, 10))->state == "state");
    CHECK(Get(store->Incarnations("r")) == std::vector<std::string>{"inc"});
  }
}

TEST_CASE("store: Open takes PostgreSQL URIs and libpq keywords and files for SQLite",
          "[server][store]") {
  CHECK(Store::IsPostgres("postgresql://trainwatch@db.internal/tw"));
  CHECK(Store::IsPostgres("postgres:///tw?host=/run/postgresql"));
  CHECK(Store::IsPostgres("host=db1,db2 dbname=tw target_session_attrs=read-write"));
  CHECK(Store::IsPostgres("dbname=tw"));
  CHECK(Store::IsPostgres("  host = /tmp port=5433"));
  CHECK_FALSE(Store::IsPostgres("trainwatch.db"));
  CHECK_FALSE(Store::IsPostgres("/var/lib/trainwatch/tw.db"));
  CHECK_FALSE(Store::IsPostgres("runs/a=b.db"));
  CHECK_FALSE(Store::IsPostgres("postgresql.db"));
  // SQLite's knobs are refused for PostgreSQL, before any connection.
  StoreOptions quota;
  quota.max_bytes = 1 << 20;
  CHECK(Store::Open("host=/nonexistent dbname=x", quota).status().code() ==
        absl::StatusCode::kInvalidArgument);
  StoreOptions normal;
  normal.synchronous = StoreOptions::Synchronous::kNormal;
  CHECK(Store::Open("postgresql:///x", normal).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // No server: unavailable, and the conninfo (a password, maybe) not echoed.
  absl::Status none = Store::Open("host=/nonexistent-dir password=hunter2 dbname=x").status();
  CHECK(none.code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(none.message()).find("hunter2") == std::string::npos);
}

}  // namespace
}  // namespace trainwatch::server
