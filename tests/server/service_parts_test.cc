// The gRPC edge's pieces, each constructed alone: the read queue, the
// incident summary (from hand-made rows), the exporter over a service state
// with a real store and ingestor but no gRPC server, and the ingestor alone
// on a fake clock.

#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "exporter/exporter.h"
#include "api/incident_summary.h"
#include "api/service_state.h"
#include "test_util.h"
#include "testing/fake_clock.h"
#include "testing/wait.h"
#include "trainwatch/core/json.h"
#include "api/work_queue.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using core::Signal;

TEST_CASE("work queue: runs posted work in order off the caller's thread - drains on destruction",
          "[server][service]") {
  std::vector<int> order;
  std::atomic<bool> other_thread{true};
  const auto caller = std::this_thread::get_id();
  {
    WorkQueue q;
    for (int i = 0; i < 100; ++i) {
      q.Post([&, i] {
        if (std::this_thread::get_id() == caller) other_thread = false;
        order.push_back(i);
      });
    }
  }
  REQUIRE(order.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(order[i] == i);
  CHECK(other_thread);
}

TEST_CASE("incident summary: curves - percentiles - shards and the approve command from rows",
          "[server][service]") {
  IncidentRow inc;
  inc.id = 7;
  inc.run_id = "run-a";
  inc.tier = 2;
  inc.state = IncidentState::kAwaitingDecision;
  inc.onset_step = 1500;
  inc.detection_step = 1520;
  inc.recommended_checkpoint_step = 1000;
  inc.shards = {40, 41, 42};
  core::RecommendedAction q;
  q.kind = core::RecommendedAction::Kind::kQuarantineShards;
  q.shard_first = 40;
  q.shard_last = 42;
  q.text = "quarantine shards 40..42";
  inc.actions = {q};
  std::vector<EventRow> events(1);
  events[0].event.step = 1520;
  events[0].event.tier = 2;
  events[0].event.kind = core::EventKind::kNonRecovering;
  events[0].event.reason = "no recovery";
  std::vector<StepRow> steps;
  for (int64_t s = 0; s <= 1520; ++s) {
    StepRow st;
    st.step = s;
    st.Set(Signal::kLoss, 2.0);
    st.Set(Signal::kGradNorm, static_cast<double>(s % 100));
    st.Set(Signal::kLogZ, 8.0);
    st.loss_ema_ratio = 1.0;
    if (s >= 1500) st.shards = {static_cast<uint64_t>(s)};
    steps.push_back(st);
  }
  v1::DiagnosticSummary sum;
  BuildSummary({inc, events, steps, {}, 8, 1'700'000'000'000}, &sum);
  CHECK(sum.explanation() == "step 1520: no recovery");
  CHECK(sum.fired_size() == 1);
  CHECK(sum.onset_step() == 1500);
  CHECK(sum.loss_around_onset_size() == 221);  // onset-200 .. detection
  REQUIRE(sum.grad_norm_percentiles_size() == 2);     // 0..999, 1000..1499
  CHECK(sum.grad_norm_percentiles(0).first_step() == 0);
  CHECK(sum.grad_norm_percentiles(0).last_step() == 999);
  CHECK(sum.grad_norm_percentiles(0).max() == 99.0);
  CHECK(sum.grad_norm_percentiles(0).p50() == 49.0);
  CHECK(sum.shards_onset_to_detection_size() == 21);
  CHECK(sum.suspect_shards().ranges(0).first() == 40);
  CHECK(sum.recommended_checkpoint().step() == 1000);
  REQUIRE(sum.recommended_actions_size() == 2);  // the quarantine, the skipped steps
  CHECK(sum.recommended_actions(0).kind() == v1::ACTION_KIND_QUARANTINE_SHARDS);
  CHECK(sum.recommended_actions(1).kind() == v1::ACTION_KIND_SKIP_STEPS);
  CHECK(sum.recommended_actions(1).steps().first() == 1492);
  CHECK(sum.approve_command() ==
        "twctl rollback approve I-7 --to-step 1000 --quarantine-shards 40..42 --comment \"...\"");
  CHECK(IncidentAttempt(inc, 3) == 3);
  inc.state = IncidentState::kRollingBack;
  CHECK(IncidentAttempt(inc, 3) == 2);
}

std::unique_ptr<Store> OpenStore(const testing::TempDir& dir) {
  auto store = Store::Open(dir.File("tw.db"));
  REQUIRE(store.ok());
  return *std::move(store);
}

// A store, an ingestor on a fake clock and the service state listening to
// it: everything but the gRPC server.
struct ServiceParts {
  explicit ServiceParts(const IngestOptions& options = {})
      : store(OpenStore(dir)),
        ingestor(store.get(), options, &clock),
        pager(store.get(), PagerConfig{}, &clock),
        state(&ingestor, store.get(), &pager, Authenticator(), &clock, "") {
    ingestor.SetListener(&state);
  }
  testing::TempDir dir;
  std::unique_ptr<Store> store;
  testing::FakeClock clock;
  Ingestor ingestor;
  Pager pager;
  ServiceState state;
};

TEST_CASE("exporter: a scrape reads the ingestor's live state - no gRPC server",
          "[server][service]") {
  ServiceParts parts;
  Ingestor& ingestor = parts.ingestor;
  ServiceState& state = parts.state;
  ingestor.Start();
  IngestItem item;
  item.stream_id = 1;
  v1::StepReport* r = item.message.mutable_step_report();
  r->set_run_id("run-x");
  r->set_step(5);
  r->mutable_metrics()->set_loss(3.25);
  ingestor.Submit(std::move(item));
  ingestor.Flush();
  const std::string text =
      prometheus::TextSerializer().Serialize(NewExporter(&state)->Collect());
  CHECK(text.find("trainwatch_loss{run=\"run-x\"} 3.25") != std::string::npos);
  CHECK(text.find("trainwatch_step{run=\"run-x\"} 5") != std::string::npos);
  CHECK(text.find("trainwatch_ingest_records_total 1") != std::string::npos);
  ingestor.Stop();
}

// A step report of run-g at `step`, global scope.
IngestItem GlobalStep(int64_t step) {
  IngestItem item;
  item.stream_id = 1;
  v1::StepReport* r = item.message.mutable_step_report();
  r->set_run_id("run-g");
  r->set_step(step);
  r->mutable_metrics()->set_loss(2.0);
  return item;
}

TEST_CASE("ingest: records arriving within the commit interval share one commit",
          "[server][service]") {
  // Records 20 ms apart: with no interval each is a commit of its own; with
  // one of a second, the first commits at once (no commit came before it)
  // and the rest wait for each other.
  for (const int64_t interval_ms : {int64_t{0}, int64_t{1000}}) {
    IngestOptions options;
    options.commit_interval_ms = interval_ms;
    ServiceParts parts(options);
    Ingestor& ingestor = parts.ingestor;
    ingestor.Start();
    for (int64_t step = 1; step <= 4; ++step) {
      ingestor.Submit(GlobalStep(step));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    REQUIRE(testing::WaitUntil([&] { return ingestor.Stats().records_total == 4; },
                               std::chrono::seconds(10)));
    INFO("commit interval " << interval_ms << " ms");
    CHECK(ingestor.Stats().batches_total == (interval_ms == 0 ? 4 : 2));
    ingestor.Stop();
  }
}

TEST_CASE("ingest: Flush and a full batch do not wait for the commit interval",
          "[server][service]") {
  IngestOptions options;
  options.commit_interval_ms = 1000;
  ServiceParts parts(options);
  Ingestor& ingestor = parts.ingestor;
  ingestor.Start();
  ingestor.Submit(GlobalStep(1));
  ingestor.Flush();  // the first batch: nothing to wait after
  auto started = std::chrono::steady_clock::now();
  ingestor.Submit(GlobalStep(2));
  ingestor.Flush();
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::milliseconds(500));
  CHECK(ingestor.Stats().batches_total == 2);
  // A batch's worth queued commits at once, without a Flush to ask for it.
  started = std::chrono::steady_clock::now();
  for (int64_t step = 3; step < 3 + static_cast<int64_t>(Ingestor::kCommitEarlyItems); ++step) {
    ingestor.Submit(GlobalStep(step));
  }
  const int64_t expected = 2 + static_cast<int64_t>(Ingestor::kCommitEarlyItems);
  REQUIRE(testing::WaitUntil([&] { return ingestor.Stats().records_total == expected; },
                             std::chrono::seconds(10)));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::milliseconds(500));
  ingestor.Stop();
}

