// Rollback coordination: what an operator's approval of an incident becomes
// (a refusal, or a plan: checkpoint, batches to skip, shards to quarantine,
// settings), and the approved command until every rank applied it.
//
// Pure: the ingestor reads the store and writes what these return.

#ifndef TRAINWATCH_SERVER_ROLLBACK_H_
#define TRAINWATCH_SERVER_ROLLBACK_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "store/store.h"
#include "trainwatch/v1/agent.pb.h"
#include "trainwatch/v1/common.pb.h"

namespace trainwatch::server {

using ShardRanges = std::vector<std::pair<uint64_t, uint64_t>>;

// Shards to skip: integer id ranges, kept compact, and named shards
// (agent.proto's shard names), matched exactly.
struct ShardQuarantine {
  ShardRanges ranges;
  std::vector<std::string> names;
  bool empty() const { return ranges.empty() && names.empty(); }
};

// An operator's approval (or rejection) of an incident's rollback, carried
// out on the writer thread so that approvals and ingest never race.
struct ApprovalRequest {
  bool approve = true;
  int64_t incident_id = 0;
  std::optional<int64_t> to_step;
  // Shards to quarantine; unset: the incident's recommendation.
  std::optional<ShardQuarantine> quarantine;
  std::optional<double> z_loss_alpha;
  // Modules to run in another precision after loading, in order (the
  // reconfiguring fix of a numerical failure, tier 3).
  std::vector<std::pair<std::string, trainwatch::v1::Precision>> precision;
  // Factor on every parameter group's learning rate after loading.
  std::optional<double> lr_scale;
  // Steps whose batches every rank skips; unset: the recommendation; a
  // range with last < first: none.
  std::optional<std::pair<int64_t, int64_t>> skip_steps;
  std::string comment;
  std::string idempotency_key;
  std::string actor;  // from the caller's authentication
  bool dry_run = false;
};

// Largest z-loss alpha a decision may set. Typical values are 1e-4 (PaLM)
// to 1e-3 (what the engine recommends at most); above 1 the z-loss would
// outweigh the training loss itself, which is a typo, not a setting.
inline constexpr double kMaxZLossAlpha = 1.0;

// Why the request itself is malformed, or OK; checked where decisions
// enter (operator_service.cc), so every client is held to it:
//   - a comment is required, to approve as to reject (the audit log), but
//     in a dry run, which records nothing;
//   - a z-loss alpha is a finite number in [0, kMaxZLossAlpha];
//   - a quarantine range has first <= last;
//   - a precision change names a module (non-empty, each module once) and
//     fp32, bf16 or fp16 (fp8 is no precision to widen a failing module to);
//   - an lr scale is a finite number > 0;
//   - quarantine names are at most core::kMaxShardNamesPerRecord, each 1 to
//     core::kMaxShardNameBytes bytes (shard_names.h), as an agent's are.
// INVALID_ARGUMENT naming the field and the rule.
absl::Status CheckApprovalRequest(const ApprovalRequest& request);

// The steps whose batches every rank skips by default when `incident` is
// rolled back to the checkpoint at `checkpoint_step`: for a page, from
// `steps_before_onset` before its onset to its detection, after the
// checkpoint (earlier steps are not served again anyway); none for other
// tiers or an empty range.
std::optional<std::pair<int64_t, int64_t>> DefaultSkipSteps(const IncidentRow& incident,
                                                            int64_t checkpoint_step,
                                                            int64_t steps_before_onset);

// Why the incident's state refuses the decision (FAILED_PRECONDITION, with
// who decided before when `earlier` says so), or OK.
absl::Status RefuseDecision(const IncidentRow& incident, bool approve,
                            absl::Span<const DecisionRow> earlier);

// The plan of an approved rollback: the operator's checkpoint (one the run
// still retains) or the recommendation, and the operator's quarantine,
// z-loss and skipped steps or the recommendation's.
absl::StatusOr<trainwatch::v1::RollbackPlan> PlanRollback(
    const IncidentRow& incident, const ApprovalRequest& request,
    absl::Span<const CheckpointRow> retained, int64_t steps_before_onset);

// The ServerMessage that gives a run's agents its whole quarantine list.
std::string QuarantineMessage(const std::string& run_id, const ShardQuarantine& quarantine);

// An approved rollback being carried out, until every rank applied it.
struct RollbackCommand {
  std::string id;
  std::string message;  // the serialized ServerMessage
  int64_t incident_id = 0;
  int64_t target_step = 0;
  // The world that must apply it, and the world of the attempt it starts:
  // the run's world when approved, then the world_size of the latest Hello
  // while it is under way (a job restarted on fewer ranks says so there).
  int32_t world_size = 1;
  std::set<int32_t> applied, failed;

  // Counts a rank's acknowledgement; true once ranks 0 to world_size - 1
  // all applied it.
  bool OnAck(int32_t rank, trainwatch::v1::AckStatus status, int32_t world_size);
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_ROLLBACK_H_
