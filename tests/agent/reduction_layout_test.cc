// The reduction layout alone: a step's numbers packed into the collective's
// buffers, reduced as the reducers do (sum; max, NaN winning), read back.

#include "reduction_layout.h"

#include <cmath>
#include <cstdint>
#include <string>
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

TEST_CASE("layout: the server's rules are agreed only when every rank holds the same",
          "[agent][layout][rules]") {
  struct Case {
    std::vector<uint32_t> held;  // per rank; 0: none yet
    uint32_t agreed;
  };
  for (const Case& c : std::vector<Case>{{{7, 7, 7}, 7},
                                         {{7, 0, 7}, 0},   // one rank still waits
                                         {{0, 0, 0}, 0},
                                         {{7, 9, 7}, 0},   // different rules: never
                                         {{1u << 31, 1u << 31}, 1u << 31}}) {
    std::vector<StepReduction> ranks;
    for (uint32_t h : c.held) {
      ranks.emplace_back(StepInput());
      ranks.back().SetRulesHash(h);
    }
    ReduceAcross(ranks);
    CHECK(ranks[0].AgreedRulesHash() == c.agreed);
  }
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

// Two ranks of DDP: the same gradient on both after its all-reduce, one
// NaN in it. Each distinct element counts once.
TEST_CASE("layout: replicated gradients count once - not world_size times", "[agent][layout]") {
  const std::vector<GradGroup> replicated = {{9.0, 1, 7, 2}};
  std::vector<StepInput> in(2);
  for (auto& i : in) i.grad_groups = replicated;
  std::vector<StepReduction> ranks(in.begin(), in.end());
  ReduceAcross(ranks);
  const core::StepValues v = ranks[0].Values();
  CHECK(v.Get(Signal::kGradNorm) == 3.0);
  CHECK(v.Get(Signal::kNanFrac) == 1.0 / 7.0);
  CHECK(ranks[0].nonfinite() == 1);
  CHECK(ranks[0].elements() == 7);
  CHECK(ranks[0].local_nonfinite() == 1);
  CHECK(ranks[0].local_elements() == 7);
}

// Counts whose shares (1/3) are not exact in binary still come out as the
// integers they are, large ones included.
TEST_CASE("layout: weighted counts round once to exact integers", "[agent][layout]") {
  const int64_t big = (int64_t{1} << 40) + 1;
  const std::vector<GradGroup> replicated = {{1.0, 1, big, 3}};
  std::vector<StepInput> in(3);
  for (auto& i : in) i.grad_groups = replicated;
  std::vector<StepReduction> ranks(in.begin(), in.end());
  ReduceAcross(ranks);
  CHECK(ranks[0].nonfinite() == 1);
  CHECK(ranks[0].elements() == static_cast<uint64_t>(big));
  CHECK(ranks[0].Values().Get(Signal::kNanFrac) == 1.0 / static_cast<double>(big));
}

// 2 tensor-parallel x 2 data-parallel ranks (rank = dp * 2 + tp): each
// Linear weight is split in tp halves (a shard: dp = 2 copies), the norm is
// whole on every rank (duplicated: 4 copies). The norm over every parameter
// gathered once is sqrt(1 + 4 + 2) = sqrt(7). Loss and log Z: each TP group
// reports its data-parallel replica's numbers on both of its ranks, and the
// means are the data-parallel ones.
TEST_CASE("layout: hybrid counts shards per data-parallel copy - duplicates once",
          "[agent][layout]") {
  const std::vector<std::vector<GradGroup>> groups = {
      {{1.0, 0, 10, 2}, {2.0, 1, 3, 4}},   // tp 0: first half of the weight
      {{4.0, 2, 10, 2}, {2.0, 1, 3, 4}}};  // tp 1: second half
  std::vector<StepInput> in(4);
  for (int r = 0; r < 4; ++r) {
    const int dp = r / 2, tp = r % 2;
    in[r].grad_groups = groups[tp];
    in[r].loss = dp == 0 ? 1.0 : 3.0;
    // Different row counts per replica: the mean over every row of the
    // global batch, (2 * 4 + 6 * 8) / 8 = 7.
    in[r].log_z_sum = dp == 0 ? 8.0 : 48.0;
    in[r].log_z_rows = dp == 0 ? 2 : 6;
  }
  std::vector<StepReduction> ranks(in.begin(), in.end());
  ReduceAcross(ranks);
  const core::StepValues v = ranks[0].Values();
  CHECK(v.Get(Signal::kGradNorm) == Approx(std::sqrt(7.0)).epsilon(1e-15));
  CHECK(ranks[0].nonfinite() == 3);
  CHECK(ranks[0].elements() == 23);
  CHECK(v.Get(Signal::kNanFrac) == 3.0 / 23.0);
  CHECK(v.Get(Signal::kLoss) == 2.0);
  CHECK(v.Get(Signal::kLogZ) == 7.0);
  // Rank 1's own record: its shard and its copy of the norm, unweighted.
  CHECK(ranks[1].local_nonfinite() == 3);
  CHECK(ranks[1].local_elements() == 13);
}

TEST_CASE("layout: bad gradient groups are refused naming the field", "[agent][layout]") {
  std::vector<GradGroup> groups = {{1.0, 0, 4, 1}, {1.0, 0, 4, 3}};
  StepInput in;
  in.grad_groups = groups;
  CHECK(CheckGradLayout(in, 3).ok());
  absl::Status s = CheckGradLayout(in, 2);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("grad_groups[1].copies is 3"));
  groups[1].copies = 0;
  CHECK_FALSE(CheckGradLayout(in, 2).ok());
  groups[1] = {1.0, 5, 4, 1};
  s = CheckGradLayout(in, 2);
  CHECK_THAT(std::string(s.message()), Catch::Contains("grad_groups[1] has 5 nonfinite of 4"));
  groups[1] = {1.0, 0, 4, 1};
  in.grad_sum_squares = 1.0;
  s = CheckGradLayout(in, 2);
  CHECK_THAT(std::string(s.message()), Catch::Contains("both"));
  // The scalars alone are the sharded layout, as before.
  in.grad_groups = {};
  CHECK(CheckGradLayout(in, 2).ok());
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
