// Issue 17, the server side of followed runs: a job watched from its log
// (`twctl follow`) streams through a real C++ Agent with observed = true, and
// trainwatchd records it as observed, not enforced. The mark survives a
// restart and shows in twctl; a tier 1 verdict is a skip recommended, not
// applied, and no skip taken in /metrics; a NaN's tier 3 page says no
// automatic action was possible and still recommends the rollback; an
// approval is recorded, sends no command, tells the operator to restart by
// hand from the checkpoint, and completes when the job resumes after it. A
// run streamed by its trainer's own agent beside it is unchanged.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"

#include "server_fixture.h"
#include "store/store.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/agent/reducer.h"
#include "trainwatch/cli/operator_commands.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server {
namespace {

using testing::Running;
using testing::StartServer;
using testing::TempDir;
using testing::WaitUntil;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double Loss(int64_t s) { return 2.5 + 0.01 * std::sin(static_cast<double>(s) * 1.7); }

// A C++ Agent of `run` on `server`; observed: the records of a followed job.
std::unique_ptr<agent::Agent> MakeAgent(const Running& server, const std::string& run,
                                        bool observed,
                                        std::optional<int64_t> resume_step = std::nullopt) {
  agent::AgentConfig cfg;
  cfg.server_address = server.address();
  cfg.run_id = run;
  cfg.observed = observed;
  cfg.resume_step = resume_step;
  cfg.reconnect_initial_ms = 20;
  cfg.reconnect_max_ms = 200;
  auto a = agent::Agent::Create(cfg, std::make_unique<agent::SingleProcessReducer>());
  INFO(a.status());
  REQUIRE(a.ok());
  return *std::move(a);
}

void TrainStep(agent::Agent& a, int64_t step, double loss, double grad_norm) {
  agent::StepInput in;
  in.step = step;
  in.loss = loss;
  in.grad_sum_squares = grad_norm * grad_norm;
  in.grad_elements = 1000;
  REQUIRE(a.Step(in).ok());
}

// The same step of a followed job, as its log reports it: a follower's agent
// judges nothing of the trainer's (no gradients to reduce) and streams the
// record as given.
void FollowStep(agent::Agent& a, int64_t step, double loss, double grad_norm) {
  core::StepRecord r;
  r.step = step;
  r.Set(core::Signal::kLoss, loss);
  r.Set(core::Signal::kGradNorm, grad_norm);
  r.Set(core::Signal::kNanFrac, 0.0);
  REQUIRE(a.StepObserved(r).ok());
}

// The run's view once its last evaluated step reaches `step`.
RunView WaitStep(const Running& server, const std::string& run, int64_t step) {
  RunView found;
  const bool reached = WaitUntil(
      [&] {
        for (const RunView& s : server.server->ingestor()->views().All()) {
          if (s.row.run_id == run && s.row.last_step >= step) {
            found = s;
            return true;
          }
        }
        return false;
      },
      std::chrono::seconds(30));
  INFO("run " << run << " step " << step);
  REQUIRE(reached);
  return found;
}

struct Out {
  int code = 0;
  std::string out, err;
};

Out Twctl(const Running& server, const std::string& command, std::vector<std::string> args) {
  args.insert(args.begin(), {"--server", server.address()});
  Out o;
  o.code = cli::OperatorCommand(command, args, nullptr, &o.out, &o.err);
  return o;
}

std::vector<IncidentRow> Incidents(const Running& server, const std::string& run) {
  IncidentFilter f;
  f.run_id = run;
  auto rows = server.server->store()->ListIncidents(f);
  REQUIRE(rows.ok());
  return *std::move(rows);
}

TEST_CASE("observed: a followed run is marked - across a restart - in twctl and /metrics",
          "[server][observed]") {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  {
    Running r = StartServer(db);
    auto followed = MakeAgent(r, "followed", /*observed=*/true);
    auto plain = MakeAgent(r, "plain", /*observed=*/false);
    for (int64_t s = 0; s < 20; ++s) {
      FollowStep(*followed, s, Loss(s), 1.0);
      TrainStep(*plain, s, Loss(s), 1.0);
    }
    CHECK(WaitStep(r, "followed", 19).row.observed);
    CHECK_FALSE(WaitStep(r, "plain", 19).row.observed);
    const std::string metrics = testing::HttpGet(r.server->metrics_port(), "/metrics");
    INFO(metrics);
    CHECK_THAT(metrics, Catch::Contains("trainwatch_run_observed{run=\"followed\"} 1"));
    CHECK_THAT(metrics, !Catch::Contains("trainwatch_run_observed{run=\"plain\"}"));
    followed->Close();
    plain->Close();
    r.server->Shutdown();
  }
  // A restart of trainwatchd: the mark comes back from the store.
  Running r = StartServer(db);
  const Out runs = Twctl(r, "runs", {});
  INFO(runs.out << runs.err);
  REQUIRE(runs.code == 0);
  bool followed_marked = false, plain_marked = true;
  for (absl::string_view line : absl::StrSplit(runs.out, '\n')) {
    if (absl::StartsWith(line, "followed ")) {
      followed_marked = absl::StrContains(line, "observed, not enforced");
    }
    if (absl::StartsWith(line, "plain ")) plain_marked = absl::StrContains(line, "observed");
  }
  CHECK(followed_marked);
  CHECK_FALSE(plain_marked);
  const Out status = Twctl(r, "status", {"followed"});
  REQUIRE(status.code == 0);
  CHECK_THAT(status.out, Catch::Contains("followed from its log (twctl follow): observed, not "
                                         "enforced"));
  CHECK_THAT(Twctl(r, "status", {"plain"}).out, !Catch::Contains("observed"));
  const std::string page = dir.File("report.html");
  REQUIRE(Twctl(r, "report", {"followed", "--out", page}).code == 0);
  CHECK_THAT(testing::ReadFile(page), Catch::Contains("observed, not enforced"));
}

TEST_CASE("observed: a tier 1 anomaly is a skip recommended not applied - no skip taken",
          "[server][observed]") {
  TempDir dir;
  Running r = StartServer(dir.File("tw.db"));
  auto followed = MakeAgent(r, "followed", /*observed=*/true);
  auto plain = MakeAgent(r, "plain", /*observed=*/false);
  for (int64_t s = 0; s < 1500; ++s) {
    const bool bad = s == 1400;  // past the warm-up: a tier 1 data anomaly
    FollowStep(*followed, s, bad ? 3.5 : Loss(s), bad ? 9.0 : 1.0);
    TrainStep(*plain, s, bad ? 3.5 : Loss(s), bad ? 9.0 : 1.0);
  }
  WaitStep(r, "followed", 1499);
  WaitStep(r, "plain", 1499);
  const std::string metrics = testing::HttpGet(r.server->metrics_port(), "/metrics");
  INFO(metrics);
  CHECK_THAT(metrics, Catch::Contains("trainwatch_skipped_steps_total{run=\"followed\"} 0"));
  CHECK_THAT(metrics, Catch::Contains("trainwatch_skips_recommended_total{run=\"followed\"} 1"));
  // The agent's own run is unchanged: a skip taken, none recommended.
  CHECK_THAT(metrics, Catch::Contains("trainwatch_skipped_steps_total{run=\"plain\"} 1"));
  CHECK_THAT(metrics, !Catch::Contains("trainwatch_skips_recommended_total{run=\"plain\"}"));
  auto decision_of = [&](const std::string& run) {
    const std::vector<IncidentRow> incidents = Incidents(r, run);
    REQUIRE(incidents.size() == 1);
    CHECK(incidents[0].tier == 1);
    CHECK(incidents[0].observed == (run == "followed"));
    auto decisions = r.server->store()->DecisionsOfIncident(incidents[0].id);
    REQUIRE(decisions.ok());
    // The engine's decision; a trainer's agent also puts its own skip on
    // record (agent_skip), a follower's decides nothing.
    std::vector<DecisionRow> engine;
    for (const DecisionRow& d : *decisions) {
      if (d.kind == "agent_skip") {
        CHECK(run == "plain");
      } else {
        engine.push_back(d);
      }
    }
    REQUIRE(engine.size() == 1);
    return engine[0];
  };
  const DecisionRow f = decision_of("followed");
  CHECK(f.kind == "skip_recommended");
  CHECK_THAT(f.comment, Catch::StartsWith("skip recommended, not applied (observed, not "
                                          "enforced)"));
  const DecisionRow p = decision_of("plain");
  CHECK(p.kind == "skip_update");
  CHECK_THAT(p.comment, !Catch::Contains("recommended"));
  followed->Close();
  plain->Close();
}

TEST_CASE("observed: a NaN pages as observed - the approval says restart by hand - a resume "
          "after the checkpoint completes it",
          "[server][observed][pager]") {
  TempDir dir;
  testing::HttpReceiver rx;
  const std::string pager = dir.File("pager.json");
  std::ofstream(pager) << "{\"receivers\": [{\"name\": \"am\", \"type\": \"alertmanager\", "
                          "\"url\": \"http://127.0.0.1:"
                       << rx.port() << "/am\"}]}";
  ServerOptions o;
  o.pager_config_file = pager;
  Running r = StartServer(dir.File("tw.db"), core::SystemClock(), o);
  auto followed = MakeAgent(r, "followed", /*observed=*/true);
  for (int64_t s = 0; s < 1200; ++s) {
    FollowStep(*followed, s, Loss(s), 1.0);
    if (s == 1000) followed->ReportCheckpoint(1000, "ckpt://followed/1000");
  }
  // The checkpoint is known before the failure, so the page recommends it.
  REQUIRE(WaitUntil(
      [&] {
        auto cks = r.server->store()->Checkpoints("followed");
        return cks.ok() && !cks->empty();
      },
      std::chrono::seconds(30)));
  FollowStep(*followed, 1200, kNaN, 1.0);  // tier 3: a nonfinite loss
  const RunView snap = WaitStep(r, "followed", 1200);
  CHECK(snap.open_incidents[3] == 1);
  // The trainer was not halted: the run is not shown as halted.
  {
    const Out runs = Twctl(r, "runs", {"--output", "json"});
    REQUIRE(runs.code == 0);
    CHECK_THAT(runs.out, !Catch::Contains("HALTED"));
  }
  std::string id;
  for (const IncidentRow& i : Incidents(r, "followed")) {
    if (i.tier == 3) id = i.public_id();
  }
  REQUIRE_FALSE(id.empty());
  // The page: marked observed, no automatic action, the same rollback.
  REQUIRE(rx.WaitFor(1));
  const std::vector<testing::HttpReceiver::Request> pages = rx.requests();
  absl::StatusOr<core::JsonValue> am = core::ParseJson(pages[0].body, "page");
  REQUIRE(am.ok());
  const core::JsonValue* annotations = am->array.at(0).Find("annotations");
  REQUIRE(annotations != nullptr);
  CHECK_THAT(annotations->Find("summary")->string,
             Catch::Contains(id) && Catch::Contains("(observed, not enforced)"));
  CHECK_THAT(annotations->Find("observed")->string,
             Catch::Contains("followed from its log") &&
                 Catch::Contains("No automatic action was possible"));
  CHECK_THAT(annotations->Find("description")->string,
             Catch::Contains("roll back to checkpoint step 1000") &&
                 Catch::Contains("No automatic action was possible"));
  CHECK_THAT(annotations->Find("approve_command")->string,
             Catch::StartsWith("twctl rollback approve " + id + " --to-step 1000"));
  // The incident view says so too.
  const Out show = Twctl(r, "incident show", {id});
  REQUIRE(show.code == 0);
  CHECK_THAT(show.out, Catch::Contains("(observed, not enforced)") &&
                           Catch::Contains("No automatic action was possible"));

  // The approval: recorded, no command sent, the operator told what to do.
  const Out approve =
      Twctl(r, "rollback approve", {id, "--yes", "--comment", "restart it from 1000"});
  INFO(approve.out << approve.err);
  REQUIRE(approve.code == 0);
  CHECK_THAT(approve.out,
             Catch::Contains("Restart the trainer by hand from checkpoint "
                             "ckpt://followed/1000 (step 1000)") &&
                 Catch::Contains("no command was sent"));
  const Out json = Twctl(r, "incident show", {id, "--output", "json"});
  CHECK_THAT(json.out, Catch::Contains("\"manual_restart\":true"));
  auto rows = Incidents(r, "followed");
  int64_t incident = 0;
  for (const IncidentRow& i : rows) {
    if (i.public_id() == id) {
      incident = i.id;
      CHECK(i.state == IncidentState::kRollingBack);
    }
  }
  auto cmd = r.server->store()->LatestCommand(incident);
  REQUIRE(cmd.ok());
  REQUIRE(cmd->has_value());
  CHECK((*cmd)->kind == "manual_restart");
  followed->Close();

  // The job restarted by hand from the checkpoint: a new launch resuming
  // after step 1000 completes the rollback and begins attempt 1 from it.
  auto restarted = MakeAgent(r, "followed", /*observed=*/true, /*resume_step=*/1000);
  for (int64_t s = 1001; s <= 1010; ++s) FollowStep(*restarted, s, Loss(s), 1.0);
  CHECK(WaitUntil(
      [&] {
        for (const RunView& s : r.server->ingestor()->views().All()) {
          if (s.row.run_id == "followed") return s.row.attempt == 1 && s.row.last_step == 1010;
        }
        return false;
      },
      std::chrono::seconds(30)));
  auto attempts = r.server->store()->Attempts("followed", 1);
  REQUIRE(attempts.ok());
  REQUIRE(attempts->size() == 2);
  CHECK((*attempts)[1].start == AttemptStart::kRollback);
  CHECK((*attempts)[1].from_step == 1000);
  restarted->Close();
}

}  // namespace
}  // namespace trainwatch::server
