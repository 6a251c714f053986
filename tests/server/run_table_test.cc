// Issue 13's bounds on what an agent can make the server hold or believe,
// on the ingestor with a real store and a fake clock (no gRPC server except
// where the operator API is the point): acknowledgements scoped to their
// run's command, runs evicted beyond the in-memory bound and rebuilt from the
// store, /metrics bounded, missing ranks as compact ranges, world_size taken
// per attempt, and far-future steps that cannot blind detection.

#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "admission/auth.h"
#include "exporter/exporter.h"
#include "ingest/ingest.h"
#include "pager/pager.h"
#include "server_fixture.h"
#include "api/service_state.h"
#include "store/store.h"
#include "test_util.h"
#include "ingest/run_views.h"
#include "testing/fake_clock.h"
#include "testing/wait.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using testing::Checkpoint;
using testing::Hello;
using testing::Step;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

v1::AgentMessage Ack(const std::string& run, int32_t rank, const std::string& command) {
  v1::AgentMessage m;
  auto* a = m.mutable_command_ack();
  a->set_run_id(run);
  a->set_rank(rank);
  a->set_command_id(command);
  a->set_status(v1::ACK_STATUS_APPLIED);
  return m;
}

// An ingestor on a store in a temporary folder; Restart() is a server
// restart (a new ingestor recovering from the same database).
class Harness {
 public:
  explicit Harness(IngestOptions options = {}) : options_(options) {
    auto s = Store::Open(dir_.File("tw.db"));
    REQUIRE(s.ok());
    store_ = *std::move(s);
    Restart();
  }
  ~Harness() { ingestor_->Stop(); }

