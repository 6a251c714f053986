// Every rank reaches the same verdict: several ranks as threads of one
// process, each with its own agent and its own local numbers, reduced
// through one collective per step.

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <random>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "trainwatch/agent/agent.h"

namespace trainwatch::agent {
namespace {

using core::Signal;

TEST_CASE("ranks: identical verdicts from different local numbers", "[agent][ranks]") {
  constexpr int kRanks = 4;
  constexpr int kSteps = 3000;
  InProcessGroup group(kRanks);
  std::vector<std::vector<Decision>> decisions(kRanks);
  std::vector<std::vector<double>> ratios(kRanks);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      AgentConfig cfg;  // no server: local decisions only
      auto agent = Agent::Create(cfg, group.ReducerFor(r));
      REQUIRE(agent.ok());
      std::mt19937_64 rng(100 + r);  // each rank sees different batches
      std::normal_distribution<double> n(0.0, 1.0);
      for (int64_t s = 0; s < kSteps; ++s) {
        StepInput in;
        in.step = s;
        in.loss = 2.5 + 0.02 * n(rng);
        in.grad_sum_squares = 0.25 * std::exp(0.1 * n(rng));  // 4 ranks: norm ~1
        in.grad_elements = 1000;
        in.log_z_sum = 8.0 * 16 + n(rng);
        in.log_z_rows = 16;
        if (s == 2000 && r == 1) {  // one rank's batch is bad: its grads blow up
          in.loss = 6.0;
          in.grad_sum_squares = 40.0;
        }
        if (s == 2800 && r == 3) in.grad_nonfinite = 3;  // one rank's NaN
        const absl::StatusOr<Verdict> v = (*agent)->Step(in);
        if (!v.ok()) ++failed;  // Catch's assertions are not for threads
        decisions[r].push_back(v.ok() ? v->decision : Decision::kHalt);
        ratios[r].push_back((*agent)->last_outcome().loss_ema_ratio);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failed == 0);
  for (int r = 1; r < kRanks; ++r) {
    REQUIRE(decisions[r] == decisions[0]);
    for (int64_t s = 0; s < kSteps; ++s) {
      // Bit-identical, NaN included.
      REQUIRE(std::memcmp(&ratios[r][s], &ratios[0][s], sizeof(double)) == 0);
    }
  }
  CHECK(decisions[0][2000] == Decision::kSkipUpdate);  // every rank skips rank 1's batch
  CHECK(decisions[0][1999] == Decision::kContinue);
  CHECK(decisions[0][2800] == Decision::kHalt);        // every rank halts on rank 3's NaN
}

TEST_CASE("ranks: a failed collective halts instead of guessing", "[agent][ranks]") {
  auto reducer = std::make_unique<CallbackReducer>(
      0, 2, [](absl::Span<double>, absl::Span<double>) {
        return absl::UnavailableError("peer gone");
      });
  auto agent = Agent::Create(AgentConfig(), std::move(reducer));
  REQUIRE(agent.ok());
  StepInput in;
  in.step = 1;
  in.loss = 2.0;
  const absl::StatusOr<Verdict> v = (*agent)->Step(in);
  REQUIRE_FALSE(v.ok());
  CHECK(v.status().code() == absl::StatusCode::kUnavailable);
  CHECK(v.status().message() == "cross-rank reduction failed: peer gone");
}

TEST_CASE("ranks: steps must increase", "[agent][ranks]") {
  auto agent = Agent::Create(AgentConfig(), std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  StepInput in;
  in.step = 5;
  in.loss = 2.0;
  CHECK((*agent)->Step(in)->decision == Decision::kContinue);
  const absl::StatusOr<Verdict> again = (*agent)->Step(in);
  REQUIRE_FALSE(again.ok());
  CHECK(again.status().message().find("strictly increase") != absl::string_view::npos);
}

TEST_CASE("rollback: ResumeFrom lets the steps start again after a checkpoint", "[agent][ranks]") {
  auto agent = Agent::Create(AgentConfig(), std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  StepInput in;
  in.loss = 2.0;
  for (int64_t s = 0; s < 1500; ++s) {
    in.step = s;
    REQUIRE((*agent)->Step(in)->decision == Decision::kContinue);
    if (s % 500 == 0) (*agent)->ReportCheckpoint(s, "ckpt://" + std::to_string(s));
  }
  in.step = 1001;
  CHECK_FALSE((*agent)->Step(in).ok());  // not without ResumeFrom
  (*agent)->ResumeFrom(1000);
  const absl::StatusOr<Verdict> resumed = (*agent)->Step(in);
  REQUIRE(resumed.ok());
  CHECK(resumed->decision == Decision::kContinue);
  // A NaN after the rollback halts at once (tier 3 needs no warm-up) and
  // the recommendation is the checkpoint before it.
  in.step = 1002;
  in.grad_nonfinite = 1;
  in.grad_elements = 10;
  CHECK((*agent)->Step(in)->decision == Decision::kHalt);
  REQUIRE_FALSE((*agent)->last_outcome().events.empty());
  CHECK((*agent)->last_outcome().events[0].recommended_checkpoint_step == 1000);
}

// Three ranks train 3,000 steps, roll back to 2,000, and meet a bad batch
// (on one rank) 5 steps later: the rebuilt engines skip it at once, on every
// rank. Without kept records the engine would be warming up and let it by.
std::vector<std::vector<Decision>> RollbackThenBadBatch(size_t history) {
  constexpr int kRanks = 3;
  InProcessGroup group(kRanks);
  std::vector<std::vector<Decision>> after(kRanks);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      AgentConfig cfg;
      cfg.resume_history_records = history;
      auto agent = Agent::Create(cfg, group.ReducerFor(r));
      REQUIRE(agent.ok());
      auto input = [r](int64_t s) {
        StepInput in;
        in.step = s;
        in.loss = 2.5 + 0.02 * std::sin(0.7 * static_cast<double>(s) + r);
        in.grad_sum_squares = 0.3 + 0.02 * std::cos(1.3 * static_cast<double>(s) * (r + 1));
        in.grad_elements = 1000;
        return in;
      };
      for (int64_t s = 0; s < 3000; ++s) {
        if (!(*agent)->Step(input(s)).ok()) ++failed;
      }
      (*agent)->ResumeFrom(2000);
      for (int64_t s = 2001; s <= 2010; ++s) {
        StepInput in = input(s);
        if (s == 2005 && r == 1) {
          in.loss = 7.0;
          in.grad_sum_squares = 50.0;
        }
        const absl::StatusOr<Verdict> v = (*agent)->Step(in);
        if (!v.ok()) ++failed;
        after[r].push_back(v.ok() ? v->decision : Decision::kHalt);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failed == 0);
  return after;
}

TEST_CASE("rollback: the rebuilt engine skips a bad batch right after the checkpoint",
          "[agent][ranks]") {
  const auto after = RollbackThenBadBatch(20000);
  std::vector<Decision> want(10, Decision::kContinue);
  want[4] = Decision::kSkipUpdate;  // step 2005
  for (const auto& ranks : after) CHECK(ranks == want);
  // With nothing kept the engine starts over and is still warming up.
  const auto cold = RollbackThenBadBatch(0);
  for (const auto& ranks : cold) CHECK(ranks == std::vector<Decision>(10, Decision::kContinue));
}

TEST_CASE("config: from the environment - with clear errors", "[agent][config]") {
  setenv("TRAINWATCH_SERVER", "127.0.0.1:9", 1);
  setenv("TRAINWATCH_RUN_ID", "run-env", 1);
  setenv("TRAINWATCH_MEMORY_RECORDS", "123", 1);
  auto c = AgentConfig::FromEnvironment();
  REQUIRE(c.ok());
  CHECK(c->server_address == "127.0.0.1:9");
  CHECK(c->run_id == "run-env");
  CHECK(c->memory_records == 123);
  setenv("TRAINWATCH_MEMORY_RECORDS", "lots", 1);
  auto bad = AgentConfig::FromEnvironment();
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()) ==
        "TRAINWATCH_MEMORY_RECORDS=lots is not a positive integer");
  unsetenv("TRAINWATCH_SERVER");
  unsetenv("TRAINWATCH_RUN_ID");
  unsetenv("TRAINWATCH_MEMORY_RECORDS");
}

TEST_CASE("config: sender_nice from the environment - and its range checked at Create",
          "[agent][config]") {
  CHECK(AgentConfig().sender_nice == 0);  // SCHED_BATCH alone: see agent.h
  setenv("TRAINWATCH_SENDER_NICE", "3", 1);
  auto c = AgentConfig::FromEnvironment();
  REQUIRE(c.ok());
  CHECK(c->sender_nice == 3);
  setenv("TRAINWATCH_SENDER_NICE", "low", 1);
  auto bad = AgentConfig::FromEnvironment();
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()) ==
        "TRAINWATCH_SENDER_NICE=low is not an integer (0..19)");
  unsetenv("TRAINWATCH_SENDER_NICE");
  for (const int nice : {-1, 20}) {
    AgentConfig cfg;
    cfg.sender_nice = nice;
    auto agent = Agent::Create(cfg, std::make_unique<SingleProcessReducer>());
    REQUIRE_FALSE(agent.ok());
    CHECK(agent.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(agent.status().message()) ==
          "sender_nice " + std::to_string(nice) + " is outside 0..19");
  }
}

