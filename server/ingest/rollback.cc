#include "ingest/rollback.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainwatch/core/shard_names.h"

namespace trainwatch::server {

namespace {

const char* StateWord(IncidentState s) {
  switch (s) {
    case IncidentState::kOpen: return "open";
    case IncidentState::kAcknowledged: return "acknowledged";
    case IncidentState::kAwaitingDecision: return "awaiting a decision";
    case IncidentState::kRollingBack: return "rolling back";
    case IncidentState::kResolved: return "resolved";
    case IncidentState::kDismissed: return "dismissed";
  }
  return "?";
}

// The recommendation's quarantine and z-loss.
void RecommendedSettings(const IncidentRow& incident, ShardQuarantine* quarantine,
                         std::optional<double>* z_loss) {
  for (const core::RecommendedAction& a : incident.actions) {
    if (a.kind == core::RecommendedAction::Kind::kQuarantineShards) {
      if (a.has_shard_range) quarantine->ranges.emplace_back(a.shard_first, a.shard_last);
      quarantine->names.insert(quarantine->names.end(), a.shard_names.begin(),
                               a.shard_names.end());
    } else if (a.kind == core::RecommendedAction::Kind::kSetZLossAlpha) {
      *z_loss = a.z_loss_alpha;
    }
  }
}

}  // namespace

absl::Status CheckApprovalRequest(const ApprovalRequest& r) {
  if (r.comment.empty() && !r.dry_run) {
    return absl::InvalidArgumentError(absl::StrCat(
        r.approve ? "an approval" : "a rejection", " needs a comment: it goes in the audit log"));
  }
  if (r.z_loss_alpha &&
      !(std::isfinite(*r.z_loss_alpha) && *r.z_loss_alpha >= 0 &&
        *r.z_loss_alpha <= kMaxZLossAlpha)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "z_loss_alpha must be a finite number in [0, %g], not %g", kMaxZLossAlpha,
        *r.z_loss_alpha));
  }
  if (r.lr_scale && !(std::isfinite(*r.lr_scale) && *r.lr_scale > 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("lr_scale must be a finite number > 0, not %g", *r.lr_scale));
  }
  std::set<std::string> modules;
  for (const auto& [module, precision] : r.precision) {
    if (module.empty()) {
      return absl::InvalidArgumentError("layer_precision: the module name is empty");
    }
    if (precision != trainwatch::v1::PRECISION_FP32 &&
        precision != trainwatch::v1::PRECISION_BF16 &&
        precision != trainwatch::v1::PRECISION_FP16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer_precision: module '", module, "' needs fp32, bf16 or fp16, not ",
          trainwatch::v1::Precision_Name(precision)));
    }
    if (!modules.insert(module).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer_precision: module '", module, "' is given twice"));
    }
  }
  if (r.quarantine) {
    for (const auto& [first, last] : r.quarantine->ranges) {
      if (first > last) {
        return absl::InvalidArgumentError(absl::StrCat(
            "quarantine_shards: the range ", first, "..", last, " has first > last"));
      }
    }
    if (absl::Status s = core::CheckShardNames("quarantine_shards", r.quarantine->names);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

std::optional<std::pair<int64_t, int64_t>> DefaultSkipSteps(const IncidentRow& incident,
                                                            int64_t checkpoint_step,
                                                            int64_t steps_before_onset) {
  // A numerical failure is no batch's fault.
  if (incident.tier != 2) return std::nullopt;
  const int64_t first =
      std::max(incident.onset_step - steps_before_onset, checkpoint_step + 1);
  if (first > incident.detection_step) return std::nullopt;
  return std::make_pair(first, incident.detection_step);
}

absl::Status RefuseDecision(const IncidentRow& inc, bool approve,
                            absl::Span<const DecisionRow> prior) {
  const std::string pub = inc.public_id();
  // The last human decision, for refusals that say who and when.
  const DecisionRow* human = nullptr;
  for (const DecisionRow& d : prior) {
    if (d.kind == "approve_rollback" || d.kind == "reject_rollback") human = &d;
  }
  std::string earlier;
  if (human != nullptr) {
    earlier = absl::StrFormat(" (%s by %s, D-%d: \"%s\")",
                              human->kind == "approve_rollback" ? "approved" : "rejected",
                              human->actor, human->id, human->comment);
  }
  if (approve && inc.tier < 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        pub, " is tier ", inc.tier, " (", StateWord(inc.state),
        "): tier 0 and 1 incidents are handled in place and need no rollback"));
  }
  switch (inc.state) {
    case IncidentState::kDismissed:
      return absl::FailedPreconditionError(
          absl::StrCat(pub, " was rejected", earlier, ": ", approve ? "approving" : "rejecting",
                       " it again changes nothing"));
    case IncidentState::kRollingBack:
      return absl::FailedPreconditionError(absl::StrCat(
          pub, " is already rolling back", earlier, ": a second decision changes nothing"));
    case IncidentState::kResolved:
      return absl::FailedPreconditionError(
          absl::StrCat(pub, " is resolved", earlier, ": nothing to decide"));
    default:
      return absl::OkStatus();
  }
}

