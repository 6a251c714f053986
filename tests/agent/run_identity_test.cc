// Which run an agent streams under: the argument, TRAINWATCH_RUN_ID, then the
// launcher's name for the job (torchrun, SLURM), and with none of them no
// streaming at all, while the local verdicts keep working.

#include "run_identity.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <string>

#include "trainwatch/agent/agent.h"

namespace trainwatch::agent {
namespace {

using internal::LauncherRunId;
using internal::RunIdFromLauncher;

absl::StatusOr<std::optional<LauncherRunId>> FromMap(
    const std::map<std::string, std::string>& vars) {
  return RunIdFromLauncher([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// Sets the given variables, unsets every other variable the run id comes
// from, and puts them all back as they were when it goes.
class ScopedRunIdEnv {
 public:
  explicit ScopedRunIdEnv(const std::map<std::string, std::string>& set) {
    for (const char* name : {"TRAINWATCH_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                             "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "TRAINWATCH_SERVER"}) {
      const char* old = std::getenv(name);
      saved_[name] = old == nullptr ? std::nullopt : std::optional<std::string>(old);
      unsetenv(name);
    }
    for (const auto& [name, value] : set) setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedRunIdEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// An agent built the way a trainer builds one: from the environment, then
// the trainer's own settings.
absl::StatusOr<std::unique_ptr<Agent>> AgentFromEnvironment(const std::string& run_id_argument,
                                                            const std::string& server) {
  absl::StatusOr<AgentConfig> cfg = AgentConfig::FromEnvironment();
  if (!cfg.ok()) return cfg.status();
  if (!run_id_argument.empty()) cfg->run_id = run_id_argument;
  cfg->server_address = server;
  cfg->reconnect_initial_ms = 10'000;  // nothing listens: keep the sender quiet
  cfg->rules.emplace().warmup_steps = 50;
  return Agent::Create(*cfg, std::make_unique<SingleProcessReducer>());
}

TEST_CASE("run id: torchrun's TORCHELASTIC_RUN_ID names the run unless it is none",
          "[agent][run_id]") {
  auto torch = FromMap({{"TORCHELASTIC_RUN_ID", "job-42"}, {"SLURM_JOB_ID", "7"}});
  REQUIRE(torch.ok());
  REQUIRE(torch->has_value());
  CHECK((*torch)->id == "job-42");
  CHECK((*torch)->note.find("TORCHELASTIC_RUN_ID") != std::string::npos);
  // torchrun without --rdzv-id sets "none": not a name, so SLURM's is next.
  auto none = FromMap({{"TORCHELASTIC_RUN_ID", "none"}, {"SLURM_JOB_ID", "7"}});
  REQUIRE(none.ok());
  REQUIRE(none->has_value());
  CHECK((*none)->id == "slurm-7");
  auto none_alone = FromMap({{"TORCHELASTIC_RUN_ID", "none"}});
  REQUIRE(none_alone.ok());
  CHECK_FALSE(none_alone->has_value());
  auto nothing = FromMap({});
  REQUIRE(nothing.ok());
  CHECK_FALSE(nothing->has_value());
}

TEST_CASE("run id: the tasks of a SLURM job array are separate runs", "[agent][run_id]") {
  auto task = FromMap(
      {{"SLURM_JOB_ID", "1003"}, {"SLURM_ARRAY_JOB_ID", "1000"}, {"SLURM_ARRAY_TASK_ID", "3"}});
  REQUIRE(task.ok());
  REQUIRE(task->has_value());
  CHECK((*task)->id == "slurm-1000_3");
  CHECK((*task)->note.find("SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID") != std::string::npos);
  auto other = FromMap(
      {{"SLURM_JOB_ID", "1004"}, {"SLURM_ARRAY_JOB_ID", "1000"}, {"SLURM_ARRAY_TASK_ID", "4"}});
  CHECK((*other)->id == "slurm-1000_4");
  auto plain = FromMap({{"SLURM_JOB_ID", "1003"}});
  CHECK((*plain)->id == "slurm-1003");
}

TEST_CASE("run id: a launcher's bytes outside the rule are replaced and too long is an error",
          "[agent][run_id]") {
  auto mapped = FromMap({{"TORCHELASTIC_RUN_ID", "team/exp 1"}});
  REQUIRE(mapped.ok());
  CHECK((*mapped)->id == "team_exp_1");
  CHECK((*mapped)->note.find("2 byte(s) outside [A-Za-z0-9._:-] replaced by '_'") !=
        std::string::npos);
  auto too_long = FromMap({{"TORCHELASTIC_RUN_ID", std::string(129, 'r')}});
  REQUIRE_FALSE(too_long.ok());
  CHECK(too_long.status().message() ==
        "the run id from TORCHELASTIC_RUN_ID (torchrun --rdzv-id) is 129 bytes long, over the "
        "128 a run id may have: set TRAINWATCH_RUN_ID");
}

TEST_CASE("run id: the argument beats TRAINWATCH_RUN_ID which beats the launcher",
          "[agent][run_id]") {
  ScopedRunIdEnv env({{"TRAINWATCH_RUN_ID", "from-env"}, {"TORCHELASTIC_RUN_ID", "from-torch"}});
  auto by_arg = AgentFromEnvironment("from-arg", "127.0.0.1:1");
  REQUIRE(by_arg.ok());
  CHECK((*by_arg)->run_id() == "from-arg");
  CHECK((*by_arg)->Stats().streaming);
  auto by_env = AgentFromEnvironment("", "127.0.0.1:1");
  REQUIRE(by_env.ok());
  CHECK((*by_env)->run_id() == "from-env");
  unsetenv("TRAINWATCH_RUN_ID");
  auto by_launcher = AgentFromEnvironment("", "127.0.0.1:1");
  REQUIRE(by_launcher.ok());
  CHECK((*by_launcher)->run_id() == "from-torch");
  CHECK((*by_launcher)->Stats().streaming);
  for (auto* a : {&*by_arg, &*by_env, &*by_launcher}) (*a)->Close(0);
}

TEST_CASE("run id: a given id that breaks the rule is Create's error naming it",
          "[agent][run_id]") {
  ScopedRunIdEnv env({});
  auto bad = AgentFromEnvironment("a/b", "");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message() ==
        "AgentConfig: run_id has the byte 0x2f: a run id is 1 to 128 characters of "
        "[A-Za-z0-9._:-]");
  setenv("TRAINWATCH_RUN_ID", std::string(129, 'r').c_str(), 1);
  auto long_env = AgentFromEnvironment("", "127.0.0.1:1");
  REQUIRE_FALSE(long_env.ok());
  CHECK(long_env.status().message().find("129 bytes long") != absl::string_view::npos);
}

TEST_CASE("run id: with a server but no id nothing streams - and the verdicts still work",
          "[agent][run_id]") {
  ScopedRunIdEnv env({});
  auto agent = AgentFromEnvironment("", "127.0.0.1:1");
  REQUIRE(agent.ok());
  CHECK_FALSE((*agent)->Stats().streaming);
  CHECK((*agent)->run_id().empty());
  std::mt19937_64 rng(7);
  std::normal_distribution<double> n(0.0, 1.0);
  std::map<int64_t, Decision> decided;
  for (int64_t s = 0; s <= 90; ++s) {
    StepInput in;
    in.step = s;
    in.loss = 2.5 + 0.02 * n(rng);
    in.grad_sum_squares = std::exp(0.1 * n(rng));
    in.grad_elements = 1000;
    if (s == 80) {  // a bad batch: tier 1 skips it
      in.loss = 6.0;
      in.grad_sum_squares = 160.0;
    }
    if (s == 90) in.grad_nonfinite = 3;  // tier 3 halts
    absl::StatusOr<Verdict> v = (*agent)->Step(in);
    REQUIRE(v.ok());
    decided[s] = v->decision;
  }
  CHECK(decided[79] == Decision::kContinue);
  CHECK(decided[80] == Decision::kSkipUpdate);
  CHECK(decided[90] == Decision::kHalt);
  const AgentStats stats = (*agent)->Stats();
  CHECK(stats.steps == 91);
  CHECK(stats.records_queued == 0);  // not one record under a made-up name
  CHECK_FALSE(stats.streaming);
  (*agent)->Close(0);
  // Without a server there is nothing to stream and no id is needed.
  auto local = AgentFromEnvironment("", "");
  REQUIRE(local.ok());
  CHECK_FALSE((*local)->Stats().streaming);
}

}  // namespace
}  // namespace trainwatch::agent
