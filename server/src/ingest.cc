#include "ingest.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "log.h"
#include "trainwatch/wire/step_report.h"
#include "absl/strings/str_cat.h"
#include "pager.h"

namespace trainwatch::server {

using trainwatch::v1::StepReport;

Ingestor::Ingestor(Store* store, const IngestOptions& options, core::Clock* clock)
    : store_(store), options_(options), clock_(clock) {}

Ingestor::~Ingestor() { Stop(); }

Ingestor::RunState* Ingestor::RunFor(const std::string& run_id, int32_t world_size,
                                     int64_t now) {
  auto it = runs_.find(run_id);
  if (it == runs_.end()) {
    RunRow row;
    row.run_id = run_id;
    row.world_size = std::max(1, world_size);
    row.created_ms = now;
    row.last_seen_ms = now;
    auto rs = std::make_unique<RunState>(row);
    rs->engine = std::make_unique<core::RuleEngine>(options_.rules);
    rs->row_dirty = true;
    it = runs_.emplace(run_id, std::move(rs)).first;
  }
  RunState& r = *it->second;
  if (world_size > r.row.world_size) {
    r.row.world_size = world_size;
    r.row_dirty = true;
  }
  r.row.last_seen_ms = now;
  return &r;
}

absl::Status Ingestor::Recover() {
  absl::StatusOr<std::vector<RunRow>> runs = store_->LoadRuns();
  if (!runs.ok()) return runs.status();
  absl::StatusOr<int64_t> max_id = store_->MaxIncidentId();
  if (!max_id.ok()) return max_id.status();
  ids_.next_incident = *max_id + 1;
  absl::StatusOr<int64_t> max_decision = store_->MaxDecisionId();
  if (!max_decision.ok()) return max_decision.status();
  ids_.next_decision = *max_decision + 1;
  for (const RunRow& row : *runs) {
    if (absl::Status st = RecoverRun(row); !st.ok()) return st;
  }
  PublishSnapshot();
  return absl::OkStatus();
}

absl::Status Ingestor::RecoverRun(const RunRow& row) {
  auto rs = std::make_unique<RunState>(row);
  RunState& r = *rs;
  core::EngineRebuilder rebuild(options_.rules);
  absl::Status st = store_->ForEachStep(
      row.run_id, row.attempt, [&](const StepRow& s, const std::string& ckpt) {
        core::StepRecord rec = s.View();
        rec.checkpoint_uri = ckpt;
        if (rebuild.Feed(rec)) {
          r.latest = s;
          r.has_latest = true;
          r.skipped_total += s.decision == static_cast<int>(core::Decision::kSkipUpdate);
        }
      });
  if (!st.ok()) return st;
  // Checkpoints reported apart from steps (and after the last one).
  absl::StatusOr<std::vector<CheckpointRow>> cks = store_->Checkpoints(row.run_id);
  if (!cks.ok()) return cks.status();
  for (const CheckpointRow& c : *cks) rebuild.NoteCheckpoint(c.step, c.uri);
  const int64_t steps = rebuild.fed();
  r.engine = std::move(rebuild).Finish();
  IncidentFilter f;
  f.run_id = row.run_id;
  f.limit = 1 << 30;
  absl::StatusOr<std::vector<IncidentRow>> inc = store_->ListIncidents(f);
  if (!inc.ok()) return inc.status();
  r.incidents.Restore(std::move(*inc));
  // A rollback under way or completed and being watched.
  std::vector<IncidentRow> rolling;
  for (const auto& [key, open] : r.incidents.open()) {
    if (open.state == IncidentState::kRollingBack) rolling.push_back(open);
  }
  for (const IncidentRow& open : rolling) {
    absl::StatusOr<std::optional<CommandRow>> cmd = store_->LatestCommand(open.id);
    if (!cmd.ok()) return cmd.status();
    if (!cmd->has_value()) continue;
    trainwatch::v1::ServerMessage msg;
    msg.mutable_command()->ParseFromString((*cmd)->payload);
    RollbackCommand ac;
    ac.id = (*cmd)->id;
    ac.message = msg.SerializeAsString();
    ac.incident_id = open.id;
    ac.target_step = msg.command().rollback().target_step();
    absl::StatusOr<std::vector<CommandAckRow>> acks = store_->CommandAcks(ac.id);
    if (!acks.ok()) return acks.status();
    bool complete = false;
    for (const CommandAckRow& a : *acks) {
      complete = ac.OnAck(a.rank, static_cast<trainwatch::v1::AckStatus>(a.status),
                          row.world_size);
    }
    if (complete) {
      r.incidents.Watch(open.id, open.detection_step);
    } else {
      r.command = std::move(ac);
    }
  }
  absl::StatusOr<std::vector<QuarantineRow>> q = store_->Quarantines(row.run_id);
  if (!q.ok()) return q.status();
  for (const QuarantineRow& qr : *q) r.quarantined.emplace_back(qr.first, qr.last);
  // Per-rank records of steps not yet completed.
  absl::StatusOr<std::vector<RankStepRow>> ranks =
      store_->LoadRankStepsAfter(row.run_id, row.attempt, row.last_step);
  if (!ranks.ok()) return ranks.status();
  for (const RankStepRow& rk : *ranks) {
    StepReport rep;
    if (!rep.ParseFromString(rk.report)) continue;
    r.mode_known = true;
    r.rank_mode = true;
    if (rk.rank < 0 || rk.rank >= row.world_size) continue;
    r.pending.try_emplace(rk.step, clock_->NowMs())
        .first->second.Add(rk.rank, wire::StepFromProto(rep));
  }
  if (!r.mode_known && steps > 0) r.mode_known = true;
  LOG(INFO) << "recovered run " << row.run_id << ": " << steps << " steps, "
            << r.incidents.open().size() << " open incidents, " << r.pending.size()
            << " pending steps";
  runs_.emplace(row.run_id, std::move(rs));
  return absl::OkStatus();
}

void Ingestor::Start() {
  writer_ = std::thread([this] { Loop(); });
}

void Ingestor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
    stop_ = true;
  }
  if (writer_.joinable()) writer_.join();
}

