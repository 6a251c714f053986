// A do-nothing AgentService: it acknowledges every step report as durable the
// moment it arrives and stores nothing. It is the upper bound the real
// server's ingest is measured against: whatever the sink costs is the price
// of gRPC, protobuf and the load generator themselves.
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
#include <cstdint>
#include <string>

#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::bench {

// Counters are updated with relaxed atomics and read at any time.
struct SinkCounters {
  std::atomic<uint64_t> streams_opened{0};
  std::atomic<uint64_t> streams_rejected{0};
  std::atomic<uint64_t> step_reports{0};
  std::atomic<uint64_t> heartbeats{0};
  std::atomic<uint64_t> acks_sent{0};
};

// Thread-safe: gRPC calls Stream() from its own threads.
class SinkService final : public trainwatch::v1::AgentService::CallbackService {
 public:
  // An empty token accepts every caller; otherwise the call must carry the
  // metadata "authorization: Bearer <token>" or it is refused with
  // UNAUTHENTICATED.
  explicit SinkService(std::string token);

  grpc::ServerBidiReactor<trainwatch::v1::AgentMessage,
                          trainwatch::v1::ServerMessage>*
  Stream(grpc::CallbackServerContext* context) override;

  const SinkCounters& counters() const { return counters_; }

 private:
  const std::string expected_authorization_;
  SinkCounters counters_;
};

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_SINK_SERVICE_H_