TEST_CASE("ranks: last_values is the reduced record - the same on every rank", "[agent][ranks]") {
  constexpr int kRanks = 2;
  InProcessGroup group(kRanks);
  std::vector<core::StepValues> seen(kRanks);
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto agent = Agent::Create(AgentConfig(), group.ReducerFor(r));
      if (!agent.ok()) return void(++failed);
      StepInput in;
      in.step = 1;
      in.loss = r == 0 ? 2.0 : 4.0;
      in.grad_sum_squares = r == 0 ? 1.0 : 9.0;
      in.grad_elements = 100;
      in.grad_nonfinite = 0;
      in.log_z_sum = r == 0 ? 10.0 : 90.0;  // 1 row at 10, 3 rows at 30
      in.log_z_rows = r == 0 ? 1 : 3;
      if (!(*agent)->Step(in).ok()) return void(++failed);
      seen[r] = (*agent)->last_values();
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(failed == 0);
  CHECK(seen[0].Get(Signal::kLoss) == 3.0);            // the mean over ranks
  CHECK(seen[0].Get(Signal::kLogZ) == 25.0);           // weighted by rows
  CHECK(seen[0].Get(Signal::kNanFrac) == 0.0);
  for (int s = 0; s < core::kNumSignals; ++s) {
    const auto sig = static_cast<Signal>(s);
    CHECK(seen[0].Has(sig) == seen[1].Has(sig));
    if (seen[0].Has(sig)) CHECK(seen[0].Get(sig) == seen[1].Get(sig));
  }
  // Not either rank's own norm (1 and 3), whatever the gradient layout.
  CHECK(seen[0].Get(Signal::kGradNorm) != 1.0);
  CHECK(seen[0].Get(Signal::kGradNorm) != 3.0);
}

