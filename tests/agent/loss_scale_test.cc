// fp16 dynamic loss scaling through the agent: each rank's scale and
// overflow flag reduce across ranks (maxes), the engine on every rank judges
// the reduced record, and rank 0's record carries both to the server.

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "fake_trainwatchd.h"
#include "reduction_layout.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"

namespace trainwatch::agent {
namespace {

using testing::FreePort;
using testing::WaitUntil;

TEST_CASE("loss scale: the reduction takes the largest scale and any rank's overflow",
          "[agent][fp16]") {
  StepInput a, b;
  a.loss_scale = 1024.0;
  b.loss_scale = 2048.0;
  b.loss_scale_overflow = true;
  internal::StepReduction ra(a), rb(b);
  // The collective's max, by hand.
  for (size_t i = 0; i < ra.maxes().size(); ++i) {
    ra.maxes()[i] = std::max(ra.maxes()[i], rb.maxes()[i]);
  }
  const core::StepValues v = ra.Values();
  REQUIRE(v.HasLossScale());
  CHECK(v.loss_scale() == 2048.0);
  CHECK(v.loss_scale_overflow());
  // No rank with a scale: a bf16 run's record has none.
  StepInput plain;
  plain.loss = 2.0;
  CHECK_FALSE(internal::StepReduction(plain).Values().HasLossScale());
}

TEST_CASE("loss scale: an overflow without a scale or a scale not above 0 is refused",
          "[agent][fp16]") {
  auto agent = Agent::Create(AgentConfig{}, std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  StepInput in;
  in.step = 0;
  in.loss = 2.5;
  in.loss_scale_overflow = true;
  absl::StatusOr<Verdict> v = (*agent)->Step(in);
  REQUIRE_FALSE(v.ok());
  CHECK(v.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(v.status().message() == "step 0: loss_scale_overflow is set without a loss_scale");
  in.loss_scale = 0.0;
  v = (*agent)->Step(in);
  REQUIRE_FALSE(v.ok());
  CHECK(v.status().message() == "step 0: loss_scale 0 is not > 0");
  // Nothing was taken: step 0 is still the next.
  in.loss_scale = 1024.0;
  CHECK((*agent)->Step(in).ok());
  CHECK((*agent)->Stats().steps == 1);
}

TEST_CASE("loss scale: one rank's overflow is the step's on every rank and reaches the server",
          "[agent][fp16]") {
  constexpr int kRanks = 2;
  constexpr int kSteps = 40;
  constexpr int kOverflowStep = 30;
  const int port = FreePort();
  FakeServer fake;
  Running server(&fake, port);
  InProcessGroup group(kRanks);
  std::vector<std::vector<Verdict>> verdicts(kRanks);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      AgentConfig cfg;
      cfg.server_address = "127.0.0.1:" + std::to_string(port);
      cfg.run_id = "run-fp16";
      auto agent = Agent::Create(cfg, group.ReducerFor(r));
      if (!agent.ok()) {
        ++failed;
        return;
      }
      for (int64_t s = 0; s < kSteps; ++s) {
        StepInput in;
        in.step = s;
        in.loss = 2.5;
        in.grad_sum_squares = 0.5;
        in.grad_elements = 1000;
        // The ranks' scales differ by a step of the scaler; only rank 1's
        // gradients overflow, as when one rank's batch holds the inf.
        in.loss_scale = r == 0 ? 32768.0 : 65536.0;
        if (s == kOverflowStep && r == 1) {
          in.loss_scale_overflow = true;
          in.grad_nonfinite = 10;
        }
        const absl::StatusOr<Verdict> v = (*agent)->Step(in);
        if (!v.ok()) ++failed;  // Catch's assertions are not for threads
        verdicts[r].push_back(v.ok() ? *v : Verdict{});
      }
      (*agent)->Close();
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(failed == 0);
  // Without the flag, rank 1's nonfinite gradients would halt every rank.
  for (int r = 0; r < kRanks; ++r) {
    for (const Verdict& v : verdicts[r]) CHECK(v.decision == Decision::kContinue);
  }
  std::optional<v1::StepReport> overflow, clean;
  REQUIRE(WaitUntil(
      [&] {
        overflow = fake.global_report(kOverflowStep);
        clean = fake.global_report(kOverflowStep - 1);
        return overflow.has_value() && clean.has_value();
      },
      std::chrono::seconds(10)));
  REQUIRE(overflow->has_loss_scale());
  CHECK(overflow->loss_scale() == 65536.0);
  CHECK(overflow->loss_scale_overflow());
  REQUIRE(clean->has_loss_scale());
  CHECK(clean->loss_scale() == 65536.0);
  CHECK_FALSE(clean->loss_scale_overflow());
}

}  // namespace
}  // namespace trainwatch::agent
