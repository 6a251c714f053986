// twctl's commands one at a time, without a server: each parses its own
// flags and writes its own help, the registry dispatches and writes the
// usage from the one list, and commands run against a fake OperatorClient.

#include "trainwatch/cli/operator_commands.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "command_output.h"
#include "commands.h"
#include "operator_client.h"
#include "registry.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/json.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace trainwatch::cli {
namespace {

// Answers every call with `status` and the canned response; records requests.
class FakeClient : public OperatorClient {
 public:
  grpc::Status status;
  v1::ListRunsResponse runs;
  v1::GetRunStatusResponse run_status;
  v1::ApproveRollbackResponse approve;
  v1::ListQuarantinedShardsResponse quarantined;
  v1::RejectRollbackResponse reject;
  std::vector<v1::IncidentEvent> events;
  v1::GetIncidentResponse incident;
  grpc::Status watch_end = grpc::Status(grpc::DEADLINE_EXCEEDED, "deadline");

  int calls = 0;
  std::vector<v1::GetRunStatusRequest> status_requests;
  std::vector<v1::ApproveRollbackRequest> approvals;
  std::vector<v1::RejectRollbackRequest> rejections;
  v1::WatchIncidentsRequest watch_request;
  int64_t watch_timeout = -1;
  size_t events_taken = 0;