absl::StatusOr<trainwatch::v1::RollbackPlan> PlanRollback(
    const IncidentRow& inc, const ApprovalRequest& r, absl::Span<const CheckpointRow> retained,
    int64_t steps_before_onset) {
  const int64_t target = r.to_step.value_or(inc.recommended_checkpoint_step);
  const CheckpointRow* ck = nullptr;
  for (const CheckpointRow& c : retained) {
    if (c.step == target) ck = &c;
  }
  if (ck == nullptr) {
    std::vector<int64_t> steps;
    for (const CheckpointRow& c : retained) steps.push_back(c.step);
    // What can be done instead: another retained checkpoint, or, with none,
    // the decision recorded without a rollback.
    const std::string instead =
        steps.empty()
            ? absl::StrCat("run ", inc.run_id,
                           " reported no checkpoint, so there is nothing to roll back to (`twctl "
                           "incident show ",
                           inc.public_id(), "` says how checkpoints are reported); `twctl "
                           "rollback reject ",
                           inc.public_id(), " --comment \"...\"` records the decision instead")
            : absl::StrCat("the retained ones are at steps ", absl::StrJoin(steps, ", "),
                           "; pass --to-step with one of them");
    const std::string message = absl::StrCat(
        r.to_step ? absl::StrCat("step ", target, " is not a retained checkpoint of run ",
                                 inc.run_id)
                  : absl::StrCat(inc.public_id(), " has no recommended checkpoint"),
        ": ", instead);
    return r.to_step ? absl::InvalidArgumentError(message)
                     : absl::FailedPreconditionError(message);
  }
  ShardQuarantine recommended_quarantine;
  std::optional<double> recommended_z_loss;
  RecommendedSettings(inc, &recommended_quarantine, &recommended_z_loss);
  const ShardQuarantine& quarantine = r.quarantine ? *r.quarantine : recommended_quarantine;
  const std::optional<double> z_loss = r.z_loss_alpha ? r.z_loss_alpha : recommended_z_loss;
  // The batches every rank skips: the operator's steps, or the default.
  std::optional<std::pair<int64_t, int64_t>> skip;
  if (r.skip_steps) {
    if (r.skip_steps->first < 0) {
      return absl::InvalidArgumentError("skip_steps must not start below step 0");
    }
    if (r.skip_steps->second >= r.skip_steps->first) skip = r.skip_steps;
    if (skip) skip->first = std::max(skip->first, ck->step + 1);
  } else {
    skip = DefaultSkipSteps(inc, ck->step, steps_before_onset);
  }
  trainwatch::v1::RollbackPlan plan;
  plan.set_incident_id(inc.public_id());
  plan.set_target_step(ck->step);
  plan.set_checkpoint_uri(ck->uri);
  if (skip && skip->second >= skip->first) {
    plan.mutable_skip_steps()->set_first(skip->first);
    plan.mutable_skip_steps()->set_last(skip->second);
  }
  for (const auto& [first, last] : quarantine.ranges) {
    auto* range = plan.mutable_quarantine()->add_ranges();
    range->set_first(first);
    range->set_last(last);
  }
  for (const std::string& name : quarantine.names) plan.mutable_quarantine()->add_names(name);
  if (z_loss) plan.add_settings()->set_z_loss_alpha(*z_loss);
  for (const auto& [module, precision] : r.precision) {
    auto* lp = plan.add_settings()->mutable_layer_precision();
    lp->set_layer(module);
    lp->set_precision(precision);
  }
  if (r.lr_scale) plan.add_settings()->set_lr_scale(*r.lr_scale);
  return plan;
}

std::string QuarantineMessage(const std::string& run_id, const ShardQuarantine& quarantine) {
  trainwatch::v1::ServerMessage m;
  auto* q = m.mutable_quarantined_shards();
  q->set_run_id(run_id);
  // The list only grows, so its length orders the versions.
  q->set_version(static_cast<int64_t>(quarantine.ranges.size() + quarantine.names.size()));
  for (const auto& [first, last] : quarantine.ranges) {
    auto* r = q->mutable_shards()->add_ranges();
    r->set_first(first);
    r->set_last(last);
  }
  for (const std::string& name : quarantine.names) q->mutable_shards()->add_names(name);
  return m.SerializeAsString();
}

bool RollbackCommand::OnAck(int32_t rank, trainwatch::v1::AckStatus status, int32_t world_size) {
  if (status == trainwatch::v1::ACK_STATUS_APPLIED) {
    applied.insert(rank);
    failed.erase(rank);
  } else if (status == trainwatch::v1::ACK_STATUS_FAILED) {
    failed.insert(rank);
  }
  // Ranks of a larger world before a restart do not stand in for this one's.
  return std::distance(applied.lower_bound(0), applied.lower_bound(world_size)) >= world_size;
}

}  // namespace trainwatch::server
