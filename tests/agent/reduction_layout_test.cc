// The reduction layout alone: a step's numbers packed into the collective's
// buffers, reduced as the reducers do (sum; max, NaN winning), read back.

#include "reduction_layout.h"

#include <cmath>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

namespace trainwatch::agent::internal {
namespace {

using core::Signal;

// What every reducer leaves on every rank: sums summed, maxes maxed.
template <typename Buffers>
void ReduceAcross(std::vector<Buffers>& ranks) {
  for (size_t r = 1; r < ranks.size(); ++r) {
    for (size_t i = 0; i < ranks[0].sums().size(); ++i) ranks[0].sums()[i] += ranks[r].sums()[i];
    for (size_t i = 0; i < ranks[0].maxes().size(); ++i) {
      const double v = ranks[r].maxes()[i];
      if (std::isnan(v) || v > ranks[0].maxes()[i]) ranks[0].maxes()[i] = v;
    }
  }
}

TEST_CASE("layout: one rank gets its own numbers back", "[agent][layout]") {
  StepInput in;
  in.loss = 2.0;
  in.grad_sum_squares = 9.0;
  in.grad_nonfinite = 1;
  in.grad_elements = 4;
  in.log_z_sum = 16.0;
  in.log_z_rows = 2;
  in.learning_rate = 3e-4;
  in.attention_logit_p99 = 12.5;
  const StepReduction packed(in);  // one rank: the collective changes nothing
  const core::StepValues v = packed.Values();
  CHECK(v.Get(Signal::kLoss) == 2.0);
  CHECK(v.Get(Signal::kGradNorm) == 3.0);
  CHECK(v.Get(Signal::kNanFrac) == 0.25);
  CHECK(v.Get(Signal::kLogZ) == 8.0);
  CHECK(v.Get(Signal::kLearningRate) == 3e-4);
  CHECK(v.Get(Signal::kAttentionLogitP99) == 12.5);
  CHECK_FALSE(v.Has(Signal::kZLossAlpha));
  CHECK_FALSE(v.Has(Signal::kActivationMax));
  CHECK(packed.nonfinite() == 1);
  CHECK(packed.elements() == 4);
}

TEST_CASE("layout: nothing reported - nothing present", "[agent][layout]") {
  const StepReduction packed{StepInput()};
  CHECK(packed.Values().present() == 0);
}

TEST_CASE("layout: three ranks sum into means and norms - max the settings",
          "[agent][layout]") {
  std::vector<StepInput> in(3);
  in[0].loss = 1.0;
  in[1].loss = 2.0;
  in[2].loss = 6.0;
  in[0].grad_sum_squares = 1.0;
  in[1].grad_sum_squares = 2.0;
  in[2].grad_sum_squares = 1.0;
  for (auto& i : in) i.grad_elements = 10;
  in[1].grad_nonfinite = 3;
  // Different row counts: the mean over every row, not the mean of means.
  in[0].log_z_sum = 8.0;
  in[0].log_z_rows = 1;
  in[1].log_z_sum = 20.0;
  in[1].log_z_rows = 3;
  in[0].learning_rate = 1e-3;
  in[2].learning_rate = 2e-3;
  in[1].activation_max = std::numeric_limits<double>::quiet_NaN();
  in[2].activation_max = 5.0;
  std::vector<StepReduction> ranks(in.begin(), in.end());
  ReduceAcross(ranks);
  const core::StepValues v = ranks[0].Values();
  CHECK(v.Get(Signal::kLoss) == 3.0);
  CHECK(v.Get(Signal::kGradNorm) == 2.0);
  CHECK(v.Get(Signal::kNanFrac) == 0.1);
  CHECK(v.Get(Signal::kLogZ) == 7.0);
  CHECK(v.Get(Signal::kLearningRate) == 2e-3);
  // One rank's NaN travels as +inf: still nonfinite, still seen.
  CHECK(v.Get(Signal::kActivationMax) == std::numeric_limits<double>::infinity());
  CHECK_FALSE(v.Has(Signal::kZLossAlpha));
  CHECK(ranks[0].nonfinite() == 3);
  CHECK(ranks[0].elements() == 30);
}

TEST_CASE("layout: one rank's nonfinite loss makes the global loss NaN", "[agent][layout]") {
  std::vector<StepInput> in(3);
  in[0].loss = 1.0;
  in[1].loss = std::numeric_limits<double>::infinity();
  in[2].loss = 2.0;
  in[2].log_z_sum = std::nan("");
  in[2].log_z_rows = 4;
  std::vector<StepReduction> ranks(in.begin(), in.end());
  ReduceAcross(ranks);
  const core::StepValues v = ranks[0].Values();
  REQUIRE(v.Has(Signal::kLoss));
  CHECK(std::isnan(v.Get(Signal::kLoss)));
  REQUIRE(v.Has(Signal::kLogZ));
  CHECK(std::isnan(v.Get(Signal::kLogZ)));
  CHECK_FALSE(v.Has(Signal::kGradNorm));
}

TEST_CASE("layout: shard ids gathered from every rank - exact beyond 2^53", "[agent][layout]") {
  const uint64_t big = (uint64_t{1} << 60) + 7;
  const std::vector<std::vector<uint64_t>> mine = {{big + 2, 5}, {}, {5, big}};
  std::vector<ShardGather> ranks;
  for (int r = 0; r < 3; ++r) ranks.emplace_back(r, 3, mine[r]);
  ReduceAcross(ranks);
  CHECK(ranks[0].Ids() == std::vector<uint64_t>{5, big, big + 2});
}

TEST_CASE("layout: at most kPerRank shard ids per rank", "[agent][layout]") {
  std::vector<uint64_t> many;
  for (uint64_t i = 0; i < ShardGather::kPerRank + 5; ++i) many.push_back(100 + i);
  const ShardGather one(0, 1, many);
  const std::vector<uint64_t> ids = one.Ids();
  REQUIRE(ids.size() == ShardGather::kPerRank);
  CHECK(ids.front() == 100);
  CHECK(ids.back() == 100 + ShardGather::kPerRank - 1);
}

}  // namespace
}  // namespace trainwatch::agent::internal
