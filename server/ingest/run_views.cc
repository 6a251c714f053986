#include "ingest/run_views.h"

#include <utility>

namespace trainwatch::server {

std::vector<RunView> RunViews::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<RunView> out;
  out.reserve(views_.size());
  for (const auto& [id, v] : views_) {
    out.push_back(v);
    if (auto l = liveness_.find(id); l != liveness_.end()) out.back().liveness = l->second;
  }
  return out;
}

std::optional<RunView> RunViews::Get(const std::string& run_id) const {
  absl::MutexLock lock(&mu_);
  auto it = views_.find(run_id);
  if (it == views_.end()) return std::nullopt;
  RunView v = it->second;
  if (auto l = liveness_.find(run_id); l != liveness_.end()) v.liveness = l->second;
  return v;
}

IngestStats RunViews::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void RunViews::Set(const std::string& run_id, RunView view) {
  absl::MutexLock lock(&mu_);
  views_[run_id] = std::move(view);
}

void RunViews::SetLiveness(const std::string& run_id, LivenessView liveness) {
  absl::MutexLock lock(&mu_);
  if (liveness.ranks_alive == 0 && !liveness.ended) {
    liveness_.erase(run_id);
  } else {
    liveness_[run_id] = std::move(liveness);
  }
}

void RunViews::Erase(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  views_.erase(run_id);
  liveness_.erase(run_id);
}

void RunViews::Count(int64_t IngestStats::*counter, int64_t n) {
  absl::MutexLock lock(&mu_);
  stats_.*counter += n;
}

void RunViews::Edit(const Editor& edit) {
  absl::MutexLock lock(&mu_);
  edit(views_, stats_);
}

}  // namespace trainwatch::server
