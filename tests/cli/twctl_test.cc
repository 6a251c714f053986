// twctl's operator commands against a live trainwatchd (in process): every
// command in table and JSON form, the confirmation prompt, the documented
// exit codes, and connection settings from flags, environment or a file.

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "server_fixture.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/cli/operator_commands.h"
#include "trainwatch/core/json.h"
#include "daemon/server.h"

namespace trainwatch::server {
namespace {

using testing::Checkpoint;
using testing::Hello;
using testing::Step;
using testing::TempDir;
using testing::TestAgent;
using testing::Running;
using testing::StartServer;

struct Out {
  int code;
  std::string out, err;
};

Out Twctl(const std::string& server, const std::string& command, std::vector<std::string> args,
          bool answer = true) {
  std::vector<std::string> full = {"--server", server};
  full.insert(full.end(), args.begin(), args.end());
  Out o;
  o.code = cli::OperatorCommand(
      command, full, [answer](const std::string&) { return answer; }, &o.out, &o.err);
  return o;
}

core::JsonValue ParsedJson(const Out& o) {
  INFO(o.out << o.err);
  REQUIRE(o.code == 0);
  auto v = core::ParseJson(o.out, "twctl -o json");
  REQUIRE(v.ok());
  REQUIRE(v->type == core::JsonValue::Type::kObject);
  return *v;
}

TEST_CASE("twctl: every operator command - table and json - exit codes", "[server][twctl]") {
  TempDir dir;
  Running r = StartServer(dir.File("tw.db"));
  const std::string addr = r.address();
  auto ch = r.channel;
  const std::string run = "run-cli";
  TestAgent a(ch);
  a.Send(Hello(run, 0, 1));
  for (int64_t s = 0; s < 3700; ++s) {
    const double loss = 2.5 + 0.01 * std::sin(s * 1.7) + (s >= 3000 ? 0.3 : 0.0);
    a.Send(Step(run, 0, 1, s, loss, 1.0));
    if (s > 0 && s % 1000 == 0) a.Send(Checkpoint(run, s));
  }
  REQUIRE(a.WaitDurable(0, 3699));

  // runs
  Out runs = Twctl(addr, "runs", {});
  CHECK(runs.code == 0);
  CHECK(runs.out.find("run-cli") != std::string::npos);
  core::JsonValue rj = ParsedJson(Twctl(addr, "runs", {"-o", "json"}));
  REQUIRE(rj.Find("runs") != nullptr);
  CHECK(rj.Find("runs")->array[0].Find("run_id")->string == "run-cli");
  // status, with a sparkline
  Out status = Twctl(addr, "status", {run});
  CHECK(status.code == 0);
  CHECK(status.out.find("step 3699") != std::string::npos);
  CHECK(status.out.find("▁") != std::string::npos);
  core::JsonValue sj = ParsedJson(Twctl(addr, "status", {run, "-o", "json"}));
  CHECK(sj.Find("latest")->Find("step")->string == "3699");  // int64 as a JSON string
  CHECK(Twctl(addr, "status", {}).code == 2);
  CHECK(Twctl(addr, "status", {"no-such-run"}).code == 1);
  // incidents
  Out incidents = Twctl(addr, "incidents", {"--open", "--run", run});
  CHECK(incidents.code == 0);
  core::JsonValue ij = ParsedJson(Twctl(addr, "incidents", {"-o", "json"}));
  std::string id;
  for (const auto& i : ij.Find("incidents")->array) {
    if (i.Find("tier")->string == "TIER_LOGIT_DRIFT") id = i.Find("incident_id")->string;
  }
  REQUIRE_FALSE(id.empty());
  CHECK(incidents.out.find(id) != std::string::npos);
  // incident show: summary, charts, approval command
  Out show = Twctl(addr, "incident", {"show", id});
  CHECK(show.code == 0);
  CHECK(show.out.find("loss around the onset") != std::string::npos);
  CHECK(show.out.find("grad_norm percentiles") != std::string::npos);
  CHECK(show.out.find("twctl rollback approve " + id) != std::string::npos);
  core::JsonValue shj = ParsedJson(Twctl(addr, "incident", {"show", id, "-o", "json"}));
  CHECK(shj.Find("incident")->Find("summary")->Find("recommended_checkpoint") != nullptr);
  // rollback: dry run, declined prompt, approval, refusal
  Out dry = Twctl(addr, "rollback", {"approve", id, "--dry-run"});
  CHECK(dry.code == 0);
  CHECK(dry.out.find("dry run: would roll back run run-cli to step 3000") != std::string::npos);
  // Every rank skips its batches from just after the checkpoint (the onset is
  // at the checkpoint here) to the detection, unless the operator says else.
  core::JsonValue dj =
      ParsedJson(Twctl(addr, "rollback", {"approve", id, "--dry-run", "-o", "json"}));
  const core::JsonValue* skip = dj.Find("decision")->Find("plan")->Find("skip_steps");
  REQUIRE(skip != nullptr);
  CHECK(skip->Find("first")->string == "3001");
  CHECK(dry.out.find("skip the batches of steps 3001..") != std::string::npos);
  CHECK(show.out.find("recommended: skip the batches of steps 3001..") != std::string::npos);
  core::JsonValue none = ParsedJson(
      Twctl(addr, "rollback", {"approve", id, "--dry-run", "--skip-steps", "none", "-o", "json"}));
  CHECK(none.Find("decision")->Find("plan")->Find("skip_steps") == nullptr);
  core::JsonValue mine = ParsedJson(Twctl(
      addr, "rollback", {"approve", id, "--dry-run", "--skip-steps", "3100..3200", "-o", "json"}));
  CHECK(mine.Find("decision")->Find("plan")->Find("skip_steps")->Find("last")->string == "3200");
  CHECK(Twctl(addr, "rollback", {"approve", id, "--dry-run", "--skip-steps", "9..3"}).code == 2);
  Out declined = Twctl(addr, "rollback", {"approve", id, "--comment", "go"}, /*answer=*/false);
  CHECK(declined.code == 1);
  CHECK(declined.err.find("not approved") != std::string::npos);
  Out bad_step =
      Twctl(addr, "rollback", {"approve", id, "--to-step", "1234", "--yes", "--comment", "x"});
  CHECK(bad_step.code == 2);
  CHECK(bad_step.err.find("not a retained checkpoint") != std::string::npos);
  core::JsonValue aj = ParsedJson(
      Twctl(addr, "rollback", {"approve", id, "--comment", "roll back", "--yes", "-o", "json"}));
  CHECK(aj.Find("incident_state")->string == "INCIDENT_STATE_ROLLING_BACK");
  CHECK(aj.Find("decision")->Find("comment")->string == "roll back");
  Out twice = Twctl(addr, "rollback", {"approve", id, "--comment", "again", "--yes"});
  CHECK(twice.code == 3);
  CHECK(twice.err.find("already rolling back") != std::string::npos);
  CHECK(Twctl(addr, "rollback", {"reject", id}).code == 2);  // no comment
  Out reject = Twctl(addr, "rollback", {"reject", id, "--comment", "no"});
  CHECK(reject.code == 3);
  // shards
  Out shards = Twctl(addr, "shards", {run});
  CHECK(shards.code == 0);
  CHECK(shards.out.find(id) != std::string::npos);
  // Since when, as a UTC time a person reads.
  CHECK(std::regex_search(shards.out, std::regex(R"(20\d\d-\d\d-\d\d \d\d:\d\d:\d\dZ)")));
  core::JsonValue qj = ParsedJson(Twctl(addr, "shards", {run, "-o", "json"}));
  CHECK(qj.Find("entries")->array.size() == 1);
  // usage errors
  CHECK(Twctl(addr, "incidents", {"--bogus"}).code == 2);
  CHECK(Twctl(addr, "runs", {"-o", "yaml"}).code == 2);
  CHECK(Twctl(addr, "frobnicate", {}).code == 2);
  CHECK(a.Close().ok());
}

TEST_CASE("twctl: watch prints incident changes as they happen", "[server][twctl]") {
  TempDir dir;
  Running r = StartServer(dir.File("tw.db"));
  const std::string addr = r.address();
  auto ch = r.channel;
  const std::string run = "run-watch";
  TestAgent a(ch);
  a.Send(Hello(run, 0, 1));
  for (int64_t s = 0; s < 3700; ++s) {
    a.Send(Step(run, 0, 1, s, 2.5 + 0.01 * std::sin(s * 1.7) + (s >= 3000 ? 0.3 : 0.0), 1.0));
  }
  REQUIRE(a.WaitDurable(0, 3699));
  r.server->ingestor()->Flush();
  core::JsonValue list =
      ParsedJson(Twctl(addr, "incidents", {"--run", run, "--open", "-o", "json"}));
  std::string id;
  const size_t open = list.Find("incidents")->array.size();
  for (const core::JsonValue& i : list.Find("incidents")->array) {
    if (i.Find("tier")->string == "TIER_LOGIT_DRIFT") id = i.Find("incident_id")->string;
  }
  REQUIRE(!id.empty());

  // The open incidents first (--open), then the change a human makes.
  std::mutex mu;
  std::vector<std::string> lines;
  std::string out, err;
  int code = -1;
  std::thread watch([&] {
    code = cli::OperatorCommand("watch",
                                {"--server", addr, "--run", run, "--open", "--count",
                                 std::to_string(open + 1), "--timeout", "60"},
                                nullptr, &out, &err, [&](const std::string& line) {
                                  std::lock_guard<std::mutex> lock(mu);
                                  lines.push_back(line);
                                });
  });
  auto seen = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return lines.size();
  };
  // Up to 30 s on a busy machine.
  REQUIRE(testing::WaitUntil([&] { return seen() >= open + 1; }, std::chrono::seconds(30)));
  REQUIRE(seen() == open + 1);  // the header and a snapshot per open incident
  CHECK(Twctl(addr, "rollback", {"reject", id, "--comment", "benign"}).code == 0);
  watch.join();
  INFO(err);
  CHECK(code == 0);
  REQUIRE(lines.size() == open + 2);
  CHECK(lines[0].rfind("TIME", 0) == 0);
  bool snapshot = false;
  for (size_t i = 1; i <= open; ++i) {
    CHECK(lines[i].find("snapshot") != std::string::npos);
    if (lines[i].find(id) != std::string::npos) {
      snapshot = lines[i].find("awaiting_decision") != std::string::npos;
    }
  }
  CHECK(snapshot);
  CHECK(lines.back().find(id) != std::string::npos);
  CHECK(lines.back().find("dismissed") != std::string::npos);
  CHECK(lines.back().find("state_changed") != std::string::npos);
  CHECK(out.empty());  // streamed, not collected
  // A watch with nothing happening ends at its timeout, cleanly.
  Out quiet = Twctl(addr, "watch", {"--run", "nobody", "--timeout", "1", "-o", "json"});
  CHECK(quiet.code == 0);
  CHECK(quiet.out.empty());
  CHECK(Twctl(addr, "watch", {"--count", "x"}).code == 2);
  CHECK(a.Close().ok());
}

TEST_CASE("twctl: server and token from the environment or a config file", "[server][twctl]") {
  TempDir dir;
  const std::string tokens = dir.File("tokens.json");
  std::ofstream(tokens) << R"({"tokens": [
      {"name": "oncall", "token": "operator-token-0123456", "role": "operator"}]})";
  ServerOptions o;
  o.tokens_file = tokens;
  Running r = StartServer(dir.File("tw.db"), core::SystemClock(), o);
  const std::string addr = r.address();
  auto run = [](std::vector<std::string> args) {
    Out out;
    out.code = cli::OperatorCommand("runs", args, nullptr, &out.out, &out.err);
    return out;
  };
  const std::string config = dir.File("twctl.json");
  std::ofstream(config) << "{\"server\": \"" << addr
                        << "\", \"token\": \"operator-token-0123456\"}";
  setenv("TWCTL_CONFIG", config.c_str(), 1);
  CHECK(run({}).code == 0);  // both from the file
  setenv("TRAINWATCH_TOKEN", "wrong-token-0123456789", 1);
  const Out env = run({});  // the environment wins over the file
  CHECK(env.code == 1);
  CHECK(env.err.find("unknown bearer token") != std::string::npos);
  CHECK(run({"--token", "operator-token-0123456"}).code == 0);  // a flag wins over both
  unsetenv("TRAINWATCH_TOKEN");
  unsetenv("TWCTL_CONFIG");
}

