#include "trainwatch/agent/reducer.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace trainwatch::agent {

// Each rank deposits its vectors; the last to arrive reduces them in rank
// order (so the sum's rounding is the same whatever the arrival order) and
// publishes one result that every rank copies.
struct InProcessGroup::Shared {
  explicit Shared(int n) : world(n), sums(n), maxes(n) {}
  std::mutex mu;
  std::condition_variable cv;
  int world;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<std::vector<double>> sums, maxes;
  std::vector<double> sum_result, max_result;
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
    std::unique_lock<std::mutex> lock(s.mu);
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
      s.cv.notify_all();
    } else {
      s.cv.wait(lock, [&] { return s.generation != gen; });
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
