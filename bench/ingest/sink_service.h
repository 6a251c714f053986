// A do-nothing AgentService: it stores nothing and acknowledges step reports
// as durable, in one of two ways (SinkOptions::ack):
//   kPerRecord: the moment each report arrives, on the stream's own gRPC
//     thread. The cheapest possible server, but it writes far more acks than
//     trainwatchd (one per write slot rather than one per committed batch),
//     so it is no fair upper bound: its cost is mostly ack traffic.
//   kBatch: exactly as trainwatchd acknowledges, without the store. Streams
//     hand every message to one writer thread without waiting (trainwatchd's
//     Ingestor::Submit); the writer takes everything queued, up to
//     max_batch_items, waking at least every 50 ms, and a batch of fewer
//     than 1,000 waits for more until commit_interval_ms after the previous
//     one began (IngestQueue::Take and LingerForMore); it keeps
//     the highest step per (stream, key) of the batch, and after the batch
//     ("commit": nothing) tells each stream, which writes one DurabilityAck
//     naming the batch's steps (ServiceState::OnDurable,
//     AgentStream::Deliver). It is the fair upper bound trainwatchd's ingest
//     is measured against: what it costs is the price of gRPC, protobuf, the
//     hand-off to one thread and the load generator.
//
// Per stream it follows the server side of the protocol in agent.proto: the
// first message must be a Hello (anything else ends the stream with
// FAILED_PRECONDITION); the Hello is answered with an empty DurabilityAck and
// an empty QuarantinedShards; then every StepReport raises the durable step
// of its key (rank 0 for REPORT_SCOPE_GLOBAL, the report's rank for
// REPORT_SCOPE_RANK). Acks are coalesced like the real server's: at most one
// write is in flight per stream, and the write that follows always carries
// the latest steps, so one ack may cover many reports.
//
// Built on the callback API: a stream costs a reactor object, never a thread.

#ifndef TRAINWATCH_BENCH_INGEST_SINK_SERVICE_H_
#define TRAINWATCH_BENCH_INGEST_SINK_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::bench {

// Counters are updated with relaxed atomics and read at any time.
struct SinkCounters {
  std::atomic<uint64_t> streams_opened{0};
  std::atomic<uint64_t> streams_rejected{0};
  std::atomic<uint64_t> step_reports{0};
  std::atomic<uint64_t> heartbeats{0};
  std::atomic<uint64_t> acks_sent{0};
  // kBatch only: writer passes that held at least one step report, and the
  // (stream, key) pairs they told: each owes the stream at most one ack.
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> batch_acks_owed{0};
};

enum class AckMode { kPerRecord, kBatch };

struct SinkOptions {
  // An empty token accepts every caller; otherwise the call must carry the
  // metadata "authorization: Bearer <token>" or it is refused with
  // UNAUTHENTICATED.
  std::string token;
  AckMode ack = AckMode::kPerRecord;
  // kBatch: most messages one writer pass takes, as trainwatchd's
  // IngestOptions::max_batch_items (same default). At least 1.
  size_t max_batch_items = 50'000;
  // kBatch: trainwatchd's group commit, IngestOptions::commit_interval_ms
  // (same default); 0: none.
  int64_t commit_interval_ms = 5;
};

class SinkStream;

// kBatch's writer thread. Thread-safe.
class AckBatcher {
 public:
  AckBatcher(size_t max_batch_items, int64_t commit_interval_ms, SinkCounters* counters);
  // Drains what was submitted, then joins.
  ~AckBatcher();
  AckBatcher(const AckBatcher&) = delete;
  AckBatcher& operator=(const AckBatcher&) = delete;

  // A stream is registered from its start to its OnDone; acks for a stream
  // no longer registered are dropped (its agent re-sends on reconnect).
  uint64_t Register(SinkStream* stream);
  void Unregister(uint64_t stream_id);
  // Never waits on the writer.
  void Submit(uint64_t stream_id, trainwatch::v1::AgentMessage message);

 private:
  struct Item {
    uint64_t stream_id;
    trainwatch::v1::AgentMessage message;
  };
  void Loop();
  void Process(std::vector<Item>& items);

  const size_t max_batch_items_;
  const absl::Duration commit_interval_;
  SinkCounters* const counters_;

  absl::Mutex queue_mu_;
  std::vector<Item> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stop_ ABSL_GUARDED_BY(queue_mu_) = false;

  // Taken before a stream's own lock, never after.
  absl::Mutex streams_mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(streams_mu_) = 1;
  absl::flat_hash_map<uint64_t, SinkStream*> streams_ ABSL_GUARDED_BY(streams_mu_);

  std::thread thread_;  // last: starts after the members it reads
};

// Thread-safe: gRPC calls Stream() from its own threads.
class SinkService final : public trainwatch::v1::AgentService::CallbackService {
 public:
  explicit SinkService(const SinkOptions& options);

  grpc::ServerBidiReactor<trainwatch::v1::AgentMessage,
                          trainwatch::v1::ServerMessage>*
  Stream(grpc::CallbackServerContext* context) override;

  const SinkCounters& counters() const { return counters_; }

 private:
  const std::string expected_authorization_;
  SinkCounters counters_;
  std::unique_ptr<AckBatcher> batcher_;  // kBatch only
};

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_SINK_SERVICE_H_