  grpc::Status ListRuns(const v1::ListRunsRequest&, v1::ListRunsResponse* resp) override {
    ++calls;
    *resp = runs;
    return status;
  }
  grpc::Status GetRunStatus(const v1::GetRunStatusRequest& req,
                            v1::GetRunStatusResponse* resp) override {
    ++calls;
    status_requests.push_back(req);
    *resp = run_status;
    return status;
  }
  grpc::Status ListIncidents(const v1::ListIncidentsRequest&, v1::ListIncidentsResponse*) override {
    ++calls;
    return status;
  }
  grpc::Status GetIncident(const v1::GetIncidentRequest&, v1::GetIncidentResponse* resp) override {
    ++calls;
    *resp = incident;
    return status;
  }
  grpc::Status ApproveRollback(const v1::ApproveRollbackRequest& req,
                               v1::ApproveRollbackResponse* resp) override {
    ++calls;
    approvals.push_back(req);
    *resp = approve;
    return status;
  }
  grpc::Status RejectRollback(const v1::RejectRollbackRequest& req,
                              v1::RejectRollbackResponse* resp) override {
    ++calls;
    rejections.push_back(req);
    *resp = reject;
    return status;
  }
  grpc::Status ListQuarantinedShards(const v1::ListQuarantinedShardsRequest&,
                                     v1::ListQuarantinedShardsResponse* resp) override {
    ++calls;
    *resp = quarantined;
    return status;
  }
  grpc::Status WatchIncidents(
      const v1::WatchIncidentsRequest& req, int64_t timeout_s,
      const std::function<bool(const v1::IncidentEvent&)>& on_event) override {
    ++calls;
    watch_request = req;
    watch_timeout = timeout_s;
    for (const auto& e : events) {
      ++events_taken;
      if (!on_event(e)) return grpc::Status(grpc::CANCELLED, "cancelled");
    }
    return watch_end;
  }
};

struct Result {
  int code = -1;
  std::string out, err;
};

// Parses `argv` with `c`'s flags and runs it against `fake`.
Result RunAlone(const Command& c, const std::vector<std::string>& argv, FakeClient* fake,
                bool answer = true, std::vector<std::string>* lines = nullptr) {
  Result r;
  absl::StatusOr<Args> args = c.Parse(argv);
  REQUIRE(args.ok());
  Context ctx;
  ctx.client = fake;
  ctx.out = &r.out;
  ctx.err = &r.err;
  ctx.prompt = [answer](const std::string&) { return answer; };
  if (lines != nullptr) ctx.emit = [lines](const std::string& l) { lines->push_back(l); };
  r.code = c.Run(*args, ctx);
  return r;
}

// The message of a usage error; fails the test when `argv` parses.
std::string ParseError(const Command& c, const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = c.Parse(argv);
  REQUIRE_FALSE(args.ok());
  CHECK(args.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(args.status().message());
}

std::vector<std::unique_ptr<Command>> EveryCommand() {
  std::vector<std::unique_ptr<Command>> all;
  all.push_back(MakeRunsCommand());
  all.push_back(MakeStatusCommand());
  all.push_back(MakeShardsCommand());
  all.push_back(MakeReportCommand());
  all.push_back(MakeIncidentsCommand());
  all.push_back(MakeIncidentShowCommand());
  all.push_back(MakeWatchCommand());
  all.push_back(MakeRollbackApproveCommand());
  all.push_back(MakeRollbackRejectCommand());
  all.push_back(MakeVersionCommand());
  return all;
}

TEST_CASE("commands: each parses its own flags and the connection options", "[cli][commands]") {
  auto status = MakeStatusCommand();
  absl::StatusOr<Args> a =
      status->Parse({"r1", "--points", "5", "--server=h:1", "-o", "json", "--token", "t"});
  REQUIRE(a.ok());
  CHECK(a->operands == std::vector<std::string>{"r1"});
  CHECK(a->Get("points") == "5");
  CHECK(a->server == "h:1");
  CHECK(a->token == "t");
  CHECK(a->output == "json");
  CHECK_FALSE(a->help);

  auto incidents = MakeIncidentsCommand();
  a = incidents->Parse({"--open", "--run=r2"});
  REQUIRE(a.ok());
  CHECK(a->Has("open"));
  CHECK(a->Get("run") == "r2");
  CHECK(a->Get("missing", "fallback") == "fallback");
  CHECK(a->output == "table");

  auto approve = MakeRollbackApproveCommand();
  a = approve->Parse({"approve", "I-1", "--yes", "--comment", "why"}, /*skip_operands=*/1);
  REQUIRE(a.ok());
  CHECK(a->operands == std::vector<std::string>{"I-1"});
  CHECK(a->Has("yes"));
  CHECK(a->Get("yes").empty());
  CHECK(a->Get("comment") == "why");

  // --help stops the parse: whatever follows is not looked at.
  a = status->Parse({"--help", "--bogus"});
  REQUIRE(a.ok());
  CHECK(a->help);
}

TEST_CASE("commands: unknown flags and missing values are usage errors", "[cli][commands]") {
  auto status = MakeStatusCommand();
  // Another command's flag is unknown here; the message shows this command's help.
  const std::string unknown = ParseError(*status, {"r1", "--open"});
  CHECK(unknown.rfind("twctl: unknown flag --open\nusage: twctl status RUN [--points N]\n", 0) ==
        0);
  CHECK(ParseError(*status, {"r1", "--points"}) == "twctl: --points needs a value\n");
  CHECK(ParseError(*status, {"r1", "--server"}) == "twctl: --server needs a value\n");
  CHECK(ParseError(*status, {"r1", "-o", "yaml"}) == "twctl: -o must be table or json\n");
  auto runs = MakeRunsCommand();
  CHECK(ParseError(*runs, {"--bogus=1"}).rfind("twctl: unknown flag --bogus\n", 0) == 0);
  auto reject = MakeRollbackRejectCommand();
  CHECK(ParseError(*reject, {"I-1", "--yes"}).rfind("twctl: unknown flag --yes\n", 0) == 0);
}

TEST_CASE("commands: every command's help shows its usage and each of its flags",
          "[cli][commands]") {
  for (const auto& c : EveryCommand()) {
    INFO(c->name());
    const std::string help = c->Help();
    CHECK(help.rfind("usage: twctl " + c->name(), 0) == 0);
    CHECK(help.find(c->spec().summary) != std::string::npos);
    for (const Flag& f : c->spec().flags) {
      CHECK(help.find("--" + f.name) != std::string::npos);
      CHECK(help.find(f.help) != std::string::npos);
      CHECK(c->Usage().find("--" + f.name) != std::string::npos);
    }
    CHECK((help.find("--server ADDR") != std::string::npos) == c->spec().connects);
    // No usage line runs past a terminal's width.
    for (size_t start = 0, end; start < help.size(); start = end + 1) {
      end = help.find('\n', start);
      CHECK(end - start <= 80);
    }
  }
  CHECK(MakeRollbackRejectCommand()->Usage() == "usage: twctl rollback reject ID --comment TEXT\n");
  CHECK(MakeReportCommand()->Misuse() == "usage: twctl report RUN [--out FILE]\n");
  CHECK(MakeShardsCommand()->Misuse() == "twctl shards: RUN is required\n");
  // replay's help is replay's own.
  CHECK(MakeReplayCommand()->Help().rfind("usage: twctl replay FILE|DIR", 0) == 0);
}

TEST_CASE("registry: one list gives the usage and help CMD and CMD --help", "[cli][commands]") {
  const CommandRegistry registry;
  const std::string usage = registry.Usage();
  for (const auto& c : EveryCommand()) {
    INFO(c->name());
    CHECK(usage.find("\n  " + c->name()) != std::string::npos);
    std::string out, err;
    CHECK(registry.Help({c->name()}, &out, &err) == kOk);
    CHECK(out == c->Help());
    // The same text from `CMD --help`, through the dispatch, with no server.
    const size_t space = c->name().find(' ');
    std::vector<std::string> args;
    if (space != std::string::npos) args.push_back(c->name().substr(space + 1));
    args.push_back("--help");
    std::string hout, herr;
    Context ctx;
    ctx.out = &hout;
    ctx.err = &herr;
    int dialled = 0;
    CHECK(registry.Dispatch(c->name().substr(0, space), args, ctx, [&](const Connection&) {
      ++dialled;
      return std::make_unique<FakeClient>();
    }) == kOk);
    CHECK(hout == c->Help());
    CHECK(dialled == 0);
  }
  CHECK(usage.find("\n  replay FILE|DIR") != std::string::npos);
  CHECK(usage.find("\n  help [COMMAND]") != std::string::npos);
  std::string out, err;
  // A group's help is its subcommands'.
  CHECK(registry.Help({"rollback"}, &out, &err) == kOk);
  CHECK(out.find("usage: twctl rollback approve ID") != std::string::npos);
  CHECK(out.find("usage: twctl rollback reject ID") != std::string::npos);
  CHECK(registry.Help({"rollback", "reject"}, &out, &err) == kOk);
  CHECK(out == MakeRollbackRejectCommand()->Help());
  CHECK(registry.Help({"frobnicate"}, &out, &err) == kUsage);
  CHECK(err == "twctl: unknown command 'frobnicate'\n" + usage);
  CHECK(registry.Help({}, &out, &err) == kOk);
  CHECK(out == usage);
  CHECK(TwctlUsage() == usage);
}

TEST_CASE("registry: options before the command and flags before a subcommand", "[cli][commands]") {
  const CommandRegistry registry;
  std::string command, split_err;
  std::vector<std::string> args;
  REQUIRE(SplitCommandLine(
      {"--server", "h:9", "--token=t", "rollback", "--comment", "benign", "reject", "I-4"},
      &command, &args, &split_err));
  FakeClient* fake = nullptr;
  Connection dialled;
  auto dial = [&](const Connection& c) {
    dialled = c;
    auto f = std::make_unique<FakeClient>();
    f->reject.mutable_decision()->set_decision_id("D-2");
    fake = f.get();
    return f;
  };
  std::string out, err;
  Context ctx;
  ctx.out = &out;
  ctx.err = &err;
  // The fake is gone when Dispatch returns: check what it printed.
  CHECK(registry.Dispatch(command, args, ctx, dial) == kOk);
  CHECK(fake != nullptr);
  CHECK(dialled.server == "h:9");
  CHECK(dialled.token == "t");
  CHECK(out == "I-4 rejected (D-2): benign\n");

  // Usage errors of a group and of the dispatch, before any call.
  auto dispatch = [&](const std::string& cmd, const std::vector<std::string>& a) {
    out.clear();
    err.clear();
    fake = nullptr;
    return registry.Dispatch(cmd, a, ctx, dial);
  };
  CHECK(dispatch("rollback", {"--server", "h:1"}) == kUsage);
  CHECK(err == "usage: twctl rollback approve|reject ID ...\n");
  CHECK(fake == nullptr);  // a group without its subcommand connects to nothing
  CHECK(dispatch("rollback", {"undo", "I-1"}) == kUsage);
  CHECK(err == "usage: twctl rollback approve|reject ID ...\n");
  CHECK(dispatch("rollback", {"approve"}) == kUsage);
  CHECK(err == "usage: twctl rollback approve|reject ID ...\n");
  CHECK(dispatch("incident", {"list"}) == kUsage);
  CHECK(err == "usage: twctl incident show ID\n");
  CHECK(dispatch("rollback", {"reject", "I-1", "--to-step", "5"}) == kUsage);
  CHECK(err.rfind("twctl: unknown flag --to-step\n", 0) == 0);
  CHECK(dispatch("frobnicate", {}) == kUsage);
  CHECK(err.rfind("twctl: unknown command 'frobnicate'\nusage: twctl ", 0) == 0);
  // Commands that need no server, with the connection options they may be given.
  CHECK(dispatch("version", {"--server", "h:1"}) == kOk);
  CHECK(out.rfind("twctl ", 0) == 0);
  CHECK(dispatch("--version", {}) == kOk);
  CHECK(dispatch("--help", {}) == kOk);
  CHECK(out == registry.Usage());
  CHECK(dispatch("help", {"status"}) == kOk);
  CHECK(out == MakeStatusCommand()->Help());
  CHECK(fake == nullptr);
}

TEST_CASE("runs and status against a fake: table and json and exit codes", "[cli][commands]") {
  auto runs = MakeRunsCommand();
  FakeClient fake;
  auto* r = fake.runs.add_runs();
  r->set_run_id("run-a");
  r->set_state(v1::RUN_STATE_HALTED);
  r->set_world_size(8);
  r->set_latest_step(1200);
  Result table = RunAlone(*runs, {}, &fake);
  CHECK(table.code == kOk);
  CHECK(table.out ==
        "RUN                      STATE      WORLD       STEP  RANKS   OPEN\n"
        "run-a                    halted         8       1200      0      0\n");
  Result json = RunAlone(*runs, {"-o", "json"}, &fake);
  CHECK(json.code == kOk);
  CHECK(json.out.find("\"run_id\":\"run-a\"") != std::string::npos);
  CHECK(json.out.find("\"state\":\"RUN_STATE_HALTED\"") != std::string::npos);

  auto status = MakeStatusCommand();
  fake.run_status.mutable_run()->set_run_id("run-a");
  fake.run_status.mutable_run()->set_latest_step(1200);
  fake.run_status.mutable_latest()->mutable_metrics()->set_loss(2.5);
  for (int s = 0; s < 8; ++s) fake.run_status.add_recent()->mutable_metrics()->set_loss(s);
  Result st = RunAlone(*status, {"run-a", "--points", "50"}, &fake);
  CHECK(st.code == kOk);
  REQUIRE(fake.status_requests.size() == 1);
  CHECK(fake.status_requests[0].run_id() == "run-a");
  CHECK(fake.status_requests[0].window_steps() == 50);
  CHECK(st.out.rfind("run run-a: step 1200, 0 of 0 ranks connected, 0 open incidents\n", 0) == 0);
  CHECK(st.out.find("  loss                   2.5  ▁▂▃▄▅▆▇█\n") != std::string::npos);
  CHECK(st.out.find("  grad_norm                -") != std::string::npos);
  // The rules the run is judged by: the source, and only what differs from
  // the defaults.
  CHECK(st.out.find("  rules: unknown; 0 agent decision(s)") != std::string::npos);
  core::RuleConfig lowered;
  lowered.warmup_steps = 50;
  fake.run_status.mutable_run()->set_rules_json(core::RuleConfigToJson(lowered));
  fake.run_status.mutable_run()->set_rules_source("agent");
  fake.run_status.mutable_run()->set_agent_decisions(2);
  fake.run_status.mutable_run()->set_decision_divergences(1);
  Result ruled = RunAlone(*status, {"run-a"}, &fake);
  CHECK(ruled.out.find("  rules: agent (warmup_steps=50; the rest the defaults); 2 agent "
                       "decision(s), 1 divergence(s) from the server's engine\n") !=
        std::string::npos);

  // The warm-up, while it lasts and after.
  CHECK(ruled.out.find("warm-up") == std::string::npos);  // not known: not said
  v1::RunWarmUp* w = fake.run_status.mutable_run()->mutable_warm_up();
  w->set_active(true);
  w->set_until_step(50);
  w->set_loss_records(12);
  w->set_grad_samples(11);
  w->set_needs_grad(true);
  CHECK(RunAlone(*status, {"run-a"}, &fake).out.find(
            "  warm-up: until step 50 and 12 of 20 loss records, 11 of 20 grad-norm samples so "
            "far: no update is skipped and the baseline rules do not page until then; a bad "
            "batch is recorded, a loss 2x its lowest value for 3 records pages, a NaN halts\n") !=
        std::string::npos);
  w->set_loss_records(30);
  w->set_grad_samples(30);
  CHECK(RunAlone(*status, {"run-a"}, &fake).out.find(
            "  warm-up: until step 50: no update is skipped") != std::string::npos);
  w->set_active(false);
  CHECK(RunAlone(*status, {"run-a"}, &fake).out.find("  warm-up: over; every rule decides\n") !=
        std::string::npos);
  fake.run_status.mutable_run()->clear_warm_up();

  // A run rebuilt after a restart says so in both.
  CHECK(ruled.out.find("rebuilding") == std::string::npos);
  r->set_rebuilding(true);
  fake.run_status.mutable_run()->set_rebuilding(true);
  CHECK(RunAlone(*runs, {}, &fake).out.find(
            "run-a                    halted         8       1200      0      0  rebuilding\n") !=
        std::string::npos);
  CHECK(RunAlone(*status, {"run-a"}, &fake).out.find("  rebuilding: trainwatchd restarted") !=
        std::string::npos);

  const int before = fake.calls;
  Result no_run = RunAlone(*status, {}, &fake);
  CHECK(no_run.code == kUsage);
  CHECK(no_run.err == "twctl status: RUN is required\n");
  Result bad_points = RunAlone(*status, {"run-a", "--points", "many"}, &fake);
  CHECK(bad_points.code == kUsage);
  CHECK(bad_points.err ==
        "twctl status: --points must be a whole number from 1 to 100000, not \"many\"\n");
  CHECK(fake.calls == before);  // usage errors call nothing

  fake.status = grpc::Status(grpc::NOT_FOUND, "no run run-b");
  Result missing = RunAlone(*status, {"run-b"}, &fake);
  CHECK(missing.code == kError);
  CHECK(missing.err == "twctl: no run run-b (not found)\n");
  CHECK(missing.out.empty());
  fake.status = grpc::Status(grpc::FAILED_PRECONDITION, "halted");
  CHECK(RunAlone(*status, {"run-b"}, &fake).code == kRefused);
  fake.status = grpc::Status(grpc::INVALID_ARGUMENT, "bad window");
  CHECK(RunAlone(*status, {"run-b"}, &fake).code == kUsage);
}

TEST_CASE("runs and status from a standby replica say so - and what it cannot know",
          "[cli][commands]") {
  FakeClient fake;
  v1::RunInfo* r = fake.runs.add_runs();
  r->set_run_id("run-a");
  r->set_world_size(8);
  r->set_latest_step(1200);
  fake.run_status.mutable_run()->CopyFrom(*r);
  v1::StandbyAnswer standby;
  standby.set_replica("tw-b");
  standby.set_owner("tw-a");
  // 3 s ago to the nanosecond: whole seconds made it up to 3.99 s, which a
  // loaded machine's delay turned into "4.0 s ago".
  const int64_t as_of_ns = absl::ToUnixNanos(absl::Now() - absl::Seconds(3));
  standby.mutable_as_of()->set_seconds(as_of_ns / 1000000000);
  standby.mutable_as_of()->set_nanos(static_cast<int32_t>(as_of_ns % 1000000000));
  *fake.runs.mutable_standby() = standby;
  *fake.run_status.mutable_standby() = standby;
  const std::string note = "answered by standby replica tw-b from the store as of 3.";
  Result runs = RunAlone(*MakeRunsCommand(), {}, &fake);
  CHECK(runs.code == kOk);
  CHECK(runs.out.find(note) != std::string::npos);
  CHECK(runs.out.find("agent connections are known to the owner, replica tw-a\n") !=
        std::string::npos);
  // No "0 of 8 ranks connected": a standby does not know.
  Result st = RunAlone(*MakeStatusCommand(), {"run-a"}, &fake);
  CHECK(st.out.rfind("run run-a: step 1200, 8 ranks, 0 open incidents\n  " + note, 0) == 0);
  CHECK(st.out.find("ranks connected") == std::string::npos);
  // Its first read of the store under way, and no owner between a death
  // and a takeover.
  fake.run_status.mutable_standby()->clear_as_of();
  fake.run_status.mutable_standby()->clear_owner();
  st = RunAlone(*MakeStatusCommand(), {"run-a"}, &fake);
  CHECK(st.out.find("while it first reads the store (runs may be missing)") != std::string::npos);
  CHECK(st.out.find("none at the moment: a takeover is due") != std::string::npos);
  // The owner's answers carry no StandbyAnswer and say nothing of it.
  fake.runs.clear_standby();
  fake.run_status.clear_standby();
  CHECK(RunAlone(*MakeRunsCommand(), {}, &fake).out.find("standby") == std::string::npos);
  CHECK(RunAlone(*MakeStatusCommand(), {"run-a"}, &fake).out.find("0 of 8 ranks connected") !=
        std::string::npos);
}

TEST_CASE("incident show counts suspect shards as they are - not their bounding range",
          "[cli][commands][shards]") {
  auto show = MakeIncidentShowCommand();
  FakeClient fake;
  fake.incident.mutable_incident()->set_incident_id("I-1");
  v1::ShardSet* shards =
      fake.incident.mutable_incident()->mutable_summary()->mutable_suspect_shards();
  for (uint64_t id : {30, 7, 19, 20, 21, 7}) shards->add_shard_ids(id);
  Result r = RunAlone(*show, {"I-1"}, &fake);
  CHECK(r.code == kOk);
  CHECK(r.out.find("warm-up") == std::string::npos);  // the run's warm-up is not known
  // Detected inside the run's warm-up: said, as twctl status says it.
  fake.incident.mutable_incident()->mutable_summary()->set_detection_step(250);
  fake.run_status.mutable_run()->mutable_warm_up()->set_until_step(1000);
  CHECK(RunAlone(*show, {"I-1"}, &fake).out.find(
            "detected at step 250\ndetected in the run's warm-up (until step 1000): no update was "
            "skipped and the baseline rules did not page;") != std::string::npos);
  fake.incident.mutable_incident()->mutable_summary()->set_detection_step(1200);
  CHECK(RunAlone(*show, {"I-1"}, &fake).out.find("warm-up") == std::string::npos);
  CHECK(r.out.find("shards onset..detection: 7, 19..21, 30 (5 shards)\n") != std::string::npos);
  shards->clear_shard_ids();
  shards->add_shard_ids(42);
  CHECK(RunAlone(*show, {"I-1"}, &fake).out.find("shards onset..detection: 42 (1 shard)\n") !=
        std::string::npos);
  // Many scattered ids: the first runs, and how many more.
  shards->clear_shard_ids();
  for (uint64_t id = 0; id < 40; id += 2) shards->add_shard_ids(id);
  CHECK(RunAlone(*show, {"I-1"}, &fake).out.find(
            "shards onset..detection: 0, 2, 4, 6, 8, 10, 12, 14, ... (12 runs more; --output json "
            "lists them) (20 shards)\n") != std::string::npos);
}

TEST_CASE("report against a fake: every attempt's history in one page", "[cli][commands]") {
  auto report = MakeReportCommand();
  FakeClient fake;
  fake.run_status.mutable_run()->set_run_id("run-a");
  fake.run_status.mutable_run()->set_attempt(2);
  for (int s = 0; s < 4; ++s) fake.run_status.add_recent()->set_step(s);
  const std::string path = "/tmp/twctl_operator_commands_test_" +
                           std::to_string(static_cast<long>(::getpid())) + ".html";
  Result r = RunAlone(*report, {"run-a", "--out", path}, &fake);
  CHECK(r.code == kOk);
  CHECK(r.out == "wrote " + path + ": 4 steps charted, 0 incidents, 0 quarantined ranges\n");
  // The current attempt, then each abandoned one by number.
  REQUIRE(fake.status_requests.size() == 3);
  CHECK_FALSE(fake.status_requests[0].has_attempt());
  CHECK(fake.status_requests[1].attempt() == 0);
  CHECK(fake.status_requests[1].has_attempt());
  CHECK(fake.status_requests[2].attempt() == 1);
  CHECK(fake.status_requests[2].window_steps() == 100000);
  std::ifstream page(path);
  std::string first;
  std::getline(page, first);
  CHECK(first == "<!doctype html>");
  std::remove(path.c_str());
  Result unwritable = RunAlone(*report, {"run-a", "--out", "/nonexistent/r.html"}, &fake);
  CHECK(unwritable.code == kError);
  CHECK(unwritable.err == "twctl report: cannot write /nonexistent/r.html\n");
  fake.status = grpc::Status(grpc::NOT_FOUND, "no run");
  CHECK(RunAlone(*report, {"run-b"}, &fake).code == kError);
}

TEST_CASE("rollback approve sends shard names - escaped commas and id-like names included",
          "[cli][commands][shards]") {
  auto approve = MakeRollbackApproveCommand();
  FakeClient fake;
  v1::Decision* d = fake.approve.mutable_decision();
  d->set_run_id("run-a");
  d->mutable_plan()->set_target_step(100);
  d->mutable_plan()->set_checkpoint_uri("ckpt://100");
  d->mutable_plan()->mutable_quarantine()->add_names("train-00012-of-01024.parquet");
  Result dry = RunAlone(
      *approve,
      {"I-1", "--dry-run", "--quarantine-shards", R"(1..4,train-00012-of-01024.parquet,a\,b,\7)"},
      &fake);
  INFO(dry.err);
  CHECK(dry.code == kOk);
  CHECK(dry.out ==
        "dry run: would roll back run run-a to step 100 (ckpt://100), quarantine shard "
        "train-00012-of-01024.parquet\n");
  REQUIRE(fake.approvals.size() == 1);
  const v1::ShardSet& sent = fake.approvals[0].quarantine_shards();
  REQUIRE(sent.ranges_size() == 1);
  CHECK(sent.ranges(0).last() == 4);
  REQUIRE(sent.names_size() == 3);
  CHECK(sent.names(0) == "train-00012-of-01024.parquet");
  CHECK(sent.names(1) == "a,b");
  CHECK(sent.names(2) == "7");
  // --help says how such a name is written.
  CHECK(approve->Help().find(R"(a leading \ (\7, \1..4))") != std::string::npos);
}

TEST_CASE("shards lists id ranges and names - a name as --quarantine-shards takes it",
          "[cli][commands][shards]") {
  auto shards = MakeShardsCommand();
  FakeClient fake;
  v1::QuarantineEntry* range = fake.quarantined.add_entries();
  auto* r = range->mutable_shards()->add_ranges();
  r->set_first(1);
  r->set_last(4);
  range->set_incident_id("I-1");
  range->set_decision_id("D-1");
  v1::QuarantineEntry* named = fake.quarantined.add_entries();
  named->mutable_shards()->add_names("a,b");
  named->set_incident_id("I-2");
  named->set_decision_id("D-2");
  Result out = RunAlone(*shards, {"run-a"}, &fake);
  CHECK(out.code == kOk);
  CHECK(out.out.find("1..4 ") != std::string::npos);
  CHECK(out.out.find("a\\,b ") != std::string::npos);
  CHECK(out.out.find("I-2") != std::string::npos);
}

TEST_CASE("rollback approve against a fake: the dry run then the approval", "[cli][commands]") {
  auto approve = MakeRollbackApproveCommand();
  FakeClient fake;
  v1::Decision* d = fake.approve.mutable_decision();
  d->set_run_id("run-a");
  d->set_decision_id("D-1");
  d->set_command_id("C-1");
  d->mutable_plan()->set_target_step(100);
  d->mutable_plan()->set_checkpoint_uri("ckpt://100");
  auto* q = d->mutable_plan()->mutable_quarantine()->add_ranges();
  q->set_first(5);
  q->set_last(6);
  const std::string what = "roll back run run-a to step 100 (ckpt://100), quarantine shards 5..6";

  Result dry = RunAlone(*approve, {"I-1", "--dry-run", "--quarantine-shards", "1..2,4"}, &fake);
  CHECK(dry.code == kOk);
  CHECK(dry.out == "dry run: would " + what + "\n");
  REQUIRE(fake.approvals.size() == 1);
  CHECK(fake.approvals[0].dry_run());
  CHECK(fake.approvals[0].incident_id() == "I-1");
  REQUIRE(fake.approvals[0].quarantine_shards().ranges_size() == 2);
  CHECK(fake.approvals[0].quarantine_shards().ranges(1).first() == 4);
  CHECK(fake.approvals[0].quarantine_shards().ranges(1).last() == 4);

  fake.approvals.clear();
  Result declined = RunAlone(*approve, {"I-1", "--comment", "go"}, &fake, /*answer=*/false);
  CHECK(declined.code == kError);
  CHECK(declined.err == "twctl: not approved\n");
  CHECK(fake.approvals.size() == 1);  // the dry run only

  fake.approvals.clear();
  Result yes = RunAlone(*approve, {"I-1", "--comment", "go", "--yes", "--to-step", "100"}, &fake);
  CHECK(yes.code == kOk);
  CHECK(yes.out == "I-1 approved (D-1): " + what + "; command C-1 sent to every rank\n");
  REQUIRE(fake.approvals.size() == 2);
  CHECK(fake.approvals[1].to_step() == 100);
  CHECK_FALSE(fake.approvals[1].dry_run());
  CHECK(fake.approvals[1].idempotency_key().rfind("twctl-I-1-100-", 0) == 0);
  CHECK(fake.approvals[1].comment() == "go");

  fake.approvals.clear();
  auto shards_error = [](const std::string& why) {
    return "twctl rollback approve: --quarantine-shards: " + why +
           " (it takes shard ids, A..B ranges with A <= B and shard names, comma-separated, e.g. "
           "1..4,9,train-00012-of-01024.parquet; in a name, write \\, for a comma and \\\\ for "
           "a backslash)\n";
  };
  struct Bad {
    std::vector<std::string> argv;
    std::string err;
  };
  for (const Bad& b : std::vector<Bad>{
           {{"I-1", "--skip-steps", "9..3"},
            "twctl rollback approve: --skip-steps takes A..B or none\n"},
           {{"I-1", "--to-step", "x"}, "twctl rollback approve: --to-step needs a step number\n"},
           {{"I-1", "--z-loss-alpha", "-1"},
            "twctl rollback approve: --z-loss-alpha needs a finite number >= 0\n"},
           {{"I-1", "--z-loss-alpha", "nan"},
            "twctl rollback approve: --z-loss-alpha needs a finite number >= 0\n"},
           {{"I-1", "--z-loss-alpha", "1e400"},
            "twctl rollback approve: --z-loss-alpha needs a finite number >= 0\n"},
           {{"I-1", "--quarantine-shards", "3..1"},
            shards_error("shard list entry \"3..1\": a range A..B needs A <= B")},
           {{"I-1", "--quarantine-shards", ""}, shards_error("the shard list is empty")},
           {{"I-1", "--quarantine-shards", "1,,2"},
            shards_error("shard list entry \"\": is empty")},
           {{"I-1", "--yes"},
            "twctl rollback approve: --comment is required (it goes in the audit log)\n"},
           {{}, "usage: twctl rollback approve|reject ID ...\n"}}) {
    Result r = RunAlone(*approve, b.argv, &fake);
    CHECK(r.code == kUsage);
    CHECK(r.err == b.err);
  }
  CHECK(fake.approvals.empty());
  fake.status = grpc::Status(grpc::FAILED_PRECONDITION, "already rolling back");
  Result refused = RunAlone(*approve, {"I-1", "--yes", "--comment", "go"}, &fake);
  CHECK(refused.code == kRefused);
  CHECK(refused.err == "twctl: already rolling back (refused in this state)\n");

  auto reject = MakeRollbackRejectCommand();
  Result no_comment = RunAlone(*reject, {"I-1"}, &fake);
  CHECK(no_comment.code == kUsage);
  CHECK(no_comment.err ==
        "twctl rollback reject: --comment is required (it goes in the audit log)\n");
  CHECK(fake.rejections.empty());
}

TEST_CASE("rollback approve against a fake: precision and lr-scale settings and their refusals",
          "[cli][commands]") {
  auto approve = MakeRollbackApproveCommand();
  FakeClient fake;
  v1::Decision* d = fake.approve.mutable_decision();
  d->set_run_id("run-a");
  d->set_decision_id("D-2");
  d->set_command_id("C-2");
  d->mutable_plan()->set_target_step(40);
  d->mutable_plan()->set_checkpoint_uri("ckpt://40");
  auto* lp = d->mutable_plan()->add_settings()->mutable_layer_precision();
  lp->set_layer("blocks.0.norm");
  lp->set_precision(v1::PRECISION_FP32);
  d->mutable_plan()->add_settings()->set_lr_scale(0.5);

  Result yes = RunAlone(*approve,
                        {"I-4", "--precision", "blocks.0.norm=fp32", "--precision=head=bf16",
                         "--lr-scale", "0.5", "--yes", "--comment", "bf16 cancels"},
                        &fake);
  CHECK(yes.code == kOk);
  CHECK(yes.out ==
        "I-4 approved (D-2): roll back run run-a to step 40 (ckpt://40), run blocks.0.norm in "
        "fp32, learning rate x0.5; command C-2 sent to every rank\n");
  REQUIRE(fake.approvals.size() == 2);  // the dry run, then the approval
  const v1::ApproveRollbackRequest& req = fake.approvals[1];
  REQUIRE(req.settings_size() == 3);
  CHECK(req.settings(0).layer_precision().layer() == "blocks.0.norm");
  CHECK(req.settings(0).layer_precision().precision() == v1::PRECISION_FP32);
  CHECK(req.settings(1).layer_precision().layer() == "head");
  CHECK(req.settings(1).layer_precision().precision() == v1::PRECISION_BF16);
  CHECK(req.settings(2).lr_scale() == 0.5);

  fake.approvals.clear();
  const std::string kPrecisionError =
      "twctl rollback approve: --precision takes MODULE=fp32|bf16|fp16 (e.g. blocks.0.norm=fp32), "
      "not '";
  const std::string kLrError =
      "twctl rollback approve: --lr-scale needs a finite number > 0 (e.g. 0.5)\n";
  struct Bad {
    std::vector<std::string> argv;
    std::string err;
  };
  for (const Bad& b : std::vector<Bad>{
           {{"I-4", "--precision", "norm=fp8"}, kPrecisionError + "norm=fp8'\n"},
           {{"I-4", "--precision", "norm"}, kPrecisionError + "norm'\n"},
           {{"I-4", "--precision", "=fp32"}, kPrecisionError + "=fp32'\n"},
           {{"I-4", "--precision", "norm=FP32"}, kPrecisionError + "norm=FP32'\n"},
           {{"I-4", "--lr-scale", "0"}, kLrError},
           {{"I-4", "--lr-scale", "-2"}, kLrError},
           {{"I-4", "--lr-scale", "inf"}, kLrError},
           {{"I-4", "--lr-scale", "half"}, kLrError}}) {
    Result r = RunAlone(*approve, b.argv, &fake);
    INFO(b.argv[1] << " " << b.argv[2]);
    CHECK(r.code == kUsage);
    CHECK(r.err == b.err);
  }
  CHECK(fake.approvals.empty());
}

TEST_CASE("watch against a fake: a line per event until --count", "[cli][commands]") {
  auto watch = MakeWatchCommand();
  FakeClient fake;
  for (const char* id : {"I-1", "I-2", "I-3"}) {
    v1::IncidentEvent e;
    e.set_kind(v1::INCIDENT_EVENT_KIND_SNAPSHOT);
    e.mutable_incident()->set_incident_id(id);
    e.mutable_incident()->set_run_id("run-a");
    e.mutable_incident()->set_state(v1::INCIDENT_STATE_AWAITING_DECISION);
    e.mutable_incident()->set_title(std::string(100, 'x'));
    fake.events.push_back(e);
  }
  std::vector<std::string> lines;
  Result r = RunAlone(*watch, {"--run", "run-a", "--open", "--count", "2", "--timeout", "7"}, &fake,
                      true, &lines);
  CHECK(r.code == kOk);
  CHECK(r.out.empty());  // streamed, not collected
  CHECK(fake.watch_request.run_id() == "run-a");
  CHECK(fake.watch_request.include_open());
  CHECK(fake.watch_timeout == 7);
  CHECK(fake.events_taken == 2);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].rfind("TIME", 0) == 0);
  CHECK(lines[1].find(" snapshot ") != std::string::npos);
  CHECK(lines[1].find("awaiting_decision") != std::string::npos);
  CHECK(lines[2].find("I-2") != std::string::npos);
  CHECK(lines[2].find(std::string(87, 'x') + "...\n") != std::string::npos);

