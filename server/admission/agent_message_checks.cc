#include "admission/agent_message_checks.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/shard_names.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;

namespace {

// rank in [0, world_size), world_size in [1, max]; `what` names the message.
absl::Status CheckRank(absl::string_view what, int32_t rank, int32_t world_size,
                       const AgentStreamLimits& limits) {
  if (world_size < 1 || world_size > limits.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": world_size ", world_size,
                                                   " is outside [1, ", limits.max_world_size,
                                                   "] (--max_world_size)"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", rank, " is outside world_size ", world_size));
  }
  return absl::OkStatus();
}

absl::Status NonNegative(absl::string_view what, absl::string_view field, int64_t v) {
  if (v >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", field, " must be >= 0, not ", v));
}

}  // namespace

absl::Status CheckAgentMessage(const v1::AgentMessage& m, const AgentStreamProgress& progress,
                               const AgentStreamLimits& limits) {
  if (m.kind_case() == v1::AgentMessage::KIND_NOT_SET) {
    return absl::InvalidArgumentError("empty AgentMessage: set one of its kinds");
  }
  if (!m.has_hello() && !progress.hello_seen) {
    return absl::FailedPreconditionError(
        "the first message on an agent stream must be a Hello (agent.proto, protocol step 1)");
  }
  switch (m.kind_case()) {
    case v1::AgentMessage::kHello: {
      const v1::Hello& h = m.hello();
      if (absl::Status s = CheckRunId(h.run_id()); !s.ok()) return s;
      // An incarnation id is stored with the run and named in log lines
      // and statuses: bounded and printable, like a run id.
      if (h.incarnation_id().size() > kMaxIncarnationIdBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("hello: incarnation_id is ", h.incarnation_id().size(),
                         " bytes long: at most ", kMaxIncarnationIdBytes));
      }
      for (char c : h.incarnation_id()) {
        if (!wire::IsRunIdChar(c)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "hello: incarnation_id has the byte 0x",
              absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2),
              ": it is characters of [A-Za-z0-9._:-]"));
        }
      }
      if (h.has_resume_step() && h.resume_step() < -1) {
        return absl::InvalidArgumentError(
            absl::StrCat("hello: resume_step must be >= -1, not ", h.resume_step()));
      }
      if (h.attachment().size() > kMaxHelloAttachmentBytes) {
        return absl::InvalidArgumentError(absl::StrCat("hello: attachment is ",
                                                       h.attachment().size(),
                                                       " bytes long: at most ",
                                                       kMaxHelloAttachmentBytes));
      }
      if (h.rules_json().size() > limits.max_hello_rules_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("hello: rules_json is ", h.rules_json().size(), " bytes long: at most ",
                         limits.max_hello_rules_bytes));
      }
      if (!h.rules_json().empty()) {
        // The parser names the field and the bound it breaks.
        absl::Status s = core::ParseRuleConfigJson(h.rules_json(), "hello.rules_json").status();
        if (!s.ok()) return absl::InvalidArgumentError(s.message());
      }
      return CheckRank("hello", h.rank(), h.world_size(), limits);
    }
    case v1::AgentMessage::kStepReport: {
      const v1::StepReport& r = m.step_report();
      if (absl::Status s = CheckRunId(r.run_id()); !s.ok()) return s;
      if (absl::Status s = NonNegative("step_report", "step", r.step()); !s.ok()) return s;
      // Shard names are bounded in count and length (shard_names.h: 1,024
      // names of 1 to 256 bytes), so that one report cannot make the
      // server hold an unbounded batch of strings.
      if (absl::Status s = core::CheckShardNameCount("step_report", r.shard_names_size());
          !s.ok()) {
        return s;
      }
      for (const std::string& name : r.shard_names()) {
        if (absl::Status s = core::CheckShardName("step_report", name); !s.ok()) return s;
      }
      return CheckRank("step_report", r.rank(), r.world_size(), limits);
    }
    case v1::AgentMessage::kHeartbeat: {
      const v1::Heartbeat& h = m.heartbeat();
      if (absl::Status s = CheckRunId(h.run_id()); !s.ok()) return s;
      if (absl::Status s = NonNegative("heartbeat", "rank", h.rank()); !s.ok()) return s;
      if (h.rank() >= limits.max_world_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "heartbeat: rank ", h.rank(), " is not below the server's --max_world_size ",
            limits.max_world_size));
      }
      if (h.stack().size() > kMaxHeartbeatStackBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "heartbeat: stack is ", h.stack().size(), " bytes, over ", kMaxHeartbeatStackBytes));
      }
      for (const auto& [name, value] : {std::pair<const char*, const std::string*>{
                                            "blocked_at", &h.blocked_at()},
                                        {"host_name", &h.host_name()},
                                        {"device", &h.device()}}) {
        if (value->size() > kMaxHeartbeatFieldBytes) {
          return absl::InvalidArgumentError(absl::StrCat("heartbeat: ", name, " is ",
                                                         value->size(), " bytes, over ",
                                                         kMaxHeartbeatFieldBytes));
        }
      }
      return absl::OkStatus();
    }
    case v1::AgentMessage::kCheckpoint: {
      const v1::CheckpointNotice& c = m.checkpoint();
      if (absl::Status s = CheckRunId(c.run_id()); !s.ok()) return s;
      if (absl::Status s = NonNegative("checkpoint", "step", c.step()); !s.ok()) return s;
      if (c.uri().empty()) return absl::InvalidArgumentError("checkpoint: uri is empty");
      return NonNegative("checkpoint", "rank", c.rank());
    }
    case v1::AgentMessage::kCommandAck:
      if (absl::Status s = CheckRunId(m.command_ack().run_id()); !s.ok()) return s;
      return NonNegative("command_ack", "rank", m.command_ack().rank());
    case v1::AgentMessage::KIND_NOT_SET:
      break;
  }
  return absl::OkStatus();
}

}  // namespace trainwatch::server