TEST_CASE("twctl: sparkline and chart render what they are given", "[twctl]") {
  CHECK(cli::Sparkline({1, 2, 3, 4, 5, 6, 7, 8}) == "▁▂▃▄▅▆▇█");
  CHECK(cli::Sparkline({5, 5, 5}) == "▄▄▄");
  CHECK(cli::Sparkline({}).empty());
  const std::string chart = cli::Chart("t", {{0, 1.0}, {10, 2.0}}, 10, 3);
  CHECK(chart.rfind("t\n", 0) == 0);
  CHECK(chart.find("*") != std::string::npos);
  CHECK(cli::Chart("empty", {}) == "empty: no data\n");
}

}  // namespace
}  // namespace trainwatch::server

namespace trainwatch::cli {
namespace {

TEST_CASE("twctl: connection and output options may come before the command", "[twctl]") {
  std::string command, err;
  std::vector<std::string> args;
  REQUIRE(SplitCommandLine({"--server", "h:1", "-o", "json", "incidents", "--open"}, &command,
                           &args, &err));
  CHECK(command == "incidents");
  CHECK(args == std::vector<std::string>{"--open", "--server", "h:1", "-o", "json"});
  REQUIRE(SplitCommandLine({"--token=t", "rollback", "approve", "I-1", "--yes"}, &command, &args,
                           &err));
  CHECK(command == "rollback");
  CHECK(args == std::vector<std::string>{"approve", "I-1", "--yes", "--token=t"});
  REQUIRE(SplitCommandLine({"runs"}, &command, &args, &err));
  CHECK(command == "runs");
  CHECK(args.empty());
  CHECK_FALSE(SplitCommandLine({"--server"}, &command, &args, &err));
  CHECK(err.find("--server needs a value") != std::string::npos);
  CHECK_FALSE(SplitCommandLine({"-o", "json"}, &command, &args, &err));
  CHECK(err.find("no command") != std::string::npos);
  // --server=ADDR after the command reaches the command as a value.
  std::string out;
  CHECK(OperatorCommand("runs", {"--server=127.0.0.1:1"}, nullptr, &out, &err) == 1);
  CHECK(err.find("127.0.0.1:1") != std::string::npos);
}

}  // namespace
}  // namespace trainwatch::cli