  // Without --count: to the end of the stream (a timeout is a clean end).
  fake.events_taken = 0;
  Result json = RunAlone(*watch, {"-o", "json"}, &fake);
  CHECK(json.code == kOk);
  CHECK(fake.events_taken == 3);
  CHECK(fake.watch_timeout == 0);
  CHECK(json.out.rfind("{\"kind\":\"INCIDENT_EVENT_KIND_SNAPSHOT\"", 0) == 0);
  fake.watch_end = grpc::Status(grpc::UNAVAILABLE, "gone");
  Result gone = RunAlone(*watch, {}, &fake);
  CHECK(gone.code == kError);
  CHECK(gone.err == "twctl: gone (server unavailable)\n");
  Result bad = RunAlone(*watch, {"--count", "x"}, &fake);
  CHECK(bad.code == kUsage);
  CHECK(bad.err == "twctl watch: --count must be a whole number from 1 to 1000000000, not \"x\"\n");
}

TEST_CASE("numeric flags: zero - negative - past the bound - or not a number are usage errors",
          "[cli][commands][flags]") {
  auto watch = MakeWatchCommand();
  auto status = MakeStatusCommand();
  FakeClient fake;
  struct Case {
    const Command* command;
    std::vector<std::string> argv;
    std::string err;
  };
  const std::string points = "twctl status: --points must be a whole number from 1 to 100000, not ";
  const std::string count = "twctl watch: --count must be a whole number from 1 to 1000000000, not ";
  const std::string timeout =
      "twctl watch: --timeout must be a whole number from 1 to 31536000, not ";
  for (const Case& c : std::vector<Case>{
           {status.get(), {"run-a", "--points", "0"}, points + "\"0\"\n"},
           {status.get(), {"run-a", "--points", "-5"}, points + "\"-5\"\n"},
           {status.get(), {"run-a", "--points", "100001"}, points + "\"100001\"\n"},
           {status.get(), {"run-a", "--points", "99999999999"}, points + "\"99999999999\"\n"},
           {watch.get(), {"--count", "0"}, count + "\"0\"\n"},
           {watch.get(), {"--count", "-1"}, count + "\"-1\"\n"},
           {watch.get(), {"--timeout", "0"}, timeout + "\"0\"\n"},
           {watch.get(), {"--timeout", "-3"}, timeout + "\"-3\"\n"},
           {watch.get(), {"--timeout", "9223372036854775807"},
            timeout + "\"9223372036854775807\"\n"},
           {watch.get(), {"--timeout", "1.5"}, timeout + "\"1.5\"\n"},
       }) {
    CAPTURE(c.argv);
    const int before = fake.calls;
    const Result r = RunAlone(*c.command, c.argv, &fake);
    CHECK(r.code == kUsage);
    CHECK(r.err == c.err);
    CHECK(fake.calls == before);  // refused before any call
  }
  // The bounds themselves are taken.
  CHECK(RunAlone(*status, {"run-a", "--points", "100000"}, &fake).code == kOk);
  CHECK(fake.status_requests.back().window_steps() == 100000);
  CHECK(RunAlone(*watch, {"--timeout", "31536000", "--count", "1"}, &fake).code == kOk);
  CHECK(fake.watch_timeout == 31536000);
}

