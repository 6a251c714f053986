#include "reduction_layout.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"

namespace trainwatch::agent::internal {

using core::Signal;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

}  // namespace trainwatch::agent::internal

namespace trainwatch::agent {

absl::Status CheckGradLayout(const StepInput& in, int world_size) {
  if (in.grad_groups.empty()) return absl::OkStatus();
  if (in.grad_sum_squares.has_value() || in.grad_nonfinite != 0 || in.grad_elements != 0) {
    return absl::InvalidArgumentError(
        "step: gradient statistics given both as grad_sum_squares/grad_nonfinite/"
        "grad_elements and as grad_groups; give one");
  }
  for (size_t i = 0; i < in.grad_groups.size(); ++i) {
    const GradGroup& g = in.grad_groups[i];
    if (g.copies < 1 || g.copies > world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("step: grad_groups[", i, "].copies is ", g.copies,
                       "; a gradient has 1 to world_size (", world_size, ") copies"));
    }
    if (g.elements < 0 || g.nonfinite < 0 || g.nonfinite > g.elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("step: grad_groups[", i, "] has ", g.nonfinite, " nonfinite of ",
                       g.elements, " elements; needs 0 <= nonfinite <= elements"));
    }
  }
  return absl::OkStatus();
}

}  // namespace trainwatch::agent

namespace trainwatch::agent::internal {

StepReduction::StepReduction(const StepInput& in) {
  maxes_.fill(-std::numeric_limits<double>::infinity());
  if (in.grad_sum_squares.has_value()) {
    sums_[kSumSq] = *in.grad_sum_squares;
    sums_[kHasGrad] = 1;
  }
  sums_[kNonfinite] = static_cast<double>(in.grad_nonfinite);
  sums_[kElements] = static_cast<double>(in.grad_elements);
  local_nonfinite_ = in.grad_nonfinite;
  local_elements_ = in.grad_elements;
  // Each copy contributes its share, so the world's sum counts the gradient
  // once. The counts' shares are fractions; Count() rounds the sum.
  for (const GradGroup& g : in.grad_groups) {
    const double share = 1.0 / g.copies;
    sums_[kSumSq] += g.sum_squares * share;
    sums_[kNonfinite] += static_cast<double>(g.nonfinite) * share;
    sums_[kElements] += static_cast<double>(g.elements) * share;
    sums_[kHasGrad] = 1;
    local_nonfinite_ += g.nonfinite;
    local_elements_ += g.elements;
  }
  if (in.loss.has_value()) {
    if (std::isfinite(*in.loss)) {
      sums_[kLossSum] = *in.loss;
      sums_[kLossCount] = 1;
    } else {
      sums_[kLossNonfinite] = 1;
    }
  }
  if (in.log_z_rows > 0) {
    if (std::isfinite(in.log_z_sum)) {
      sums_[kLogZSum] = in.log_z_sum;
      sums_[kLogZRows] = static_cast<double>(in.log_z_rows);
    } else {
      sums_[kLogZNonfinite] = 1;
    }
  }
  auto put = [&](const std::optional<double>& v, MaxIndex idx, MaxIndex has) {
    if (v.has_value()) {
      maxes_[idx] = *v;
      maxes_[has] = 1;
    }
  };
  put(in.learning_rate, kLr, kHasLr);
  put(in.z_loss_alpha, kZLoss, kHasZLoss);
  put(in.activation_max, kActMax, kHasAct);
  put(in.attention_logit_p99, kAttnP99, kHasAttn);
  put(in.loss_scale, kLossScale, kHasLossScale);
  maxes_[kLossScaleOverflow] = in.loss_scale_overflow ? 1 : 0;
  SetRulesHash(0);
  // A max over NaN is not defined the same way by every collective (NCCL's
  // is not): a nonfinite value travels as +inf, still nonfinite, still seen.
  for (double& m : maxes_) {
    if (std::isnan(m)) m = std::numeric_limits<double>::infinity();
  }
}

core::StepValues StepReduction::Values() const {
  core::StepValues v;
  if (sums_[kLossNonfinite] > 0) {
    v.Set(Signal::kLoss, kNaN);
  } else if (sums_[kLossCount] > 0) {
    v.Set(Signal::kLoss, sums_[kLossSum] / sums_[kLossCount]);
  }
  if (sums_[kHasGrad] > 0) v.Set(Signal::kGradNorm, std::sqrt(sums_[kSumSq]));
  if (elements() > 0) {
    v.Set(Signal::kNanFrac, static_cast<double>(nonfinite()) / static_cast<double>(elements()));
  }
  if (sums_[kLogZNonfinite] > 0) {
    v.Set(Signal::kLogZ, kNaN);
  } else if (sums_[kLogZRows] > 0) {
    v.Set(Signal::kLogZ, sums_[kLogZSum] / sums_[kLogZRows]);
  }
  if (maxes_[kHasLr] > 0) v.Set(Signal::kLearningRate, maxes_[kLr]);
  if (maxes_[kHasZLoss] > 0) v.Set(Signal::kZLossAlpha, maxes_[kZLoss]);
  if (maxes_[kHasAct] > 0) v.Set(Signal::kActivationMax, maxes_[kActMax]);
  if (maxes_[kHasAttn] > 0) v.Set(Signal::kAttentionLogitP99, maxes_[kAttnP99]);
  if (maxes_[kHasLossScale] > 0) v.SetLossScale(maxes_[kLossScale], maxes_[kLossScaleOverflow] > 0);
  return v;
}

ShardGather::ShardGather(int rank, int world_size, absl::Span<const uint64_t> mine)
    : world_size_(world_size), sums_(static_cast<size_t>(world_size) * kStride, 0.0) {
  const size_t n = std::min(mine.size(), kPerRank);
  double* row = sums_.data() + static_cast<size_t>(rank) * kStride;
  row[0] = static_cast<double>(n);
  for (size_t i = 0; i < n; ++i) {
    row[1 + 2 * i] = static_cast<double>(mine[i] >> 32);
    row[2 + 2 * i] = static_cast<double>(mine[i] & 0xffffffffu);
  }
}

std::vector<uint64_t> ShardGather::Ids() const {
  std::vector<uint64_t> all;
  for (int r = 0; r < world_size_; ++r) {
    const double* row = sums_.data() + static_cast<size_t>(r) * kStride;
    const size_t count = std::min(kPerRank, static_cast<size_t>(row[0]));
    for (size_t i = 0; i < count; ++i) {
      all.push_back((static_cast<uint64_t>(row[1 + 2 * i]) << 32) |
                    static_cast<uint64_t>(row[2 + 2 * i]));
    }
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

}  // namespace trainwatch::agent::internal
