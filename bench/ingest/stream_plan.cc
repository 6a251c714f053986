#include "stream_plan.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace trainwatch::bench {

int SendingStreams(const LoadConfig& config) {
  return config.per_rank ? config.runs * config.ranks_per_run : config.runs;
}

int64_t PacingIntervalNs(const LoadConfig& config) {
  if (config.rate <= 0) return 0;
  return static_cast<int64_t>(std::llround(1e9 * SendingStreams(config) / config.rate));
}

std::vector<StreamPlan> PlanStreams(const LoadConfig& config, const std::string& run_prefix,
                                    int64_t start_ns) {
  const int sending_streams = SendingStreams(config);
  const int64_t interval_ns = PacingIntervalNs(config);
  std::vector<StreamPlan> plans;
  plans.reserve(static_cast<size_t>(config.runs) * config.ranks_per_run);
  int sending_index = 0;
  for (int run = 0; run < config.runs; ++run) {
    for (int rank = 0; rank < config.ranks_per_run; ++rank) {
      StreamPlan plan;
      plan.run_id = absl::StrCat(run_prefix, "-", run);
      plan.run_index = run;
      plan.rank = rank;
      plan.world_size = config.ranks_per_run;
      plan.window = config.window;
      plan.heartbeat_interval_ns = absl::ToInt64Nanoseconds(config.heartbeat_interval);
      if (config.per_rank || rank == 0) {
        plan.steps = config.steps;
        plan.scope = config.per_rank ? trainwatch::v1::REPORT_SCOPE_RANK
                                     : trainwatch::v1::REPORT_SCOPE_GLOBAL;
        plan.ack_key = config.per_rank ? rank : 0;
        plan.interval_ns = interval_ns;
        // Stagger the streams evenly over one interval.
        plan.first_due_ns =
            interval_ns > 0 ? start_ns + interval_ns * sending_index / sending_streams : 0;
        ++sending_index;
      }
      plans.push_back(std::move(plan));
    }
  }
  return plans;
}

}  // namespace trainwatch::bench
