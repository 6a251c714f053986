// A load generator for the agent ingest (AgentService.Stream).
//
// It plays runs x ranks agents, one stream each, all from one process:
//   * every stream sends a Hello, then heartbeats on a timer;
//   * without per_rank, rank 0 of each run sends the run's REPORT_SCOPE_GLOBAL
//     record for steps 1..steps and the other ranks only heartbeat; with
//     per_rank, every rank sends its own REPORT_SCOPE_RANK records;
//   * records go out as fast as the stream allows (rate 0) or on a fixed
//     schedule that adds up to `rate` records/s over all sending streams;
//   * a stream never has more than `window` records sent and not yet
//     acknowledged, which bounds the generator's memory and lets the send
//     time of each in-flight record live in a ring indexed by step.
// The latency of a record runs from the moment it is handed to gRPC to the
// arrival of the first DurabilityAck whose step for that stream's key (rank 0
// for global records, the rank for per-rank records) covers it.
//
// Streams use the callback client API: reactions run on gRPC's own threads,
// plus one pacing thread for schedules and heartbeats, whatever the number
// of streams. They are spread over several channels, each with its own
// connection, as separate trainer processes would be.

#ifndef TRAINWATCH_BENCH_INGEST_LOAD_GENERATOR_H_
#define TRAINWATCH_BENCH_INGEST_LOAD_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "latency_histogram.h"

namespace trainwatch::bench {

struct LoadConfig {
  // "127.0.0.1:PORT"; nothing else is accepted.
  std::string target;
  int runs = 1;
  int ranks_per_run = 1;
  // Steps per sending stream, numbered 1..steps.
  int64_t steps = 1000;
  bool per_rank = false;
  // Records per second over all streams; 0 sends as fast as possible.
  double rate = 0;
  // Sent as "authorization: Bearer <token>" when not empty.
  std::string token;
  // Time allowed from the first record to the last acknowledgement.
  absl::Duration duration_limit = absl::Seconds(60);
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Most records a stream has sent and not yet seen acknowledged.
  int window = 8192;
  // Connections to open; 0 picks one per 50 streams, at least 8 (never more
  // than the streams).
  int channels = 0;
  // Run ids are "<run_prefix>-<index>"; empty picks a prefix unique to this
  // process, so runs never collide with an earlier invocation's in a
  // persistent store.
  std::string run_prefix;
};

struct LoadResult {
  std::string target;
  int streams = 0;
  int sending_streams = 0;
  int channels = 0;
  uint64_t records_planned = 0;
  uint64_t records_sent = 0;
  uint64_t records_acked = 0;
  uint64_t heartbeats_sent = 0;
  uint64_t ack_messages = 0;
  // Acks that named a step beyond what the stream had sent (a server bug).
  uint64_t acks_ahead_of_sends = 0;
  // From the first stream's start to the last acknowledgement (or to the
  // moment the generator gave up).
  double wall_seconds = 0;
  // records_acked / wall_seconds.
  double records_per_second = 0;
  LatencySummary latency;
  // Paced runs only: how far behind its schedule a record went out, at
  // worst. Large values mean the server (or flow control) held the
  // generator back, and latencies then understate what an agent would see.
  int64_t max_schedule_lag_ns = 0;
  // Streams that ended with an error or before all their records were
  // acknowledged.
  int stream_errors = 0;
  std::string first_error;
  bool complete = false;
  bool timed_out = false;
  bool aborted = false;
  int64_t generator_peak_rss_bytes = -1;
};

// Returns the port of a "127.0.0.1:PORT" target, or an error naming what is
// wrong with it (any other host is refused: this tool must not load a shared
// or remote server by accident).
absl::StatusOr<int> ParseLoopbackTarget(absl::string_view target);

// Checks a configuration's bounds (counts, times, the target).
absl::Status ValidateConfig(const LoadConfig& config);

// Runs the load to completion, to the duration limit, or until should_abort
// (polled every few milliseconds from the calling thread; may be empty)
// returns true. Returns an error only when the load could not start
// (invalid configuration, no connection); an incomplete load is a result
// with complete == false.
absl::StatusOr<LoadResult> RunLoad(const LoadConfig& config,
                                   const std::function<bool()>& should_abort);

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_LOAD_GENERATOR_H_
