// One simulated agent stream (AgentService.Stream on the callback client
// API) and the counters every stream of a load reports into.

#ifndef TRAINWATCH_BENCH_INGEST_AGENT_STREAM_H_
#define TRAINWATCH_BENCH_INGEST_AGENT_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "latency_histogram.h"
#include "stream_plan.h"
#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::bench {

// The clock of schedules and latencies.
int64_t MonotonicNanos();

// What every stream reports into. Thread-safe: counters are atomics, the
// rest is behind mu.
struct LoadCounters {
  LatencyHistogram latency;
  std::atomic<uint64_t> records_sent{0};
  std::atomic<uint64_t> records_acked{0};
  std::atomic<uint64_t> heartbeats_sent{0};
  std::atomic<uint64_t> ack_messages{0};
  std::atomic<uint64_t> acks_ahead_of_sends{0};
  std::atomic<int64_t> last_ack_ns{0};
  std::atomic<int64_t> max_schedule_lag_ns{0};

  absl::Mutex mu;
  // Sending streams whose every record is acknowledged.
  int complete_streams ABSL_GUARDED_BY(mu) = 0;
  // Sending streams that ended before that.
  int failed_sending_streams ABSL_GUARDED_BY(mu) = 0;
  // Streams whose OnDone has run.
  int done_streams ABSL_GUARDED_BY(mu) = 0;
  int stream_errors ABSL_GUARDED_BY(mu) = 0;
  std::string first_error ABSL_GUARDED_BY(mu);
};

// One agent stream.
//
// Thread-safety: reactions run on gRPC's threads and Drive() also runs on
// the pacing and main threads; the stream's state is behind mu_. At most one
// write is in flight; the message it writes (out_) belongs to the writer
// until OnWriteDone. A hold keeps the call alive while threads other than
// reactions may still start operations; it is removed exactly once, when
// the stream will start nothing more (WritesDone started, or the stream is
// dead), so no operation is ever started after OnDone.
//
// The object outlives the call: the generator destroys it only after OnDone
// and after the pacing thread has stopped.
class AgentStream final
    : public grpc::ClientBidiReactor<trainwatch::v1::AgentMessage, trainwatch::v1::ServerMessage> {
 public:
  AgentStream(StreamPlan plan, LoadCounters* counters);

  bool sends_records() const { return plan_.steps > 0; }

  // Opens the call and sends the Hello. Called once, before Drive().
  void Start(trainwatch::v1::AgentService::Stub* stub, const std::string& token);

  // Starts the next write if one is due and the stream is free. Safe from
  // any thread, any number of times, also after the call has ended.
  void Drive(int64_t now_ns);

  // Asks the stream to half-close once its write in flight is done.
  void RequestClose();

  // Ends the call at once; OnDone follows promptly.
  void Cancel();

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  enum class Op { kNone, kWrite, kWritesDone };

  // Decides the next operation and, for a write, fills out_ and says whether
  // it may be buffered.
  Op NextOpLocked(int64_t now_ns, bool* release_hold, bool* buffer_hint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool BufferHintLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleAck(const trainwatch::v1::DurabilityAck& ack, int64_t now_ns);

  const StreamPlan plan_;
  LoadCounters* const counters_;
  grpc::ClientContext context_;
  // Owned by the read in flight (one at a time, serialised by gRPC).
  trainwatch::v1::ServerMessage in_;

  absl::Mutex mu_;
  trainwatch::v1::AgentMessage out_ ABSL_GUARDED_BY(mu_);
  // Send times of the in-flight records, indexed by step % size.
  std::vector<int64_t> sent_at_ns_ ABSL_GUARDED_BY(mu_);
  int64_t next_step_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t last_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t acked_step_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_heartbeat_ns_ ABSL_GUARDED_BY(mu_) = 0;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_AGENT_STREAM_H_