  void Restart() {
    if (ingestor_) ingestor_->Stop();
    ingestor_ = std::make_unique<Ingestor>(store_.get(), options_, &clock_);
    REQUIRE(ingestor_->Recover().ok());
    ingestor_->Start();
  }
  void Send(v1::AgentMessage m) {
    IngestItem item;
    item.stream_id = 1;
    item.received_ms = clock_.NowMs();
    item.message = std::move(m);
    ingestor_->Submit(std::move(item));
  }
  // A healthy run of `steps` steps with a checkpoint at step 5, then a NaN
  // loss: a tier 3 incident awaiting a decision. Returns its id.
  int64_t FailingRun(const std::string& run, int32_t world, int64_t steps) {
    Send(Hello(run, 0, world));
    for (int64_t s = 0; s < steps; ++s) {
      Send(Step(run, 0, world, s, 2.5 + 0.01 * std::sin(double(s)), 1.0));
      if (s == 5) Send(Checkpoint(run, 5));
    }
    Send(Step(run, 0, world, steps, kNaN, 1.0));
    ingestor_->Flush();
    IncidentFilter f;
    f.run_id = run;
    auto incidents = store_->ListIncidents(f);
    REQUIRE(incidents.ok());
    for (const IncidentRow& i : *incidents) {
      if (i.tier >= 2) return i.id;
    }
    FAIL("no tier 2 or 3 incident on " << run);
    return 0;
  }
  ApprovalOutcome Approve(int64_t incident, int64_t to_step) {
    ApprovalRequest r;
    r.incident_id = incident;
    r.to_step = to_step;
    r.comment = "roll back";
    r.actor = "test";
    auto done = std::make_shared<std::promise<ApprovalOutcome>>();
    std::future<ApprovalOutcome> answer = done->get_future();
    ingestor_->SubmitApproval(r, [done](ApprovalOutcome o) { done->set_value(std::move(o)); });
    REQUIRE(answer.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
    return answer.get();
  }
  std::string CommandOf(const ApprovalOutcome& o) {
    v1::Decision d;
    REQUIRE(d.ParseFromString(o.decision));
    return d.command_id();
  }
  RunView Run(const std::string& run) {
    for (const RunView& s : ingestor_->views().All()) {
      if (s.row.run_id == run) return s;
    }
    FAIL("no run " << run);
    return {};
  }

  testing::TempDir dir_;
  IngestOptions options_;
  std::unique_ptr<Store> store_;
  testing::FakeClock clock_;
  std::unique_ptr<Ingestor> ingestor_;
};

TEST_CASE("run bounds: another run's agent cannot forge a rollback acknowledgement",
          "[server][bounds]") {
  Harness h;
  // Run b's agent acknowledges the next command ids before any command
  // exists: refused, not stored.
  h.Send(Hello("run-b", 0, 1));
  for (int i = 1; i <= 5; ++i) h.Send(Ack("run-b", 0, "C-" + std::to_string(i)));
  h.Send(Ack("run-nobody", 0, "C-1"));  // and an unknown run creates nothing
  h.ingestor_->Flush();
  CHECK(h.ingestor_->Stats().refused_acks_total == 6);
  CHECK(h.ingestor_->views().All().size() == 1);

  // Run a's approval creates one of those ids; run b's ack of it is refused
  // too.
  const int64_t incident = h.FailingRun("run-a", 1, 20);
  const ApprovalOutcome approved = h.Approve(incident, 5);
  REQUIRE(approved.status.ok());
  const std::string command = h.CommandOf(approved);
  REQUIRE(command.size() == 3);  // C-1 to C-5: one run b forged
  h.Send(Ack("run-b", 0, command));
  h.ingestor_->Flush();
  CHECK(h.ingestor_->Stats().refused_acks_total == 7);
  CHECK(h.Run("run-a").row.attempt == 0);
  auto stored = h.store_->CommandAcks("run-b", command);
  REQUIRE(stored.ok());
  CHECK(stored->empty());

  // After a restart run a's own rank completes its rollback.
  h.Restart();
  h.Send(Ack("run-a", 0, command));
  h.ingestor_->Flush();
  CHECK(h.Run("run-a").row.attempt == 1);
  CHECK(h.Run("run-a").row.last_step == 5);
}

TEST_CASE("run bounds: a rollback completes on the smaller world the restarted job reports",
          "[server][bounds]") {
  Harness h;
  const int64_t incident = h.FailingRun("run-w", 4, 20);
  // A hello claiming a huge world once: the attempt's world only grows.
  h.Send(Hello("run-w", 0, 65'536));
  const ApprovalOutcome approved = h.Approve(incident, 5);
  REQUIRE(approved.status.ok());
  // The job restarts on two ranks, which apply the command.
  h.Send(Hello("run-w", 0, 2));
  h.Send(Hello("run-w", 1, 2));
  h.Send(Ack("run-w", 0, h.CommandOf(approved)));
  h.Send(Ack("run-w", 1, h.CommandOf(approved)));
  h.ingestor_->Flush();
  const RunView s = h.Run("run-w");
  CHECK(s.row.attempt == 1);
  CHECK(s.row.world_size == 2);  // the new attempt's world
}

TEST_CASE("run bounds: 2000 run ids with 16 in memory - evicted runs rebuilt on demand",
          "[server][bounds]") {
  IngestOptions options;
  options.max_runs_in_memory = 16;
  Harness h(options);
  const int kRuns = 2000;
  for (int i = 0; i < kRuns; ++i) {
    const std::string run = "r" + std::to_string(i);
    for (int64_t s = 0; s < 3; ++s) {
      h.Send(Step(run, 0, 1, s, run == "r3" && s == 2 ? kNaN : 2.5, 1.0));
    }
    h.clock_.AdvanceMs(1);
  }
  h.ingestor_->Flush();
  IngestStats st = h.ingestor_->Stats();
  CHECK(st.runs_in_memory <= 16);
  CHECK(st.runs_evicted_total >= kRuns - 16);
  // Every run is still visible to the operator API, with its state.
  std::vector<RunView> snap = h.ingestor_->views().All();
  REQUIRE(snap.size() == kRuns);
  CHECK(h.Run("r7").row.last_step == 2);
  CHECK(h.Run("r7").latest.Get(core::Signal::kLoss) == Approx(2.5));

  // An evicted run streams again: rebuilt from the store, it goes on where
  // it was (a re-sent step is a duplicate, a NaN opens an incident).
  h.Send(Step("r7", 0, 1, 2, 2.5, 1.0));
  h.Send(Step("r7", 0, 1, 3, kNaN, 1.0));
  h.ingestor_->Flush();
  st = h.ingestor_->Stats();
  CHECK(st.runs_rebuilt_total == 1);
  CHECK(st.duplicates_total == 1);
  CHECK(h.Run("r7").row.last_step == 3);
  CHECK(h.Run("r7").incidents_total[3] == 1);

  // A restart rebuilds only the 16 most recently seen (in the background);
  // the others keep their snapshot from the store, and their incidents can
  // be decided.
  h.Restart();
  REQUIRE(testing::WaitUntil([&] { return h.ingestor_->Stats().runs_rebuilding == 0; },
                             std::chrono::seconds(30)));
  st = h.ingestor_->Stats();
  CHECK(st.runs_in_memory == 16);
  snap = h.ingestor_->views().All();
  REQUIRE(snap.size() == kRuns);
  CHECK(h.Run("r0").row.last_step == 2);
  CHECK(h.Run("r0").has_latest);
  CHECK(h.Run("r3").open_incidents[3] == 1);
  CHECK(h.Run("r3").incidents_total[3] == 1);
  IncidentFilter f;
  f.run_id = "r3";  // not among the 16 rebuilt
  auto incidents = h.store_->ListIncidents(f);
  REQUIRE(incidents.ok());
  REQUIRE(incidents->size() == 1);
  ApprovalRequest reject;
  reject.approve = false;
  reject.incident_id = (*incidents)[0].id;
  reject.comment = "test";
  auto done = std::make_shared<std::promise<ApprovalOutcome>>();
  auto answer = done->get_future();
  h.ingestor_->SubmitApproval(reject, [done](ApprovalOutcome o) { done->set_value(std::move(o)); });
  REQUIRE(answer.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  const ApprovalOutcome rejected = answer.get();
  CHECK(rejected.status.ok());
  CHECK(rejected.state == IncidentState::kDismissed);
  CHECK(h.ingestor_->Stats().runs_rebuilt_total == 1);
  CHECK(h.ingestor_->Stats().runs_in_memory <= 16);
  CHECK(h.Run("r3").open_incidents[3] == 0);
}

TEST_CASE("run bounds: the operator API reads an evicted run's status and incidents",
          "[server][bounds]") {
  testing::TempDir dir;
  ServerOptions options;
  options.ingest.max_runs_in_memory = 2;
  testing::Running tw = testing::StartServer(dir.File("tw.db"), core::SystemClock(), options);
  testing::TestAgent agent(tw.channel);
  for (int i = 0; i < 6; ++i) {
    const std::string run = "op" + std::to_string(i);
    agent.Send(Hello(run, 0, 1));
    agent.Send(Step(run, 0, 1, 0, 2.5, 1.0));
    agent.Send(Step(run, 0, 1, 1, i == 0 ? kNaN : 2.5, 1.0));
  }
  REQUIRE(agent.WaitDurable(0, 1));
  tw.server->ingestor()->Flush();
  CHECK(tw.server->ingestor()->Stats().runs_in_memory <= 2);
  auto stub = v1::OperatorService::NewStub(tw.channel);
  grpc::ClientContext c1;
  v1::GetRunStatusRequest req;
  req.set_run_id("op0");
  v1::GetRunStatusResponse status;
  REQUIRE(stub->GetRunStatus(&c1, req, &status).ok());
  CHECK(status.run().latest_step() == 1);
  CHECK(status.recent_size() == 2);
  CHECK(status.open_incidents_size() == 1);
  grpc::ClientContext c2;
  v1::ListRunsResponse runs;
  REQUIRE(stub->ListRuns(&c2, v1::ListRunsRequest(), &runs).ok());
  CHECK(runs.runs_size() == 6);
  CHECK(agent.Close().ok());
}

TEST_CASE("run bounds: /metrics drops stale runs and exports at most max_runs",
          "[server][bounds]") {
  testing::TempDir dir;
  auto store = Store::Open(dir.File("tw.db"));
  REQUIRE(store.ok());
  testing::FakeClock clock;
  Ingestor ingestor(store->get(), IngestOptions{}, &clock);
  Pager pager(store->get(), PagerConfig{}, &clock);
  ServiceState state(&ingestor, store->get(), &pager, Authenticator(), &clock, "");
  ingestor.Start();
  for (int i = 0; i < 30; ++i) {
    IngestItem item;
    item.received_ms = clock.NowMs();
    item.message = Step("m" + std::to_string(100 + i), 0, 1, 0, 2.5, 1.0);
    ingestor.Submit(std::move(item));
    ingestor.Flush();
    clock.AdvanceMs(1000);
  }
  ExporterOptions options;
  options.max_runs = 10;
  options.stale_run_ms = 60'000;
  auto scrape = [&] {
    return prometheus::TextSerializer().Serialize(
        NewExporter(&state, options)->Collect());
  };
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  std::string text = scrape();
  CHECK(count(text, "trainwatch_step{") == 10);
  CHECK(text.find("trainwatch_step{run=\"m129\"}") != std::string::npos);  // the most recent
  CHECK(text.find("trainwatch_step{run=\"m119\"}") == std::string::npos);
  CHECK(text.find("trainwatch_metrics_runs_omitted 20") != std::string::npos);
  // A run not seen for longer than stale_run_ms leaves /metrics.
  clock.AdvanceMs(51'000);
  text = scrape();
  CHECK(count(text, "trainwatch_step{") == 9);  // m121..m129 seen within the minute
  clock.AdvanceMs(60'000);
  text = scrape();
  CHECK(count(text, "trainwatch_step{") == 0);
  CHECK(text.find("trainwatch_metrics_runs_omitted 30") != std::string::npos);
  ingestor.Stop();
}

TEST_CASE("run bounds: a huge world's missing ranks are compact ranges with a cap",
          "[server][bounds]") {
  std::vector<bool> seen(10, false);
  seen[0] = true;
  CHECK(MissingRanksText(seen, 1'000'000, 256) == "1-999999");
  seen.assign({true, false, true, false, false, true});
  CHECK(MissingRanksText(seen, 8, 256) == "1,3-4,6-7");
  CHECK(MissingRanksText(seen, 6, 256) == "1,3-4");
  CHECK(MissingRanksText(seen, 6, 3).find(" and more: 3 missing") != std::string::npos);
  CHECK(MissingRanksText({}, 1, 256) == "0");
  // The worst pattern (every other rank) at world_size 65,536.
  std::vector<bool> every_other(65'536);
  for (size_t r = 0; r < every_other.size(); r += 2) every_other[r] = true;
  const std::string worst = MissingRanksText(every_other, 65'536, 256);
  CHECK(worst.size() <= 256 + 32);
  CHECK(worst.rfind(" and more: 32768 missing") == worst.size() - 24);

  // In the ingestor: a hello of a million ranks, rank 0's records, and the
  // timeout: one short line stored and logged per step.
  IngestOptions options;
  options.aggregation_timeout_ms = 1000;
  Harness h(options);
  h.Send(Hello("run-big", 0, 1'000'000));
  for (int64_t s = 0; s < 3; ++s) {
    h.Send(Step("run-big", 0, 1'000'000, s, 2.5, 1.0, 8.0, v1::REPORT_SCOPE_RANK));
  }
  h.ingestor_->Flush();
  h.clock_.AdvanceMs(1000);
  REQUIRE(testing::WaitUntil([&] { return h.Run("run-big").row.last_step == 2; },
                             std::chrono::seconds(10)));
  CHECK(h.Run("run-big").latest.missing_ranks == "1-999999");
  CHECK(h.Run("run-big").missing_rank_steps_total == 3);
}

TEST_CASE("run bounds: one step of INT64_MAX cannot blind detection - a real jump is taken",
          "[server][bounds]") {
  Harness h;
  for (int64_t s = 0; s < 50; ++s) h.Send(Step("run-f", 0, 1, s, 2.5, 1.0));
  h.Send(Step("run-f", 0, 1, std::numeric_limits<int64_t>::max(), 2.5, 1.0));
  for (int64_t s = 50; s < 60; ++s) h.Send(Step("run-f", 0, 1, s, 2.5, 1.0));
  h.Send(Step("run-f", 0, 1, 60, kNaN, 1.0));
  h.ingestor_->Flush();
  CHECK(h.ingestor_->Stats().far_steps_total == 1);
  CHECK(h.Run("run-f").row.last_step == 60);
  CHECK(h.Run("run-f").incidents_total[3] == 1);  // the NaN was seen
  // Stored, not evaluated.
  auto far = h.store_->StepsBetween("run-f", 0, std::numeric_limits<int64_t>::max(),
                                    std::numeric_limits<int64_t>::max());
  REQUIRE(far.ok());
  REQUIRE(far->size() == 1);
  CHECK((*far)[0].late);

  // A run that really jumps ahead (a resume far past its last step): the
  // first record is held back, the next one confirms the jump.
  h.Send(Step("run-f", 0, 1, 500'000, 2.5, 1.0));
  h.Send(Step("run-f", 0, 1, 500'001, 2.5, 1.0));
  h.Send(Step("run-f", 0, 1, 500'002, 2.5, 1.0));
  h.ingestor_->Flush();
  CHECK(h.ingestor_->Stats().far_steps_total == 2);
  CHECK(h.Run("run-f").row.last_step == 500'002);
}

TEST_CASE("run views: counters and views change together - readers get copies",
          "[server][run_views]") {
  RunViews views;
  RunView v;
  v.row.run_id = "a";
  v.skipped_total = 2;
  views.Set("a", v);
  views.Count(&IngestStats::duplicates_total, 3);
  views.Edit([](std::map<std::string, RunView>& all, IngestStats& stats) {
    all["b"].row.run_id = "b";
    stats.runs_in_memory = 2;
  });
  const std::vector<RunView> all = views.All();
  REQUIRE(all.size() == 2);
  CHECK(all[0].row.run_id == "a");  // by run id
  CHECK(all[0].skipped_total == 2);
  CHECK(views.Stats().duplicates_total == 3);
  CHECK(views.Stats().runs_in_memory == 2);
  CHECK(views.Get("b").has_value());
  views.Erase("b");
  CHECK_FALSE(views.Get("b").has_value());
}

}  // namespace
}  // namespace trainwatch::server