TEST_CASE("service state: one batch's acks reach the delivery thread as one task - every key kept",
          "[server][service]") {
  ServiceParts parts;
  Ingestor& ingestor = parts.ingestor;
  ServiceState& state = parts.state;
  // Sessions without a reactor, marked done: a delivery leaves their acks
  // in place to be read here.
  std::vector<std::shared_ptr<Session>> sessions;
  for (int i = 0; i < 2; ++i) {
    auto s = std::make_shared<Session>();
    {
      absl::MutexLock lock(&s->mu);
      s->done = true;
    }
    REQUIRE(state.sessions().Register(s) == static_cast<uint64_t>(i + 1));
    sessions.push_back(std::move(s));
  }
  auto submit = [&](uint64_t stream, const std::string& run, int32_t rank, int64_t step) {
    IngestItem item;
    item.stream_id = stream;
    v1::StepReport* r = item.message.mutable_step_report();
    r->set_run_id(run);
    r->set_rank(rank);
    r->set_world_size(3);
    r->set_scope(v1::REPORT_SCOPE_RANK);
    r->set_step(step);
    r->mutable_metrics()->set_loss(1.0);
    ingestor.Submit(std::move(item));
  };
  // Queued before the writer starts: the writer takes them as one batch.
  // Stream 1 carries three ranks of run-a, stream 2 rank 0 of run-b.
  for (int64_t step = 1; step <= 4; ++step) {
    for (int32_t rank = 0; rank < 3; ++rank) submit(1, "run-a", rank, step);
    submit(2, "run-b", 0, step);
  }
  ingestor.Start();
  ingestor.Flush();
  CHECK(ingestor.Stats().batches_total == 1);
  CHECK(ingestor.Stats().records_total == 16);
  // One task for the batch, not one per stream or per (run, rank).
  CHECK(state.deliveries_posted() == 1);
  using Acks = std::map<std::pair<std::string, int32_t>, int64_t>;
  {
    absl::MutexLock lock(&sessions[0]->mu);
    CHECK(sessions[0]->acks == Acks{{{"run-a", 0}, 4}, {{"run-a", 1}, 4}, {{"run-a", 2}, 4}});
  }
  {
    absl::MutexLock lock(&sessions[1]->mu);
    CHECK(sessions[1]->acks == Acks{{{"run-b", 0}, 4}});
  }
  ingestor.Stop();
}