TEST_CASE("connection: flags then environment then config file then the default",
          "[cli][commands]") {
  const std::string config = "/tmp/twctl_operator_commands_test_" +
                             std::to_string(static_cast<long>(::getpid())) + ".json";
  std::ofstream(config) << R"({"server": "file:1", "token": "file-token", "ca_file": "ca.pem"})";
  setenv("TWCTL_CONFIG", config.c_str(), 1);
  unsetenv("TRAINWATCH_SERVER");
  setenv("TRAINWATCH_TOKEN", "env-token", 1);
  Connection c = ResolveConnection({});
  CHECK(c.server == "file:1");
  CHECK(c.token == "env-token");
  CHECK(c.ca_file == "ca.pem");
  c = ResolveConnection({"flag:1", "flag-token", "", "", ""});
  CHECK(c.server == "flag:1");
  CHECK(c.token == "flag-token");
  setenv("TWCTL_CONFIG", "/nonexistent/twctl.json", 1);
  unsetenv("TRAINWATCH_TOKEN");
  c = ResolveConnection({});
  CHECK(c.server == "127.0.0.1:7070");
  CHECK(c.token.empty());
  unsetenv("TWCTL_CONFIG");
  std::remove(config.c_str());
}

TEST_CASE("connection: a config or CA file that is a directory is an error naming it",
          "[cli][commands]") {
  const std::string dir = "/tmp/twctl_operator_commands_dir_" +
                          std::to_string(static_cast<long>(::getpid()));
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  const std::string expected = "cannot read " + dir + ": it is a directory";
  setenv("TWCTL_CONFIG", dir.c_str(), 1);
  Connection c = ResolveConnection({});
  CHECK(c.error.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(c.error.message()) == expected);
  CHECK(DialOperator(c).status().message() == expected);
  unsetenv("TWCTL_CONFIG");

  std::string out, err;
  CHECK(OperatorCommand("runs", {"--ca-file", dir}, nullptr, &out, &err, nullptr) == kUsage);
  CHECK(err == "twctl: CA file: " + expected + "\n");
  ::rmdir(dir.c_str());
}

