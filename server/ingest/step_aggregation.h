// Cross-rank aggregation of one step, for runs whose ranks each stream their
// own record (REPORT_SCOPE_RANK): a step completes when every rank reported
// or after the aggregation timeout, and the ranks that did not are named.
//
// The rules: loss and log_z are means over the ranks that reported a finite
// value (one nonfinite value makes the mean NaN), grad_norm the maximum (a
// rank whose gradients explode shows), nonfinite and element counts sums
// (nan_frac is their ratio; without counts, the largest nan_frac), the
// activation maximum and the attention-logit p99 their maxima, shard ids the
// union.
//
// Pure: no clock, no store, no threads, no wire messages.

#ifndef TRAINWATCH_SERVER_STEP_AGGREGATION_H_
#define TRAINWATCH_SERVER_STEP_AGGREGATION_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "store/store.h"
#include "trainwatch/core/shard_names.h"
#include "trainwatch/wire/step_report.h"

namespace trainwatch::server {

class StepAggregate {
 public:
  // `first_ms`: when the step's first record arrived, for the timeout.
  explicit StepAggregate(int64_t first_ms) : first_ms_(first_ms) {}

  // Merges `rank`'s record. False, and nothing merged, when that rank
  // already reported this step. REQUIRES: 0 <= rank.
  bool Add(int32_t rank, const wire::ReportedStep& report);

  int32_t count() const { return count_; }
  int64_t first_ms() const { return first_ms_; }

  // The merged record of `step`; ranks below `world_size` that did not
  // report are listed in missing_ranks as ranges ("3,7-9"), cut to at most
  // `max_text` characters (see MissingRanksText). Costs O(highest rank
  // reported), not O(world_size).
  StepRow Finish(int64_t step, int32_t world_size,
                 size_t max_text = kMaxMissingRanksText) const;

  // The longest missing_ranks text: a world of 1,000,000 ranks with one
  // reporting is "1-999999", and the worst pattern (every other rank) stays
  // a line of a log, not megabytes.
  static constexpr size_t kMaxMissingRanksText = 256;

 private:
  void Merge(const wire::ReportedStep& r);

  int64_t first_ms_;
  std::vector<bool> seen_;
  int32_t count_ = 0;
  double loss_sum_ = 0, logz_sum_ = 0;
  int loss_n_ = 0, logz_n_ = 0;
  bool loss_nonfinite_ = false, logz_nonfinite_ = false;
  double grad_max_ = -1;
  bool grad_seen_ = false, grad_nonfinite_ = false;
  int64_t nonfinite_ = 0, elements_ = 0;
  bool counts_seen_ = false;
  double nan_frac_max_ = -1;
  core::StepValues extras_;  // lr, z-loss, activation max, attention p99
  std::set<uint64_t> shards_;
  std::set<std::string> shard_names_;  // at most core::kMaxShardNamesPerRecord
};

// The ranks below `world_size` that `seen` does not mark, as ranges
// ("0,3-5,9"); when longer than `max_text`, the ranges that fit followed by
// " and more: N missing" (N all of them), so the text never exceeds
// max_text + 32 characters.
std::string MissingRanksText(const std::vector<bool>& seen, int32_t world_size,
                             size_t max_text);

// The stored form of a record that rank 0 reduced itself
// (REPORT_SCOPE_GLOBAL): the same conversion, with nan_frac as reported when
// the record carries no counts.
StepRow GlobalStep(const wire::ReportedStep& report);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_STEP_AGGREGATION_H_