void Ingestor::Submit(IngestItem item) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(item));
  ++submitted_;
}

void Ingestor::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = submitted_;
  auto done = [this, target]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return done_ >= target || (stop_ && !writer_.joinable());
  };
  mu_.Await(absl::Condition(&done));
}

void Ingestor::Loop() {
  std::vector<IngestItem> items;
  std::vector<Task> tasks;
  for (;;) {
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || !tasks_.empty() || stop_;
      };
      // Wake at least every 50 ms for aggregation timeouts.
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(50));
      stopping = stop_;
      tasks.swap(tasks_);
      if (queue_.size() <= options_.max_batch_items) {
        items.swap(queue_);
      } else {
        items.assign(std::make_move_iterator(queue_.begin()),
                     std::make_move_iterator(queue_.begin() + options_.max_batch_items));
        queue_.erase(queue_.begin(), queue_.begin() + options_.max_batch_items);
      }
    }
    const size_t n = items.size();
    ProcessBatch(items);
    items.clear();
    if (!tasks.empty()) {
      // Decisions commit in a batch of their own, after the records that
      // arrived before them.
      const int64_t now = clock_->NowMs();
      for (Task& t : tasks) {
        DecisionOutcome out = RunDecision(t.request, now);
        answers_.emplace_back(std::move(t.done), std::move(out));
      }
      tasks.clear();
      std::vector<IngestItem> none;
      ProcessBatch(none);
    }
    {
      absl::MutexLock lock(&mu_);
      done_ += n;
      if (stopping && queue_.empty() && tasks_.empty()) break;
    }
  }
}