// Sets an environment variable for one scope, and unsets it on the way out,
// also when a REQUIRE fails.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST_CASE("config: TRAINWATCH_RULES as JSON or a file - below the caller's rules", "[agent][config]") {
  AgentConfig defaults;
  defaults.rules.emplace().warmup_min_records = 7;  // the caller's defaults: kept where the env is silent
  {
    ScopedEnv env("TRAINWATCH_RULES", R"( {"warmup_steps": 12})");
    auto c = AgentConfig::FromEnvironment();
    REQUIRE(c.ok());
    CHECK(c->rules->warmup_steps == 12);
    CHECK(c->rules->warmup_min_records == core::RuleConfig().warmup_min_records);
  }
  char path[] = "/tmp/tw_rules_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const std::string body = R"({"warmup_steps": 34})";
  REQUIRE(write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size()));
  close(fd);
  {
    ScopedEnv env("TRAINWATCH_RULES", path);
    auto c = AgentConfig::FromEnvironment();
    std::remove(path);
    REQUIRE(c.ok());
    CHECK(c->rules->warmup_steps == 34);
  }
  {
    // Unset: the defaults given stay.
    auto c = AgentConfig::FromEnvironment(defaults);
    REQUIRE(c.ok());
    CHECK(c->rules->warmup_min_records == 7);
  }
}

TEST_CASE("config: a bad TRAINWATCH_RULES is an error naming the variable", "[agent][config]") {
  {
    ScopedEnv env("TRAINWATCH_RULES", R"({"warmup_stepz": 1})");
    auto c = AgentConfig::FromEnvironment();
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(std::string(c.status().message()), Catch::Contains("TRAINWATCH_RULES"));
    CHECK_THAT(std::string(c.status().message()), Catch::Contains("warmup_stepz"));
  }
  {
    ScopedEnv env("TRAINWATCH_RULES", R"({"warmup_steps": -5})");
    auto c = AgentConfig::FromEnvironment();
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(std::string(c.status().message()), Catch::Contains("TRAINWATCH_RULES"));
  }
  {
    ScopedEnv env("TRAINWATCH_RULES", "/nonexistent/rules.json");
    auto c = AgentConfig::FromEnvironment();
    REQUIRE_FALSE(c.ok());
    CHECK_THAT(std::string(c.status().message()), Catch::Contains("TRAINWATCH_RULES"));
    CHECK_THAT(std::string(c.status().message()), Catch::Contains("/nonexistent/rules.json"));
  }
}

}  // namespace
}  // namespace trainwatch::agent
