// The C++ agent snippet (readme-test: cpp-agent, taken from its page of the
// documentation at build time) attached to a stand-in training loop on the
// CPU: synthetic gradients and logits, a corrupted batch, then a NaN. The
// snippet must skip the first and halt on the second, and let every healthy
// step through.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "readme_snippet.inc"

namespace {

TEST_CASE("readme: the C++ attach snippet skips a bad batch and halts on a NaN", "[readme]") {
  unsetenv("TRAINWATCH_SERVER");  // local decisions only; the server is tested elsewhere
  std::unique_ptr<tw::agent::Agent> agent = AttachTrainwatch();
  REQUIRE(agent != nullptr);
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> grad(4096), logits(8 * 256);
  constexpr int64_t kBad = 1200, kNan = 1300;
  std::vector<int64_t> skipped, halted;
  for (int64_t step = 0; step <= kNan; ++step) {
    const float scale = step == kBad ? 20.0f : 1.0f;  // a corrupted batch
    for (float& g : grad) g = 0.01f * scale * noise(rng);
    for (float& l : logits) l = 2.0f * noise(rng);
    if (step == kNan) grad[17] = std::nanf("");
    const double loss = (step == kBad ? 6.0 : 2.5) + 0.02 * noise(rng);
    const std::vector<tw::kernels::TensorView> grads = {
        {grad.data(), tw::kernels::DType::kFloat32, static_cast<int64_t>(grad.size())}};
    const tw::kernels::LogitsView view{logits.data(), tw::kernels::DType::kFloat32, 8, 256, 0};
    const std::vector<uint64_t> shards = {static_cast<uint64_t>(1000 + step)};
    switch (BeforeOptimizerStep(*agent, step, loss, grads, view, shards)) {
      case tw::agent::Decision::kContinue:
        break;
      case tw::agent::Decision::kSkipUpdate:
        skipped.push_back(step);
        break;
      case tw::agent::Decision::kHalt:
        halted.push_back(step);
        break;
    }
  }
  CHECK(skipped == std::vector<int64_t>{kBad});
  CHECK(halted == std::vector<int64_t>{kNan});
  CHECK(agent->Stats().steps == kNan + 1);
  agent->Close(0);
}

}  // namespace