void Ingestor::ProcessBatch(std::vector<IngestItem>& items) {
  const int64_t now = clock_->NowMs();
  int64_t oldest_ms = now;
  for (IngestItem& item : items) {
    oldest_ms = std::min(oldest_ms, item.received_ms);
    Handle(item, now);
  }
  for (auto& [id, run] : runs_) CompletePending(*run, now, /*force=*/false);
  for (auto& [id, run] : runs_) {
    if (run->row_dirty) {
      batch_.runs.push_back(run->row);
      run->row_dirty = false;
    }
  }
  if (batch_.empty() && acks_.empty() && answers_.empty() && outgoing_.empty()) return;
  if (pager_ != nullptr) {
    for (const IncidentRow& inc : batch_.incidents) {
      std::string summary = inc.title;
      if (inc.recommended_checkpoint_step >= 0) {
        absl::StrAppend(&summary, " Recommended: roll back to checkpoint step ",
                        inc.recommended_checkpoint_step, ".");
      }
      for (const core::RecommendedAction& a : inc.actions) absl::StrAppend(&summary, " ", a.text, ".");
      for (OutboxRow& row : pager_->Rows(inc, summary, now)) batch_.outbox.push_back(std::move(row));
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = store_->Write(batch_);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  {
    absl::MutexLock lock(&snap_mu_);
    stats_.batches_total++;
    stats_.last_commit_seconds = seconds;
    stats_.commit_seconds_sum += seconds;
    stats_.last_lag_ms = clock_->NowMs() - oldest_ms;
    if (!st.ok()) stats_.store_errors_total++;
  }
  batch_.clear();
  if (!st.ok()) {
    // Nothing of this batch is acknowledged: agents keep the records and send
    // them again after a reconnect.
    LOG(ERROR) << "store write failed, batch not acknowledged: " << st;
    acks_.clear();
    changed_incidents_.clear();
    outgoing_.clear();
    for (auto& [done, out] : answers_) {
      out.status = absl::UnavailableError(
          absl::StrCat("the decision could not be recorded: ", st.message()));
      done(out);
    }
    answers_.clear();
    return;
  }
  // What a client learns from an ack or an answer must already be visible
  // in the snapshot (metrics, run status).
  PublishSnapshot();
  for (auto& [done, out] : answers_) done(out);
  answers_.clear();
  if (pager_ != nullptr) pager_->Wake();
  if (listener_ != nullptr) {
    for (const auto& [run, stream, bytes] : outgoing_) {
      listener_->OnServerMessage(run, stream, bytes);
    }
  }
  outgoing_.clear();
  if (listener_ != nullptr) {
    for (const auto& [key, step] : acks_) {
      listener_->OnDurable(std::get<0>(key), std::get<1>(key), std::get<2>(key), step);
    }
    for (const auto& [incident, change] : changed_incidents_) {
      listener_->OnIncident(incident, change);
    }
  }
  acks_.clear();
  changed_incidents_.clear();
}

void Ingestor::Handle(IngestItem& item, int64_t now) {
  const auto& m = item.message;
  switch (m.kind_case()) {
    case trainwatch::v1::AgentMessage::kHello: {
      if (m.hello().run_id().empty()) break;
      RunState* run = RunFor(m.hello().run_id(), m.hello().world_size(), now);
      // The protocol's first answer (agent.proto, step 2): where to resume.
      // The server knows it for the global record (rank 0); other ranks get
      // an empty map and resend their buffer, which the store deduplicates.
      trainwatch::v1::ServerMessage ack;
      ack.mutable_durability_ack()->set_run_id(run->row.run_id);
      if (m.hello().rank() == 0 && !run->rank_mode && run->row.last_step >= 0) {
        (*ack.mutable_durability_ack()->mutable_durable_step())[0] = run->row.last_step;
      }
      outgoing_.emplace_back(run->row.run_id, item.stream_id, ack.SerializeAsString());
      // A (re)connected rank gets what it has not applied yet.
      if (!run->quarantined.empty()) {
        outgoing_.emplace_back(run->row.run_id, item.stream_id,
                             QuarantineMessage(run->row.run_id, run->quarantined));
      }
      SendPendingCommand(*run, item.stream_id, m.hello().rank());
      break;
    }
    case trainwatch::v1::AgentMessage::kStepReport: {
      const StepReport& r = m.step_report();
      RunState* run = RunFor(r.run_id(), r.world_size(), now);
      HandleStep(*run, r, item.stream_id, now);
      break;
    }
    case trainwatch::v1::AgentMessage::kCheckpoint: {
      const auto& c = m.checkpoint();
      RunState* run = RunFor(c.run_id(), 0, now);
      run->engine->NoteCheckpoint(c.step(), c.uri());
      batch_.checkpoints.push_back({c.run_id(), c.step(), c.uri(), now});
      break;
    }
    case trainwatch::v1::AgentMessage::kCommandAck: {
      const auto& a = m.command_ack();
      batch_.command_acks.push_back({a.command_id(), a.run_id(), a.rank(),
                                     static_cast<int>(a.status()), a.message(),
                                     a.has_resumed_step() ? a.resumed_step() : -1, now});
      HandleCommandAck(*RunFor(a.run_id(), 0, now), a, now);
      break;
    }
    case trainwatch::v1::AgentMessage::kHeartbeat:
    case trainwatch::v1::AgentMessage::KIND_NOT_SET:
      break;
  }
}

void Ingestor::HandleStep(RunState& run, const StepReport& r, uint64_t stream, int64_t now) {
  {
    absl::MutexLock lock(&snap_mu_);
    stats_.records_total++;
  }
  auto& ack = acks_[{stream, r.run_id(), r.rank()}];
  ack = std::max(ack, r.step());
  const bool rank_scope = r.scope() == trainwatch::v1::REPORT_SCOPE_RANK;
  if (!run.mode_known) {
    run.mode_known = true;
    run.rank_mode = rank_scope;
  }
  if (rank_scope) {
    // Durable on its own (dedup by run, attempt, step, rank in the store).
    batch_.rank_steps.push_back(
        {run.row.run_id, run.row.attempt, r.rank(), r.step(), r.SerializeAsString()});
    if (!run.rank_mode) return;  // a rank-specific extra next to the global record
    if (r.step() <= run.row.last_step) {
      absl::MutexLock lock(&snap_mu_);
      stats_.duplicates_total++;
      return;
    }
    if (r.rank() < 0 || r.rank() >= run.row.world_size) {
      LOG(WARNING) << "run " << run.row.run_id << ": rank " << r.rank()
                   << " outside world size " << run.row.world_size << "; record stored only";
      absl::MutexLock lock(&snap_mu_);
      stats_.rejected_total++;
      return;
    }
    if (!run.pending.try_emplace(r.step(), now).first->second.Add(r.rank(),
                                                                   wire::StepFromProto(r))) {
      absl::MutexLock lock(&snap_mu_);
      stats_.duplicates_total++;
    }
    return;
  }
  const wire::ReportedStep rep = wire::StepFromProto(r);
  StepRow s = GlobalStep(rep);
  s.received_ms = now;
  if (r.step() <= run.row.last_step) {
    // Already evaluated: a re-send after a reconnect (ignored by the store)
    // or a record that arrived after later ones (stored, not evaluated).
    s.late = true;
    s.decision = rep.update_skipped ? static_cast<int>(core::Decision::kSkipUpdate) : 0;
    batch_.steps.push_back({run.row.run_id, run.row.attempt, std::move(s)});
    absl::MutexLock lock(&snap_mu_);
    stats_.duplicates_total++;
    return;
  }
  Evaluate(run, std::move(s), now, rep.tensors);
}

void Ingestor::CompletePending(RunState& run, int64_t now, bool force) {
  while (!run.pending.empty()) {
    auto it = run.pending.begin();
    const StepAggregate& p = it->second;
    const bool complete = p.count() >= run.row.world_size;
    const bool timed_out = now - p.first_ms() >= options_.aggregation_timeout_ms;
    if (!complete && !timed_out && !force) break;
    StepRow s = p.Finish(it->first, run.row.world_size);
    s.received_ms = now;
    if (!s.missing_ranks.empty()) {
      ++run.missing_rank_steps_total;
      LOG(WARNING) << "run " << run.row.run_id << " step " << it->first
                   << " completed without ranks " << s.missing_ranks;
    }
    run.pending.erase(it);
    Evaluate(run, std::move(s), now);
  }
}

void Ingestor::Evaluate(RunState& run, StepRow s, int64_t now,
                        absl::Span<const core::TensorStat> tensors) {
  core::StepRecord rec = s.View();
  rec.tensors = tensors;
  if (absl::Status st = run.engine->Observe(rec, &run.out); !st.ok()) {
    LOG(WARNING) << "run " << run.row.run_id << ": " << st;
    return;
  }
  s.loss_ema_ratio = run.out.loss_ema_ratio;
  s.decision = static_cast<int>(run.out.verdict.decision);
  if (run.out.verdict.decision == core::Decision::kSkipUpdate) ++run.skipped_total;
  run.row.last_step = s.step;
  run.row_dirty = true;
  run.latest = s;
  run.has_latest = true;
  batch_.steps.push_back({run.row.run_id, run.row.attempt, std::move(s)});
  if (!run.out.events.empty()) {
    run.incidents.OnEvents(run.row.attempt, run.out.events, now, &ids_, sink());
  }
  run.incidents.OnEvaluated(run.row.last_step, now, sink());
}

void Ingestor::PublishSnapshot() {
  std::vector<RunSnapshot> snap;
  snap.reserve(runs_.size());
  for (const auto& [id, r] : runs_) {
    RunSnapshot s;
    s.row = r->row;
    s.rank_mode = r->rank_mode;
    s.latest = r->latest;
    s.has_latest = r->has_latest;
    s.skipped_total = r->skipped_total;
    s.missing_rank_steps_total = r->missing_rank_steps_total;
    for (int t = 0; t < 4; ++t) s.incidents_total[t] = r->incidents.totals()[t];
    for (const auto& [ep, inc] : r->incidents.open()) {
      s.open_incidents[std::clamp(inc.tier, 0, 3)]++;
    }
    snap.push_back(std::move(s));
  }
  absl::MutexLock lock(&snap_mu_);
  snapshot_ = std::move(snap);
}

std::vector<RunSnapshot> Ingestor::Snapshot() const {
  absl::MutexLock lock(&snap_mu_);
  return snapshot_;
}

IngestStats Ingestor::Stats() const {
  IngestStats s;
  {
    absl::MutexLock lock(&snap_mu_);
    s = stats_;
  }
  absl::MutexLock lock(&mu_);
  s.queue_depth = static_cast<int64_t>(queue_.size());
  return s;
}

}  // namespace trainwatch::server
