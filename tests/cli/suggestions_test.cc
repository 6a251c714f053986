// Every command twctl's messages suggest works in the state it is suggested
// in: each incident's `incident show`, and each refusal, is read for lines
// and phrases that begin with "twctl ", and each one is run against the same
// live trainwatchd (in process), its "..." comment filled in.

#include <catch2/catch.hpp>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "server_fixture.h"
#include "test_util.h"
#include "trainwatch/cli/operator_commands.h"
#include "absl/strings/str_join.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server {
namespace {

using testing::Checkpoint;
using testing::Hello;
using testing::Running;
using testing::StartServer;
using testing::Step;
using testing::TempDir;
using testing::TestAgent;

struct Out {
  int code;
  std::string out, err;
};

Out Twctl(const std::string& server, const std::vector<std::string>& argv) {
  REQUIRE_FALSE(argv.empty());
  std::vector<std::string> args = {"--server", server};
  args.insert(args.end(), argv.begin() + 1, argv.end());
  Out o;
  o.code = cli::OperatorCommand(argv[0], args, [](const std::string&) { return true; }, &o.out,
                                &o.err);
  return o;
}

// Each command a text suggests: a line that is a twctl command, or one in
// backquotes inside a sentence; split as a shell would (a quoted "..." is
// one word, and the "..." comment is filled in).
std::vector<std::vector<std::string>> Suggested(const std::string& text) {
  std::vector<std::vector<std::string>> found;
  static const std::regex kCommand(R"re((?:^\s*|`)twctl ([^`\n]+))re",
                                   std::regex::ECMAScript | std::regex::multiline);
  static const std::regex kWord(R"re("([^"]*)"|(\S+))re");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kCommand);
       it != std::sregex_iterator(); ++it) {
    const std::string line = (*it)[1].str();
    std::vector<std::string> command;
    for (auto w = std::sregex_iterator(line.begin(), line.end(), kWord);
         w != std::sregex_iterator(); ++w) {
      const std::string word = (*w)[1].matched ? (*w)[1].str() : (*w)[2].str();
      command.push_back(word == "..." ? "suggested by twctl, run as suggested" : word);
    }
    found.push_back(command);
  }
  return found;
}

std::vector<std::string> IncidentIds(const std::string& server, const std::string& run) {
  Out o = Twctl(server, {"incidents", "--run", run, "-o", "json"});
  REQUIRE(o.code == 0);
  absl::StatusOr<core::JsonValue> v = core::ParseJson(o.out, "incidents");
  REQUIRE(v.ok());
  std::vector<std::string> ids;
  if (const core::JsonValue* list = v->Find("incidents"); list != nullptr) {
    for (const core::JsonValue& i : list->array) ids.push_back(i.Find("incident_id")->string);
  }
  return ids;
}

// A short run that diverges in its warm-up (a tier 2 page at step 32),
// with a checkpoint at step 10 or none.
void DivergingRun(TestAgent& a, const std::string& run, bool checkpoint) {
  a.Send(Hello(run, 0, 1));
  for (int64_t s = 0; s < 40; ++s) {
    a.Send(Step(run, 0, 1, s, s < 30 ? 3.0 - 0.01 * static_cast<double>(s) : 9.0, 1.0));
    if (checkpoint && s == 10) a.Send(Checkpoint(run, s));
  }
  REQUIRE(a.WaitDurable(0, 39));
}

TEST_CASE("twctl: every command a message suggests works in the state it is suggested in",
          "[server][twctl][suggestions]") {
  TempDir dir;
  Running r = StartServer(dir.File("tw.db"));
  const std::string addr = r.address();
  TestAgent with(r.channel), without(r.channel);
  DivergingRun(with, "run-ckpt", true);
  DivergingRun(without, "run-none", false);

  std::map<std::string, std::vector<std::string>> suggested;  // run -> the commands run
  for (const std::string run : {"run-ckpt", "run-none"}) {
    INFO(run);
    const std::vector<std::string> ids = IncidentIds(addr, run);
    REQUIRE_FALSE(ids.empty());
    for (const std::string& id : ids) {
      Out show = Twctl(addr, {"incident", "show", id});
      INFO(show.out << show.err);
      REQUIRE(show.code == 0);
      const auto suggestions = Suggested(show.out);
      for (const auto& command : suggestions) {
        INFO("suggested: twctl " << absl::StrJoin(command, " "));
        Out o = Twctl(addr, command);
        INFO(o.out << o.err);
        CHECK(o.code == 0);
        suggested[run].push_back(absl::StrJoin(command, " "));
      }
    }
  }
  // run-ckpt's page suggests its approval to the checkpoint, run-none's the
  // rejection (its approval would be refused).
  REQUIRE(suggested["run-ckpt"].size() == 1);
  CHECK(suggested["run-ckpt"][0].rfind("rollback approve I-", 0) == 0);
  CHECK(suggested["run-ckpt"][0].find("--to-step 10 ") != std::string::npos);
  REQUIRE(suggested["run-none"].size() == 1);
  CHECK(suggested["run-none"][0].rfind("rollback reject I-", 0) == 0);
  const std::vector<std::string> ckpt = IncidentIds(addr, "run-ckpt");
  CHECK(Twctl(addr, {"incident", "show", ckpt.back()}).out.find("rolling_back") !=
        std::string::npos);

  // The bare approval of the run without checkpoints: refused in words,
  // suggesting the rejection (already done above: it is dismissed now, and
  // says so) and never a --to-step that does not exist.
  TestAgent again(r.channel);
  DivergingRun(again, "run-none-2", false);
  const std::vector<std::string> ids = IncidentIds(addr, "run-none-2");
  REQUIRE_FALSE(ids.empty());
  Out bare = Twctl(addr, {"rollback", "approve", ids.back(), "--comment", "go"});
  INFO(bare.out << bare.err);
  CHECK(bare.code != 0);
  CHECK(bare.err.find("pass --to-step") == std::string::npos);
  CHECK(bare.err.find("reported no checkpoint, so there is nothing to roll back to") !=
        std::string::npos);
  CHECK(bare.err.find("(refused in this state)") != std::string::npos);
  const auto suggestions = Suggested(bare.err);
  REQUIRE(suggestions.size() >= 1);
  for (const auto& command : suggestions) {
    INFO("suggested: twctl " << absl::StrJoin(command, " "));
    CHECK(Twctl(addr, command).code == 0);
  }
}

}  // namespace
}  // namespace trainwatch::server
