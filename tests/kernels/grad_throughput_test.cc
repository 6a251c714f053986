// The CPU grad statistics against a plain one-thread read of the same bytes.
// The goal (issue 16: >= 0.9x for fp32, bf16 and fp16 alike) is `make
// bench`'s to report, with the machine it ran on: on a host whose L3 holds
// these 32 MiB the plain read runs at the cache's speed, and bf16 measured
// 0.86-0.96x from one run to the next there. This case is the regression
// floor, 0.75x: a kernel that loses its vector loop or its prefetch falls
// well below it (the 16-bit passes reached 0.82x before they had eight
// accumulators and a software prefetch).
//
// Timing on a shared machine: the two are run in alternation and the best
// time of each is compared, since a load spike only ever makes a run slower.
// 32 MiB per dtype is well past L2, and the whole case takes ~0.3 s.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>

#include <catch2/catch.hpp>

#include "test_data.h"
#include "trainwatch/kernels/c_api.h"
#include "trainwatch/kernels/grad_stats.h"

namespace trainwatch::kernels {
namespace {

double Seconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

TEST_CASE("grad stats read gradients at >= 0.75x a plain read for every dtype",
          "[grad][throughput]") {
  const DType dtype =
      GENERATE(DType::kFloat32, DType::kBFloat16, DType::kFloat16);
  INFO("dtype " << DTypeName(dtype));
  constexpr int64_t kBytes = int64_t{32} << 20;
  constexpr int kReps = 9;
  testing::Rng rng(16);
  testing::HostTensor t(dtype, kBytes / DTypeSize(dtype));
  for (int64_t i = 0; i < t.numel(); ++i) {
    t.Set(i, static_cast<float>(rng.Normalish() * 1e-3));
  }
  const TensorView view = t.view();
  GradStatsOptions options;  // the path the agent gets: kAuto
  GradStats stats;
  uint64_t plain_sum = 0;
  double best_plain = std::numeric_limits<double>::infinity();
  double best_stats = best_plain;
  REQUIRE(ComputeGradStats(&view, 1, options, &stats).ok());  // warm-up
  for (int rep = 0; rep < kReps; ++rep) {
    const double t0 = Seconds();
    plain_sum += tw_kernels_plain_word_sum(view.data, kBytes);
    const double t1 = Seconds();
    REQUIRE(ComputeGradStats(&view, 1, options, &stats).ok());
    const double t2 = Seconds();
    best_plain = std::min(best_plain, t1 - t0);
    best_stats = std::min(best_stats, t2 - t1);
  }
  const double ratio = best_plain / best_stats;
  INFO("plain " << kBytes / best_plain / 1e9 << " GB/s, grad stats "
                << kBytes / best_stats / 1e9 << " GB/s, ratio " << ratio
                << " (plain sum " << plain_sum << ")");
  CHECK(stats.nonfinite == 0);
  CHECK(ratio >= 0.75);
}

}  // namespace
}  // namespace trainwatch::kernels
