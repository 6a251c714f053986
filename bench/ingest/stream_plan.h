// What each simulated agent stream of a load does: which run and rank it
// plays, how many records it sends and on what schedule. Pure: no gRPC.

#ifndef TRAINWATCH_BENCH_INGEST_STREAM_PLAN_H_
#define TRAINWATCH_BENCH_INGEST_STREAM_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "load_generator.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::bench {

struct StreamPlan {
  std::string run_id;
  int run_index = 0;
  int rank = 0;
  int world_size = 1;
  // Zero for a stream that only heartbeats.
  int64_t steps = 0;
  trainwatch::v1::ReportScope scope = trainwatch::v1::REPORT_SCOPE_GLOBAL;
  // The key of durable_step that covers this stream's records.
  int32_t ack_key = 0;
  // Schedule: step s is due at first_due_ns + (s - 1) * interval_ns;
  // interval_ns == 0 means unpaced.
  int64_t first_due_ns = 0;
  int64_t interval_ns = 0;
  int64_t heartbeat_interval_ns = 0;
  int window = 1;
};

// Streams that send records: every rank with per_rank, else rank 0 of each
// run. The config must be valid (ValidateConfig).
int SendingStreams(const LoadConfig& config);

// Time between two records of one sending stream, so that all of them add
// up to config.rate; 0 for an unpaced load.
int64_t PacingIntervalNs(const LoadConfig& config);

// One plan per stream, runs x ranks in run-major order. Run ids are
// "<run_prefix>-<run>"; paced streams are staggered evenly over one interval
// from start_ns.
std::vector<StreamPlan> PlanStreams(const LoadConfig& config, const std::string& run_prefix,
                                    int64_t start_ns);

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_STREAM_PLAN_H_
