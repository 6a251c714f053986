// The operator's approvals and the commands they become (approvals.h): the
// store lookups and the rows written here, the rules in rollback.h.

#include "ingest/approvals.h"

#include <algorithm>

#include "common/log.h"
#include "ingest/liveness.h"
#include "absl/strings/str_cat.h"

namespace trainwatch::server {

ApprovalOutcome Approvals::Run(const ApprovalRequest& r, int64_t now) {
  namespace v1 = trainwatch::v1;
  ApprovalOutcome out;
  const std::string pub = absl::StrCat("I-", r.incident_id);
  // A repeated request (same idempotency key) gets the first answer.
  if (!r.idempotency_key.empty()) {
    absl::StatusOr<std::optional<DecisionRow>> prior = store_->FindDecisionByKey(r.idempotency_key);
    if (!prior.ok()) {
      out.status = prior.status();
      return out;
    }
    if (prior->has_value()) {
      if ((*prior)->incident_id != r.incident_id) {
        out.status = absl::InvalidArgumentError(absl::StrCat(
            "idempotency key '", r.idempotency_key, "' was used for I-", (*prior)->incident_id));
        return out;
      }
      out.decision = (*prior)->payload;
      out.replayed = true;
      absl::StatusOr<std::optional<IncidentRow>> inc = store_->GetIncident(r.incident_id);
      if (inc.ok() && inc->has_value()) out.state = (*inc)->state;
      return out;
    }
  }
  // Find the incident: in memory while open, else in the store.
  auto [run, live] = runs_->FindOpenIncident(r.incident_id);
  IncidentRow stored;
  if (live == nullptr) {
    absl::StatusOr<std::optional<IncidentRow>> inc = store_->GetIncident(r.incident_id);
    if (!inc.ok()) {
      out.status = inc.status();
      return out;
    }
    if (!inc->has_value()) {
      out.status = absl::NotFoundError(absl::StrCat("no incident ", pub));
      return out;
    }
    stored = **inc;
    // Open in the store, its run evicted from memory: rebuild the run.
    if (!IsClosed(stored.state) && runs_->IsEvicted(stored.run_id)) {
      run = runs_->Get(stored.run_id, 0, now, /*create=*/false);
      if (run != nullptr) live = run->incidents.FindOpen(r.incident_id);
      if (live == nullptr) run = nullptr;
    }
  }
  const IncidentRow& inc = live != nullptr ? *live : stored;
  out.state = inc.state;
  absl::StatusOr<std::vector<DecisionRow>> prior = store_->DecisionsOfIncident(inc.id);
  out.status = RefuseDecision(inc, r.approve,
                              prior.ok() ? absl::Span<const DecisionRow>(*prior)
                                         : absl::Span<const DecisionRow>());
  if (!out.status.ok()) return out;
  if (run == nullptr) {
    out.status = absl::FailedPreconditionError(absl::StrCat(pub, " is not open"));
    return out;
  }
  const int64_t decision_id = batch_->ids.next_decision;
  v1::Decision d;
  d.set_decision_id(absl::StrCat("D-", decision_id));
  d.set_incident_id(pub);
  d.set_run_id(inc.run_id);
  d.set_kind(r.approve ? v1::DECISION_KIND_APPROVE_ROLLBACK : v1::DECISION_KIND_REJECT_ROLLBACK);
  d.mutable_actor()->set_kind(v1::ACTOR_KIND_HUMAN);
  d.mutable_actor()->set_id(r.actor);
  d.mutable_actor()->set_via("twctl");
  d.mutable_decided_at()->set_seconds(now / 1000);
  d.set_comment(r.comment);
  d.set_dry_run(r.dry_run);
  d.set_idempotency_key(r.idempotency_key);
  if (r.approve) {
    absl::StatusOr<std::vector<CheckpointRow>> cks = store_->Checkpoints(inc.run_id);
    if (!cks.ok()) {
      out.status = cks.status();
      return out;
    }
    const size_t keep = static_cast<size_t>(run->rules.checkpoints_retained);
    const absl::Span<const CheckpointRow> retained =
        absl::MakeConstSpan(*cks).last(std::min(keep, cks->size()));
    absl::StatusOr<v1::RollbackPlan> plan =
        PlanRollback(inc, r, retained, run->rules.shard_steps_before_onset);
    if (!plan.ok()) {
      out.status = plan.status();
      return out;
    }
    *d.mutable_plan() = *std::move(plan);
    // Its cost: the steps since the checkpoint, trained again.
    if (std::optional<RunView> view = views_->Get(inc.run_id);
        view.has_value() && view->liveness.step_ms_median > 0) {
      const int64_t steps = std::max<int64_t>(run->row.last_step - d.plan().target_step(), 0);
      const int64_t step_ms = view->liveness.step_ms_median;
      v1::RollbackCost* cost = d.mutable_plan()->mutable_cost();
      cost->set_steps(steps);
      cost->set_step_seconds(static_cast<double>(step_ms) / 1000.0);
      cost->set_ranks(run->row.world_size);
      cost->set_gpu_hours(GpuHours(steps * step_ms, run->row.world_size));
    }
    d.set_command_id(absl::StrCat("C-", decision_id));
    // Nothing in a followed run's trainer can load a checkpoint.
    d.set_manual_restart(run->row.observed);
  }
  out.decision = d.SerializeAsString();
  if (r.dry_run) return out;  // what would happen; nothing recorded

  ++batch_->ids.next_decision;
  batch_->rows.decisions.push_back({decision_id, inc.id, inc.run_id, r.actor,
                              r.approve ? "approve_rollback" : "reject_rollback", r.comment,
                              out.decision, r.idempotency_key, now});
  IncidentRow updated = inc;
  updated.updated_ms = now;
  if (r.approve) {
    updated.state = IncidentState::kRollingBack;
    v1::ServerMessage msg;
    v1::Command* c = msg.mutable_command();
    c->set_command_id(d.command_id());
    c->set_run_id(inc.run_id);
    c->mutable_issued_at()->set_seconds(now / 1000);
    *c->mutable_rollback() = d.plan();
    batch_->rows.commands.push_back({d.command_id(), inc.run_id, inc.id,
                               d.manual_restart() ? "manual_restart" : "rollback",
                               c->SerializeAsString(), now});
    for (const auto& range : d.plan().quarantine().ranges()) {
      batch_->rows.quarantines.push_back(
          {inc.run_id, range.first(), range.last(), inc.id, decision_id, now});
      run->quarantined.ranges.emplace_back(range.first(), range.last());
    }
    for (const std::string& name : d.plan().quarantine().names()) {
      batch_->rows.quarantines.push_back({inc.run_id, 0, 0, inc.id, decision_id, now, name});
      run->quarantined.names.push_back(name);
    }
    RollbackCommand ac;
    ac.id = d.command_id();
    ac.message = msg.SerializeAsString();
    ac.incident_id = inc.id;
    ac.target_step = d.plan().target_step();
    ac.world_size = run->row.world_size;
    run->command = ac;
    if (d.manual_restart()) {
      LOG(INFO) << "run " << inc.run_id << " is followed (" << kObservedNotEnforced
                << "): rollback " << d.command_id() << " recorded, not sent; the trainer must be "
                << "restarted by hand after step " << ac.target_step;
    } else {
      batch_->outgoing.emplace_back(inc.run_id, 0, ac.message);
    }
    if (!d.manual_restart() &&
        (d.plan().quarantine().ranges_size() > 0 || d.plan().quarantine().names_size() > 0)) {
      batch_->outgoing.emplace_back(inc.run_id, 0, QuarantineMessage(inc.run_id, run->quarantined));
    }
  } else {
    updated.state = IncidentState::kDismissed;
    updated.closed_ms = now;
  }
  out.state = updated.state;
  batch_->sink().Record(updated, updated.state != inc.state ? IncidentChange::kStateChanged
                                                    : IncidentChange::kUpdated);
  if (live != nullptr) run->incidents.Update(updated);
  return out;
}

void Approvals::HandleCommandAck(RunState* run, const trainwatch::v1::CommandAck& a,
                                int64_t now) {
  // Command ids stay short ("C-<decision>", typed by operators and kept in
  // the audit log) and so are guessable; what makes them safe is that an
  // acknowledgement only counts for the command under way in its own run,
  // and an agent's token names the runs it may speak for. An ack for
  // another run's command, one not issued (yet), or one already completed
  // is not stored either, so it cannot count after a restart.
  if (run == nullptr || !run->command || a.command_id() != run->command->id) {
    LOG(WARNING) << "run " << a.run_id() << ": refused rank " << a.rank()
                 << "'s acknowledgement of command " << a.command_id() << ": "
                 << (run == nullptr         ? std::string("no such run")
                     : !run->command        ? std::string("no command under way")
                                            : "the command under way is " + run->command->id);
    views_->Count(&IngestStats::refused_acks_total);
    return;
  }
  batch_->rows.command_acks.push_back({a.command_id(), a.run_id(), a.rank(),
                                 static_cast<int>(a.status()), a.message(),
                                 a.has_resumed_step() ? a.resumed_step() : -1, now});
  if (a.status() == trainwatch::v1::ACK_STATUS_FAILED) {
    LOG(WARNING) << "run " << run->row.run_id << ": rank " << a.rank() << " failed command "
                 << a.command_id() << ": " << a.message();
  }
  if (run->command->OnAck(a.rank(), a.status(), run->command->world_size)) {
    CompleteRollback(*run, now);
  }
}

void Approvals::CompleteRollback(RunState& run, int64_t now) {
  const RollbackCommand cmd = *run.command;
  run.command.reset();
  const int64_t target = cmd.target_step;
  // A new attempt: its history is the old one's up to the checkpoint, and
  // the engine is rebuilt from exactly that.
  const int64_t fed =  // the new attempt has the command's world
      snapshots_->OpenAttempt(run, target, AttemptStart::kRollback, cmd.incident_id,
                              cmd.world_size, now);
  if (IncidentRow* inc = run.incidents.FindOpen(cmd.incident_id)) {
    inc->updated_ms = now;
    batch_->sink().Record(*inc, IncidentChange::kUpdated);
    run.incidents.Watch(inc->id, inc->detection_step);
  }
  LOG(INFO) << "run " << run.row.run_id << ": rollback " << cmd.id << " applied by all "
            << run.row.world_size << " ranks; attempt " << run.row.attempt << " resumes after step "
            << target << " (" << fed << " steps of history)";
}

void Approvals::AnswerHello(RunState& run, const trainwatch::v1::Hello& hello, HelloKind kind,
                           int64_t now, trainwatch::v1::DurabilityAck* ack) {
  namespace v1 = trainwatch::v1;
  if (run.command && !run.row.observed && run.command->applied.count(hello.rank()) == 0) {
    ack->set_pending_command_id(run.command->id);
  }
  for (const auto& [key, inc] : run.incidents.open()) {
    // Tier 2 keeps training (a page, no halt); a tier 3 job that comes back
    // undecided trains on into the failure that halted it.
    if (inc.tier < 3 || IsClosed(inc.state) || inc.state == IncidentState::kRollingBack) continue;
    ack->add_undecided_incidents(inc.public_id());
    // One record per job, not per rank, and none for a reconnect.
    if (hello.rank() != 0 || kind == HelloKind::kReconnect) continue;
    // Without an incarnation id a restart and a reconnect look the same.
    const std::string comment = absl::StrCat(
        kind == HelloKind::kRestart
            ? absl::StrCat("the job restarted (incarnation ", hello.incarnation_id(), "; rank 0 on ")
            : std::string("the job said hello again (restarted or reconnected; rank 0 on "),
        hello.host_name().empty() ? "an unnamed host" : hello.host_name(), ", world size ",
        hello.world_size(), ") while ", inc.public_id(),
        " awaited a decision: it trains on without a rollback");
    const int64_t did = batch_->ids.next_decision++;
    v1::Decision d;
    d.set_decision_id(absl::StrCat("D-", did));
    d.set_incident_id(inc.public_id());
    d.set_run_id(run.row.run_id);
    d.set_kind(v1::DECISION_KIND_RESTARTED_UNDECIDED);
    d.mutable_actor()->set_kind(v1::ACTOR_KIND_SERVER);
    d.mutable_actor()->set_id("trainwatchd");
    d.mutable_actor()->set_via("hello");
    d.mutable_decided_at()->set_seconds(now / 1000);
    d.set_comment(comment);
    batch_->rows.decisions.push_back({did, inc.id, run.row.run_id, "trainwatchd", "restarted_undecided",
                                comment, d.SerializeAsString(), "", now});
    LOG(WARNING) << "run " << run.row.run_id << ": " << comment;
  }
}

void Approvals::SendPendingCommand(RunState& run, uint64_t stream, int32_t rank) {
  // A followed run's streams get no command (approvals.h).
  if (!run.command || run.row.observed || run.command->applied.count(rank) > 0) return;
  batch_->outgoing.emplace_back(run.row.run_id, stream, run.command->message);
}

}  // namespace trainwatch::server