TEST_CASE("connection: a missing or non-PEM CA file and a cert without its key fail before dialling",
          "[cli][commands][tls]") {
  const std::string dir = "/tmp/twctl_operator_commands_tls_" +
                          std::to_string(static_cast<long>(::getpid()));
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  const std::string not_pem = dir + "/ca.txt";
  std::ofstream(not_pem) << "not a certificate\n";
  unsetenv("TWCTL_CONFIG");
  struct Case {
    std::vector<std::string> args;
    std::string err;
  };
  // 127.0.0.1:1 refuses: an error that reached it would be UNAVAILABLE, exit 1.
  for (const Case& c : std::vector<Case>{
           {{"--ca-file", dir + "/missing.pem"},
            "twctl: CA file: cannot read " + dir + "/missing.pem: No such file or directory\n"},
           {{"--ca-file", not_pem},
            "twctl: CA file: " + not_pem + " holds no PEM block (-----BEGIN ...)\n"},
           {{"--cert", dir + "/client.pem"},
            "twctl: a client certificate (" + dir + "/client.pem) needs its key too\n"},
           {{"--key=" + dir + "/client.key"},
            "twctl: a client key (" + dir + "/client.key) needs its certificate too\n"},
       }) {
    CAPTURE(c.args);
    std::vector<std::string> args = {"--server", "127.0.0.1:1"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    std::string out, err;
    CHECK(OperatorCommand("runs", args, nullptr, &out, &err, nullptr) == kUsage);
    CHECK(err == c.err);
    CHECK(out.empty());
  }
  // The same from the environment, read in the one place the agent reads it.
  setenv("TRAINWATCH_CERT_FILE", (dir + "/client.pem").c_str(), 1);
  std::string out, err;
  CHECK(OperatorCommand("runs", {"--server", "127.0.0.1:1"}, nullptr, &out, &err, nullptr) ==
        kUsage);
  CHECK(err == "twctl: a client certificate (" + dir + "/client.pem) needs its key too\n");
  const Connection from_env = ResolveConnection({});
  CHECK(from_env.cert_file == dir + "/client.pem");
  unsetenv("TRAINWATCH_CERT_FILE");
  std::remove(not_pem.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("connection: a malformed twctl.json is an error naming the file and the key",
          "[cli][commands][config]") {
  const std::string config = "/tmp/twctl_operator_commands_bad_" +
                             std::to_string(static_cast<long>(::getpid())) + ".json";
  setenv("TWCTL_CONFIG", config.c_str(), 1);
  struct Case {
    std::string text;
    std::string err;
  };
  for (const Case& c : std::vector<Case>{
           {"{\"server\": \"h:1\",\n", config + ":2:1: expected a quoted key"},
           {"[\"h:1\"]", config + ": the config must be a JSON object (server, token, ca_file, "
                                  "cert_file, key_file)"},
           {"{\"server\": 7070}", config + ":1:12: server must be a string"},
           {"{\"sever\": \"h:1\"}", config + ":1:11: unknown key \"sever\" (known: server, token, "
                                           "ca_file, cert_file, key_file)"},
       }) {
    CAPTURE(c.text);
    std::ofstream(config) << c.text;
    std::string out, err;
    // Even with --server given: a broken config is not to be half-used.
    CHECK(OperatorCommand("runs", {"--server", "127.0.0.1:1"}, nullptr, &out, &err, nullptr) ==
          kUsage);
    CHECK(err.rfind("twctl: " + c.err, 0) == 0);
  }
  std::ofstream(config) << R"({"server": "file:1", "cert_file": "c.pem", "key_file": "k.pem"})";
  const Connection ok = ResolveConnection({});
  CHECK(ok.error.ok());
  CHECK(ok.cert_file == "c.pem");
  CHECK(ok.key_file == "k.pem");
  unsetenv("TWCTL_CONFIG");
  std::remove(config.c_str());
}

TEST_CASE("output: control characters are written out - UTF-8 text is kept", "[cli][escape]") {
  CHECK(TerminalSafe("a\x1b[2Jb\rc\n") == "a\\u001b[2Jb\\u000dc\n");
  CHECK(TerminalSafe("tab\tbell\x07" "del\x7f") == "tab\\u0009bell\\u0007del\\u007f");
  // C1 as UTF-8 (U+009B, CSI) and as a stray byte, which an 8-bit terminal
  // reads as CSI too; a lone lead byte; a sequence cut short at the end.
  CHECK(TerminalSafe("x\xc2\x9by") == "x\\u009by");
  CHECK(TerminalSafe("x\x9by") == "x\\u009by");
  CHECK(TerminalSafe("\xc3(") == "\\u00c3(");
  CHECK(TerminalSafe("\xe2\x96") == "\\u00e2\\u0096");
  // Printable text is untouched, including the sparkline's blocks (whose
  // UTF-8 holds the bytes 0x96, 0x81) and U+00A0 just past C1.
  const std::string text = "run-\xc3\xa9 \xe2\x96\x81\xe2\x96\x88 \xc2\xa0 \xf0\x9f\x94\xa5 ok";
  CHECK(TerminalSafe(text) == text);
  CHECK(TerminalSafe(TerminalSafe("\x1b")) == TerminalSafe("\x1b"));  // idempotent
}

TEST_CASE("output: a hostile run id and title reach the terminal escaped - and JSON stays exact",
          "[cli][escape]") {
  const std::string hostile_run = "evil\x1b[2J\rrun\xc2\x9b";
  const std::string hostile_title = "NaN\x1b]0;owned\x07 at step 9";
  auto dial = [&](const Connection&) {
    auto f = std::make_unique<FakeClient>();
    f->runs.add_runs()->set_run_id(hostile_run);
    v1::IncidentEvent e;
    e.set_kind(v1::INCIDENT_EVENT_KIND_OPENED);
    e.mutable_incident()->set_incident_id("I-1");
    e.mutable_incident()->set_run_id(hostile_run);
    e.mutable_incident()->set_title(hostile_title);
    f->events.push_back(e);
    f->status = grpc::Status(grpc::NOT_FOUND, "no run " + hostile_run);
    return f;
  };
  const CommandRegistry registry;
  auto run = [&](const std::string& cmd, const std::vector<std::string>& args,
                 std::vector<std::string>* lines = nullptr) {
    Result r;
    Context ctx;
    ctx.out = &r.out;
    ctx.err = &r.err;
    if (lines != nullptr) ctx.emit = [lines](const std::string& l) { lines->push_back(l); };
    r.code = registry.Dispatch(cmd, args, ctx, dial);
    return r;
  };
  auto raw_controls = [](const std::string& s) {
    for (unsigned char c : s) {
      if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
    }
    return s.find("\xc2\x9b") != std::string::npos;
  };
  // The fake answers NOT_FOUND, with the run id in the message: stderr too.
  const Result table = run("runs", {});
  CHECK(table.code == kError);
  CHECK_FALSE(raw_controls(table.err));
  CHECK(table.err == "twctl: no run evil\\u001b[2J\\u000drun\\u009b (not found)\n");

  std::vector<std::string> lines;
  const Result watched = run("watch", {"--count", "1"}, &lines);
  REQUIRE(lines.size() == 2);
  CHECK_FALSE(raw_controls(lines[1]));
  CHECK(lines[1].find("evil\\u001b[2J\\u000drun\\u009b") != std::string::npos);
  CHECK(lines[1].find("NaN\\u001b]0;owned\\u0007 at step 9") != std::string::npos);

  // -o json: still valid JSON, and it reads back to the very bytes sent.
  lines.clear();
  CHECK(run("watch", {"--count", "1", "-o", "json"}, &lines).code == kOk);
  REQUIRE(lines.size() == 1);
  CHECK_FALSE(raw_controls(lines[0]));
  auto doc = core::ParseJson(lines[0], "watch -o json");
  REQUIRE(doc.ok());
  const core::JsonValue* incident = doc->Find("incident");
  REQUIRE(incident != nullptr);
  CHECK(incident->Find("run_id")->string == hostile_run);
  CHECK(incident->Find("title")->string == hostile_title);
}

}  // namespace
}  // namespace trainwatch::cli
