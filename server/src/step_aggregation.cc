#include "step_aggregation.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_join.h"

namespace trainwatch::server {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
using core::Signal;
}  // namespace

bool StepAggregate::Add(int32_t rank, const trainwatch::v1::StepReport& report) {
  if (static_cast<size_t>(rank) >= seen_.size()) seen_.resize(static_cast<size_t>(rank) + 1);
  if (seen_[rank]) return false;
  seen_[rank] = true;
  ++count_;
  Merge(report);
  return true;
}

void StepAggregate::Merge(const trainwatch::v1::StepReport& r) {
  const auto& m = r.metrics();
  if (m.has_loss()) {
    if (std::isfinite(m.loss())) {
      loss_sum_ += m.loss();
      ++loss_n_;
    } else {
      loss_nonfinite_ = true;
    }
  }
  if (m.has_log_z()) {
    if (std::isfinite(m.log_z())) {
      logz_sum_ += m.log_z();
      ++logz_n_;
    } else {
      logz_nonfinite_ = true;
    }
  }
  if (m.has_grad_norm()) {
    grad_seen_ = true;
    if (std::isfinite(m.grad_norm())) {
      grad_max_ = std::max(grad_max_, m.grad_norm());
    } else {
      grad_nonfinite_ = true;
    }
  }
  if (r.element_count() > 0) {
    counts_seen_ = true;
    nonfinite_ += static_cast<int64_t>(r.nonfinite_count());
    elements_ += static_cast<int64_t>(r.element_count());
  } else if (m.has_nan_frac()) {
    nan_frac_max_ = std::isfinite(m.nan_frac()) ? std::max(nan_frac_max_, m.nan_frac()) : 1.0;
  }
  if (r.has_learning_rate()) extras_.Set(Signal::kLearningRate, r.learning_rate());
  if (r.has_z_loss_alpha()) extras_.Set(Signal::kZLossAlpha, r.z_loss_alpha());
  // Absent maxima start below every value.
  auto max_of = [this](Signal s, double v) {
    const double prev =
        extras_.Has(s) ? extras_.Get(s) : -std::numeric_limits<double>::infinity();
    extras_.Set(s, std::isfinite(v) || s == Signal::kActivationMax ? std::max(prev, v) : v);
  };
  if (r.has_activation_max()) max_of(Signal::kActivationMax, r.activation_max());
  for (double v : r.attention_logit_p99()) max_of(Signal::kAttentionLogitP99, v);
  for (uint64_t s : r.shard_ids()) shards_.insert(s);
}

StepRow StepAggregate::Finish(int64_t step, int32_t world_size) const {
  StepRow s = extras_;
  s.step = step;
  if (loss_nonfinite_) {
    s.Set(Signal::kLoss, kNaN);
  } else if (loss_n_ > 0) {
    s.Set(Signal::kLoss, loss_sum_ / loss_n_);
  }
  if (logz_nonfinite_) {
    s.Set(Signal::kLogZ, kNaN);
  } else if (logz_n_ > 0) {
    s.Set(Signal::kLogZ, logz_sum_ / logz_n_);
  }
  if (grad_seen_) s.Set(Signal::kGradNorm, grad_nonfinite_ ? kNaN : grad_max_);
  if (counts_seen_) {
    s.nonfinite = nonfinite_;
    s.elements = elements_;
    s.Set(Signal::kNanFrac, elements_ > 0 ? static_cast<double>(nonfinite_) /
                                                static_cast<double>(elements_)
                                          : 0.0);
  } else if (nan_frac_max_ >= 0) {
    s.Set(Signal::kNanFrac, nan_frac_max_);
  }
  s.shards.assign(shards_.begin(), shards_.end());
  std::vector<int32_t> missing;
  for (int32_t r = 0; r < world_size; ++r) {
    if (static_cast<size_t>(r) >= seen_.size() || !seen_[r]) missing.push_back(r);
  }
  s.missing_ranks = absl::StrJoin(missing, ",");
  return s;
}

StepRow GlobalStep(const trainwatch::v1::StepReport& report) {
  StepAggregate a(0);
  a.Add(0, report);
  StepRow s = a.Finish(report.step(), 0);
  if (report.element_count() == 0 && report.metrics().has_nan_frac()) {
    s.Set(Signal::kNanFrac, report.metrics().nan_frac());
  }
  return s;
}

}  // namespace trainwatch::server
