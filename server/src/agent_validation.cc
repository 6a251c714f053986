#include "agent_validation.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;

absl::Status ValidateAgentMessage(const v1::AgentMessage& m, const Principal& principal) {
  const std::string* run = nullptr;
  switch (m.kind_case()) {
    case v1::AgentMessage::kHello:
      run = &m.hello().run_id();
      if (m.hello().world_size() < 0 || m.hello().world_size() > 1'000'000) {
        return absl::InvalidArgumentError("hello: world_size must be in [1, 1000000]");
      }
      break;
    case v1::AgentMessage::kStepReport: {
      const auto& r = m.step_report();
      run = &r.run_id();
      if (r.step() < 0) return absl::InvalidArgumentError("step_report: step must be >= 0");
      if (r.rank() < 0) return absl::InvalidArgumentError("step_report: rank must be >= 0");
      if (r.world_size() < 0 || r.world_size() > 1'000'000) {
        return absl::InvalidArgumentError("step_report: world_size must be in [1, 1000000]");
      }
      if (r.world_size() > 0 && r.rank() >= r.world_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "step_report: rank ", r.rank(), " is outside world_size ", r.world_size()));
      }
      break;
    }
    case v1::AgentMessage::kHeartbeat:
      run = &m.heartbeat().run_id();
      break;
    case v1::AgentMessage::kCheckpoint:
      run = &m.checkpoint().run_id();
      if (m.checkpoint().uri().empty()) {
        return absl::InvalidArgumentError("checkpoint: uri is empty");
      }
      break;
    case v1::AgentMessage::kCommandAck:
      run = &m.command_ack().run_id();
      break;
    case v1::AgentMessage::KIND_NOT_SET:
      return absl::InvalidArgumentError("empty AgentMessage: set one of its kinds");
  }
  if (run->empty()) return absl::InvalidArgumentError("run_id is empty");
  if (run->size() > 200) return absl::InvalidArgumentError("run_id is longer than 200 bytes");
  if (!principal.MayReport(*run)) {
    return absl::PermissionDeniedError(
        absl::StrCat("token '", principal.name, "' may not report for run '", *run, "'"));
  }
  return absl::OkStatus();
}

}  // namespace trainwatch::server
