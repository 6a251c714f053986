// The agent side of trainwatchd: one bidirectional stream per agent. It
// checks the token, validates every message (agent_message_checks.h, then
// the token's run scope and its --max_runs_per_token quota) and hands it to
// the ingestor without waiting; acks and server messages go back as the
// writer makes them durable. The stream reads raw bytes and parses them
// itself, so that bytes that are no AgentMessage end the stream with
// INVALID_ARGUMENT rather than looking like the agent's half-close.

#ifndef TRAINWATCH_SERVER_AGENT_STREAM_H_
#define TRAINWATCH_SERVER_AGENT_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <utility>

#include "admission/agent_message_checks.h"
#include "admission/auth.h"
#include "api/service_state.h"
#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::server {

// What every stream of one AgentService shares besides the ServiceState.
struct AgentStreamShared {
  AgentStreamLimits limits;
  RunCreationLimit* run_limit = nullptr;
};

class AgentStream : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  AgentStream(ServiceState* state, const AgentStreamShared* shared,
              grpc::CallbackServerContext* ctx);
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;
  void OnCancel() override {}

  // Queues acks and starts a write if none is in flight. Any thread.
  static void Deliver(const std::shared_ptr<Session>& s);
  // Ends the stream once no write is in flight. Any thread.
  static void FinishWhenIdle(const std::shared_ptr<Session>& s, grpc::Status status);
  void FinishWhenIdle(grpc::Status status) { FinishWhenIdle(session_, std::move(status)); }

 private:
  absl::Status Validate(const trainwatch::v1::AgentMessage& m);
  // Serializes `m` and starts writing it. REQUIRES: no write in flight.
  void Write(const trainwatch::v1::ServerMessage& m);

  ServiceState* state_;
  const AgentStreamShared* shared_;
  grpc::CallbackServerContext* ctx_;
  uint64_t id_ = 0;
  std::shared_ptr<Session> session_;
  Principal principal_;
  trainwatch::v1::AgentMessage in_;
  AgentStreamProgress progress_;
  grpc::ByteBuffer in_bytes_;
  grpc::ByteBuffer out_bytes_;
};

// The AgentService, its streams sharing `state`, `limits` and one
// RunCreationLimit of `max_runs_per_token`.
std::unique_ptr<grpc::Service> NewAgentService(ServiceState* state, AgentStreamLimits limits,
                                               int max_runs_per_token);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_AGENT_STREAM_H_