TEST_CASE("ingestor: a step missing a rank completes when the fake clock passes the timeout",
          "[server][service]") {
  testing::TempDir dir;
  auto store = Store::Open(dir.File("tw.db"));
  REQUIRE(store.ok());
  testing::FakeClock clock;
  IngestOptions options;
  options.aggregation_timeout_ms = 30'000;
  Ingestor ingestor(store->get(), options, &clock);
  ingestor.Start();
  for (int32_t rank : {0, 1}) {
    IngestItem item;
    item.stream_id = 1;
    item.received_ms = clock.NowMs();
    v1::StepReport* r = item.message.mutable_step_report();
    r->set_run_id("run-r");
    r->set_world_size(3);
    r->set_rank(rank);
    r->set_scope(v1::REPORT_SCOPE_RANK);
    r->set_step(0);
    r->mutable_metrics()->set_loss(2.0 + rank);
    ingestor.Submit(std::move(item));
  }
  ingestor.Flush();
  auto latest_step = [&]() -> int64_t {
    for (const RunView& s : ingestor.views().All()) {
      if (s.row.run_id == "run-r" && s.has_latest) return s.latest.step;
    }
    return -1;
  };
  // Rank 2 never reports: the step waits until the server's clock, not real
  // time, says the timeout is over.
  CHECK(latest_step() == -1);
  clock.AdvanceMs(30'000);
  REQUIRE(testing::WaitUntil([&] { return latest_step() == 0; }, std::chrono::seconds(10)));
  const std::vector<RunView> snap = ingestor.views().All();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].missing_rank_steps_total == 1);
  CHECK(snap[0].latest.missing_ranks == "2");
  CHECK(snap[0].latest.Get(core::Signal::kLoss) == Approx(2.5));
  ingestor.Stop();
}

}  // namespace
}  // namespace trainwatch::server
