// Private: one step's record as it crosses from the training thread to the
// pump (a Slot in the ring), and its wire form (a trainwatch.v1 message).
// The slot is plain data, reused in place: no allocation in the steady
// state. The message is built on the pump's thread, never the step's.

#ifndef TRAINWATCH_AGENT_SRC_STEP_MESSAGE_H_
#define TRAINWATCH_AGENT_SRC_STEP_MESSAGE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainwatch/agent/agent.h"
#include "trainwatch/core/step_record.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::agent::internal {

// Who is reporting: the address of every message this rank sends.
struct Origin {
  std::string run_id;
  int rank = 0;
  int world_size = 1;
  // This launch of the job, the same on every rank (Agent::Create); empty
  // without a server.
  std::string incarnation;
};

// A step queued for the server: the step (core::Step), this rank's view of
// it, and the verdict.
struct Slot : core::Step {
  static constexpr size_t kMaxShards = 32;

  // A rank's own report (a nonfinite gradient) rather than the run's.
  bool rank_scope = false;
  // False for a followed log's record (StepObserved): no agent decided
  // anything, and the report says so (VERDICT_UNSPECIFIED), so that the
  // server counts no divergence from its own verdict.
  bool decided = true;
  Verdict verdict;
  // Whether the trainer skipped the update: the verdict's skip, unless the
  // agent only observes (AgentConfig::observed).
  bool update_skipped = false;
  // The event behind a skip or a halt (a failure path: copied only then),
  // and the hash of the rules the verdict came from.
  std::optional<core::Event> verdict_event;
  uint32_t rules_hash = 0;
  uint16_t shard_count = 0;
  uint64_t shards[kMaxShards];
  std::vector<uint64_t> gathered_shards;  // every rank's, when not empty
  // This rank's shard names, bounded by Step() (shard_names.h); assigned in
  // place, so a slot reuses its strings' storage from one lap to the next.
  std::vector<std::string> shard_names;
  // This rank's own report naming the tensors that held nonfinite values,
  // sent right after the step's record. It shares the record's (run, rank,
  // step) acknowledgement, so it must not overtake records of earlier
  // steps: an ack for its step would cover them before they are sent.
  std::unique_ptr<v1::AgentMessage> tensor_report;
  int64_t time_ms = 0;
};

// The step report of a slot.
v1::AgentMessage StepMessage(const Origin& origin, const Slot& slot);

// A failure path, allocation allowed: this rank's own report with (up to 64
// of) the tensors that hold nonfinite values, with this rank's own gradient
// counts (the sum over its gradient groups, unweighted).
std::unique_ptr<v1::AgentMessage> TensorReportMessage(const Origin& origin, const StepInput& in,
                                                      int64_t nonfinite, int64_t elements);

}  // namespace trainwatch::agent::internal

#endif  // TRAINWATCH_AGENT_SRC_STEP_MESSAGE_H_
