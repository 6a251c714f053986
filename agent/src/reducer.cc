#include "trainwatch/agent/reducer.h"

#include <algorithm>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace trainwatch::agent {

// Each rank deposits its vectors; the last to arrive reduces them in rank
// order (so the sum's rounding is the same whatever the arrival order) and
// publishes one result that every rank copies.
struct InProcessGroup::Shared {
  explicit Shared(int n) : world(n), sums(n), maxes(n) {}
  absl::Mutex mu;
  const int world;
  int arrived ABSL_GUARDED_BY(mu) = 0;
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::vector<double>> sums ABSL_GUARDED_BY(mu), maxes ABSL_GUARDED_BY(mu);
  std::vector<double> sum_result ABSL_GUARDED_BY(mu), max_result ABSL_GUARDED_BY(mu);
};

namespace {

class GroupReducer : public Reducer {
 public:
  GroupReducer(std::shared_ptr<InProcessGroup::Shared> shared, int rank)
      : shared_(std::move(shared)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return shared_->world; }

  absl::Status AllReduce(absl::Span<double> sums, absl::Span<double> maxes) override {
    auto& s = *shared_;
    absl::MutexLock lock(&s.mu);
    const uint64_t gen = s.generation;
    s.sums[rank_].assign(sums.begin(), sums.end());
    s.maxes[rank_].assign(maxes.begin(), maxes.end());
    if (++s.arrived == s.world) {
      s.sum_result.assign(sums.size(), 0.0);
      s.max_result.assign(maxes.begin(), maxes.end());
      for (int r = 0; r < s.world; ++r) {
        if (s.sums[r].size() != sums.size() || s.maxes[r].size() != maxes.size()) {
          return absl::InvalidArgumentError("ranks reduced vectors of different sizes");
        }
        for (size_t i = 0; i < sums.size(); ++i) s.sum_result[i] += s.sums[r][i];
        for (size_t i = 0; i < maxes.size(); ++i) {
          // NaN wins a max: a nonfinite value anywhere must be seen everywhere.
          const double v = s.maxes[r][i];
          if (v != v || v > s.max_result[i]) s.max_result[i] = v;
        }
      }
      s.arrived = 0;
      ++s.generation;
    } else {
      auto published = [&s, gen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
        return s.generation != gen;
      };
      s.mu.Await(absl::Condition(&published));
    }
    std::copy(s.sum_result.begin(), s.sum_result.end(), sums.begin());
    std::copy(s.max_result.begin(), s.max_result.end(), maxes.begin());
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<InProcessGroup::Shared> shared_;
  int rank_;
};

}  // namespace

InProcessGroup::InProcessGroup(int world_size)
    : shared_(std::make_shared<Shared>(world_size)) {}
InProcessGroup::~InProcessGroup() = default;

std::unique_ptr<Reducer> InProcessGroup::ReducerFor(int rank) {
  return std::make_unique<GroupReducer>(shared_, rank);
}

}  // namespace trainwatch::agent
