// Private: how one step's numbers travel through the reducer's collective
// (a few doubles summed, a few maxed) and what they mean once reduced, so
// that every rank derives the same global record from the same buffers.
// The gradient sums are weighted by each group's copies (agent.h,
// GradGroup), so that one sum over the whole world counts every distinct
// gradient element once in any layout.
// Also the layout of the rarer second collective that gathers every rank's
// shard ids.

#ifndef TRAINWATCH_AGENT_SRC_REDUCTION_LAYOUT_H_
#define TRAINWATCH_AGENT_SRC_REDUCTION_LAYOUT_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/core/step_record.h"

namespace trainwatch::agent::internal {

// The step's buffers: packed from this rank's input on construction,
// reduced in place through sums() and maxes(), then read back.
class StepReduction {
 public:
  // REQUIRES: CheckGradLayout(in, world_size) is OK (agent.h).
  explicit StepReduction(const StepInput& in);

  absl::Span<double> sums() { return absl::MakeSpan(sums_); }
  absl::Span<double> maxes() { return absl::MakeSpan(maxes_); }

  // The global numbers, once every rank's buffers are reduced (on one rank
  // alone: that rank's own numbers).
  core::StepValues Values() const;
  // The distinct gradient elements over every rank (each copy counted
  // once), rounded once after the reduction: exact integers.
  uint64_t nonfinite() const { return Count(sums_[kNonfinite]); }
  uint64_t elements() const { return Count(sums_[kElements]); }
  // This rank's own gradient counts, unweighted: what its rank-scoped record
  // and per-tensor report describe.
  int64_t local_nonfinite() const { return local_nonfinite_; }
  int64_t local_elements() const { return local_elements_; }

  // The server's rules this rank holds, as a hash in [1, 2^31] (0: none
  // yet), carried in the step's collective so that every rank switches to
  // them at the same step (agent.h): set before the reduction.
  void SetRulesHash(uint32_t hash) {
    maxes_[kRulesHash] = static_cast<double>(hash);
    maxes_[kRulesHashNegated] = -static_cast<double>(hash);
  }
  // After the reduction: the hash when every rank holds the same server
  // rules (its minimum equals its maximum and is not 0), else 0.
  uint32_t AgreedRulesHash() const {
    const double max = maxes_[kRulesHash], min = -maxes_[kRulesHashNegated];
    return max == min && min > 0 ? static_cast<uint32_t>(min) : 0;
  }

 private:
  enum SumIndex {
    kSumSq, kNonfinite, kElements, kHasGrad, kLossSum, kLossCount, kLossNonfinite,
    kLogZSum, kLogZRows, kLogZNonfinite, kNumSums
  };
  enum MaxIndex {
    kLr, kZLoss, kActMax, kAttnP99, kHasLr, kHasZLoss, kHasAct, kHasAttn,
    kLossScale, kHasLossScale, kLossScaleOverflow,
    // The minimum over ranks is the maximum of the negated values: the
    // reducer has sums and maxes only.
    kRulesHash, kRulesHashNegated, kNumMaxes
  };

  static uint64_t Count(double weighted) {
    return static_cast<uint64_t>(std::llround(std::max(weighted, 0.0)));
  }

  std::array<double, kNumSums> sums_{};
  std::array<double, kNumMaxes> maxes_;
  int64_t local_nonfinite_ = 0, local_elements_ = 0;
};

// Every rank's shard ids (at most kPerRank each) through the reducer's sum:
// each rank fills its own row of a zero matrix, ids split in 32-bit halves
// so that doubles carry them exactly.
class ShardGather {
 public:
  static constexpr size_t kPerRank = 16;

  // REQUIRES: 0 <= rank < world_size.
  ShardGather(int rank, int world_size, absl::Span<const uint64_t> mine);

  absl::Span<double> sums() { return absl::MakeSpan(sums_); }
  absl::Span<double> maxes() { return absl::MakeSpan(maxes_); }

  // After the sum: every rank's ids, sorted, without repeats.
  std::vector<uint64_t> Ids() const;

 private:
  static constexpr size_t kStride = 1 + 2 * kPerRank;
  int world_size_;
  std::vector<double> sums_;
  std::array<double, 1> maxes_{};  // the collective takes both; nothing to max
};

}  // namespace trainwatch::agent::internal

#endif  // TRAINWATCH_AGENT_SRC_REDUCTION_LAYOUT_H_
