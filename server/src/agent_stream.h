// The agent side of trainwatchd: one bidirectional stream per agent. It
// checks the token, validates every message and hands it to the ingestor
// without waiting; acks and server messages go back as the writer makes
// them durable.

#ifndef TRAINWATCH_SERVER_AGENT_STREAM_H_
#define TRAINWATCH_SERVER_AGENT_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "service_state.h"
#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::server {

class AgentStream : public grpc::ServerBidiReactor<trainwatch::v1::AgentMessage, trainwatch::v1::ServerMessage> {
 public:
  AgentStream(ServiceState* state, grpc::CallbackServerContext* ctx);
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;
  void OnCancel() override {}

  // Queues acks and starts a write if none is in flight. Any thread.
  static void Deliver(const std::shared_ptr<Session>& s);
  // Ends the stream once no write is in flight.
  void FinishWhenIdle(grpc::Status status);

 private:
  ServiceState* state_;
  grpc::CallbackServerContext* ctx_;
  uint64_t id_ = 0;
  std::shared_ptr<Session> session_;
  Principal principal_;
  trainwatch::v1::AgentMessage in_;
};

// The AgentService, its streams sharing `state`.
std::unique_ptr<grpc::Service> NewAgentService(ServiceState* state);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_AGENT_STREAM_H_
