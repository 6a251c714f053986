// The checks the agent stream applies to every AgentMessage before it goes
// to the ingestor, as a pure function: no gRPC, no state, so the stream and
// the agent-stream fuzzer (fuzz/agent_stream_fuzz.cc) run the same code.

#ifndef TRAINWATCH_SERVER_AGENT_VALIDATION_H_
#define TRAINWATCH_SERVER_AGENT_VALIDATION_H_

#include "absl/status/status.h"
#include "auth.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::server {

// OK, or INVALID_ARGUMENT naming the field that breaks agent.proto's rules,
// or PERMISSION_DENIED when `principal` may not report for the message's run.
absl::Status ValidateAgentMessage(const trainwatch::v1::AgentMessage& m,
                                  const Principal& principal);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_AGENT_VALIDATION_H_
