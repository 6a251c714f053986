#include "ingest/step_aggregation.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace trainwatch::server {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
using core::Signal;
}  // namespace

bool StepAggregate::Add(int32_t rank, const wire::ReportedStep& report) {
  if (static_cast<size_t>(rank) >= seen_.size()) seen_.resize(static_cast<size_t>(rank) + 1);
  if (seen_[rank]) return false;
  seen_[rank] = true;
  ++count_;
  Merge(report);
  return true;
}

void StepAggregate::Merge(const wire::ReportedStep& r) {
  if (r.Has(Signal::kLoss)) {
    if (std::isfinite(r.Get(Signal::kLoss))) {
      loss_sum_ += r.Get(Signal::kLoss);
      ++loss_n_;
    } else {
      loss_nonfinite_ = true;
    }
  }
  if (r.Has(Signal::kLogZ)) {
    if (std::isfinite(r.Get(Signal::kLogZ))) {
      logz_sum_ += r.Get(Signal::kLogZ);
      ++logz_n_;
    } else {
      logz_nonfinite_ = true;
    }
  }
  if (r.Has(Signal::kGradNorm)) {
    grad_seen_ = true;
    if (std::isfinite(r.Get(Signal::kGradNorm))) {
      grad_max_ = std::max(grad_max_, r.Get(Signal::kGradNorm));
    } else {
      grad_nonfinite_ = true;
    }
  }
  if (r.elements > 0) {
    counts_seen_ = true;
    nonfinite_ += static_cast<int64_t>(r.nonfinite);
    elements_ += static_cast<int64_t>(r.elements);
  } else if (r.Has(Signal::kNanFrac)) {
    const double f = r.Get(Signal::kNanFrac);
    nan_frac_max_ = std::isfinite(f) ? std::max(nan_frac_max_, f) : 1.0;
  }
  for (Signal s : {Signal::kLearningRate, Signal::kZLossAlpha}) {
    if (r.Has(s)) extras_.Set(s, r.Get(s));
  }
  // Absent maxima start below every value.
  auto max_of = [this](Signal s, double v) {
    const double prev =
        extras_.Has(s) ? extras_.Get(s) : -std::numeric_limits<double>::infinity();
    extras_.Set(s, std::isfinite(v) || s == Signal::kActivationMax ? std::max(prev, v) : v);
  };
  for (Signal s : {Signal::kActivationMax, Signal::kAttentionLogitP99}) {
    if (r.Has(s)) max_of(s, r.Get(s));
  }
  // As the agent reduces them: the largest scale, any rank's overflow.
  if (r.HasLossScale()) {
    const double scale = extras_.HasLossScale() ? std::max(extras_.loss_scale(), r.loss_scale())
                                                : r.loss_scale();
    extras_.SetLossScale(scale, extras_.loss_scale_overflow() || r.loss_scale_overflow());
  }
  shards_.insert(r.shards.begin(), r.shards.end());
  // Each report is bounded (agent_message_checks.h); their union is held to
  // the same bound, so that a step of many ranks does not multiply it.
  for (const std::string& name : r.shard_names) {
    if (shard_names_.size() >= core::kMaxShardNamesPerRecord) break;
    shard_names_.insert(name);
  }
}

StepRow StepAggregate::Finish(int64_t step, int32_t world_size, size_t max_text) const {
  StepRow s;
  static_cast<core::StepValues&>(s) = extras_;
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
    s.nonfinite = static_cast<uint64_t>(nonfinite_);
    s.elements = static_cast<uint64_t>(elements_);
    s.Set(Signal::kNanFrac, elements_ > 0 ? static_cast<double>(nonfinite_) /
                                                static_cast<double>(elements_)
                                          : 0.0);
  } else if (nan_frac_max_ >= 0) {
    s.Set(Signal::kNanFrac, nan_frac_max_);
  }
  s.shards.assign(shards_.begin(), shards_.end());
  s.shard_names.assign(shard_names_.begin(), shard_names_.end());
  s.missing_ranks = MissingRanksText(seen_, world_size, max_text);
  return s;
}

std::string MissingRanksText(const std::vector<bool>& seen, int32_t world_size,
                             size_t max_text) {
  std::string text;
  int64_t missing = 0;
  bool cut = false;
  // Ranks from seen.size() up are one range: the walk is over the ranks
  // that reported, not over the world.
  const int32_t known = static_cast<int32_t>(std::min<size_t>(seen.size(), world_size));
  int32_t r = 0;
  while (r < world_size) {
    if (r < known && seen[r]) {
      ++r;
      continue;
    }
    int32_t last = r;
    if (r >= known) {
      last = world_size - 1;
    } else {
      while (last + 1 < known && !seen[last + 1]) ++last;
      if (last + 1 == known && known < world_size) last = world_size - 1;
    }
    missing += int64_t{last} - r + 1;
    if (!cut) {
      std::string range = last == r ? absl::StrCat(r) : absl::StrCat(r, "-", last);
      if (text.size() + range.size() + 1 > max_text) {
        cut = true;
      } else {
        absl::StrAppend(&text, text.empty() ? "" : ",", range);
      }
    }
    r = last + 1;
  }
  if (cut) absl::StrAppend(&text, " and more: ", missing, " missing");
  return text;
}

StepRow GlobalStep(const wire::ReportedStep& report) {
  StepAggregate a(0);
  a.Add(0, report);
  StepRow s = a.Finish(report.step, 0);
  if (report.elements == 0 && report.Has(Signal::kNanFrac)) {
    s.Set(Signal::kNanFrac, report.Get(Signal::kNanFrac));
  }
  return s;
}

}  // namespace trainwatch::server
