// The agent protocol's rules on one message, as a pure function (no
// network, no locks), so that the stream, the tests and the fuzzers all
// check exactly the same thing. agent_stream.cc ends a stream with the
// status it returns; the token's run scope and quota are checked there.
//
// The rules (agent.proto states them too):
//   - The first message is a Hello: anything else first is
//     FAILED_PRECONDITION.
//   - A run id is 1 to kMaxRunIdBytes bytes of [A-Za-z0-9._:-]
//     (INVALID_ARGUMENT, naming the rule).
//   - world_size is in [1, max_world_size] (the --max_world_size flag,
//     default 65,536) and rank in [0, world_size); a step is >= 0.
//   - A step report's shard_names: at most core::kMaxShardNamesPerRecord
//     (1,024), each 1 to core::kMaxShardNameBytes (256) bytes
//     (INVALID_ARGUMENT naming the bound; core/.../shard_names.h).
//   - An empty AgentMessage (no kind set) is INVALID_ARGUMENT.
//   - A Hello's incarnation_id is at most kMaxIncarnationIdBytes bytes of
//     the run id's characters (it may be empty: an older agent), and its
//     resume_step, when set, is >= -1 (INVALID_ARGUMENT).
//   - A Hello's attachment is at most kMaxHelloAttachmentBytes.
//   - A Heartbeat's rank is below max_world_size, its stack at most
//     kMaxHeartbeatStackBytes and its other strings at most
//     kMaxHeartbeatFieldBytes (the server keeps the latest of every rank).
//   - A Hello's rules_json, when set, is at most max_hello_rules_bytes and
//     valid rules (core::ParseRuleConfigJson, which also bounds the rules'
//     memory): INVALID_ARGUMENT naming hello.rules_json and what is wrong,
//     since the server would build the run's engine from them.

#ifndef TRAINWATCH_SERVER_AGENT_MESSAGE_CHECKS_H_
#define TRAINWATCH_SERVER_AGENT_MESSAGE_CHECKS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "trainwatch/v1/agent.pb.h"
#include "trainwatch/wire/run_id.h"

namespace trainwatch::server {

// The run id rule lives in wire/ since the agent checks its own id too.
// Also used by every operator RPC that takes a run id.
using wire::CheckRunId;
using wire::kMaxRunIdBytes;
// The agent's own ids are 16 hex digits; room for a launcher's.
inline constexpr size_t kMaxIncarnationIdBytes = 64;
// Hello.attachment: one line of what `trainwatch run` found.
inline constexpr size_t kMaxHelloAttachmentBytes = 4096;
// Heartbeat.stack (the agent cuts it to 8 KiB) and its shorter strings.
inline constexpr size_t kMaxHeartbeatStackBytes = 8192;
inline constexpr size_t kMaxHeartbeatFieldBytes = 512;

struct AgentStreamLimits {
  // Largest world_size a Hello or StepReport may claim: a bound on what one
  // run may make the server keep per step (ranks mode aggregates per rank).
  int32_t max_world_size = 65'536;
  // Largest Hello.rules_json: the rules the server keeps with the run and
  // parses. Every RuleConfig field printed with its bounds takes under 4
  // KiB, so 16 KiB leaves room for whitespace and fields to come.
  size_t max_hello_rules_bytes = 16 * 1024;
};

// What a stream has seen so far, as far as the rules care.
struct AgentStreamProgress {
  bool hello_seen = false;
};

// OK when `m` may come next on a stream that has seen `progress`; the
// status to end the stream with otherwise.
absl::Status CheckAgentMessage(const trainwatch::v1::AgentMessage& m,
                               const AgentStreamProgress& progress,
                               const AgentStreamLimits& limits);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_AGENT_MESSAGE_CHECKS_H_
