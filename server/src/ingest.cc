#include "trainwatch/server/ingest.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "log.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainwatch/core/json.h"
#include "trainwatch/core/rule_engine.h"
#include "trainwatch/server/pager.h"

namespace trainwatch::server {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
using core::Signal;
using trainwatch::v1::StepReport;

// Per-rank records of one step, merged as they arrive.
struct Pending {
  int64_t first_ms = 0;
  std::vector<bool> seen;
  int32_t count = 0;
  double loss_sum = 0, logz_sum = 0;
  int loss_n = 0, logz_n = 0;
  bool loss_nonfinite = false, logz_nonfinite = false;
  double grad_max = -1;
  bool grad_seen = false, grad_nonfinite = false;
  int64_t nonfinite = 0, elements = 0;
  bool counts_seen = false;
  double nan_frac_max = -1;
  StoredStep extras;  // lr, z-loss, activation max, attention p99
  std::set<uint64_t> shards;
};

void Merge(Pending& p, const StepReport& r) {
  const auto& m = r.metrics();
  if (m.has_loss()) {
    if (std::isfinite(m.loss())) {
      p.loss_sum += m.loss();
      ++p.loss_n;
    } else {
      p.loss_nonfinite = true;
    }
  }
  if (m.has_log_z()) {
    if (std::isfinite(m.log_z())) {
      p.logz_sum += m.log_z();
      ++p.logz_n;
    } else {
      p.logz_nonfinite = true;
    }
  }
  if (m.has_grad_norm()) {
    p.grad_seen = true;
    if (std::isfinite(m.grad_norm())) {
      p.grad_max = std::max(p.grad_max, m.grad_norm());
    } else {
      p.grad_nonfinite = true;
    }
  }
  if (r.element_count() > 0) {
    p.counts_seen = true;
    p.nonfinite += static_cast<int64_t>(r.nonfinite_count());
    p.elements += static_cast<int64_t>(r.element_count());
  } else if (m.has_nan_frac()) {
    p.nan_frac_max = std::isfinite(m.nan_frac()) ? std::max(p.nan_frac_max, m.nan_frac()) : 1.0;
  }
  if (r.has_learning_rate()) p.extras.Set(Signal::kLearningRate, r.learning_rate());
  if (r.has_z_loss_alpha()) p.extras.Set(Signal::kZLossAlpha, r.z_loss_alpha());
  if (r.has_activation_max()) {
    const double prev = p.extras.Has(Signal::kActivationMax)
                            ? p.extras.Get(Signal::kActivationMax)
                            : -std::numeric_limits<double>::infinity();
    p.extras.Set(Signal::kActivationMax, std::max(prev, r.activation_max()));
  }
  for (double v : r.attention_logit_p99()) {
    const double prev = p.extras.Has(Signal::kAttentionLogitP99)
                            ? p.extras.Get(Signal::kAttentionLogitP99)
                            : -std::numeric_limits<double>::infinity();
    p.extras.Set(Signal::kAttentionLogitP99, std::isfinite(v) ? std::max(prev, v) : v);
  }
  for (uint64_t s : r.shard_ids()) p.shards.insert(s);
}

StoredStep FromPending(int64_t step, const Pending& p, int32_t world_size) {
  StoredStep s = p.extras;
  s.step = step;
  if (p.loss_nonfinite) {
    s.Set(Signal::kLoss, kNaN);
  } else if (p.loss_n > 0) {
    s.Set(Signal::kLoss, p.loss_sum / p.loss_n);
  }
  if (p.logz_nonfinite) {
    s.Set(Signal::kLogZ, kNaN);
  } else if (p.logz_n > 0) {
    s.Set(Signal::kLogZ, p.logz_sum / p.logz_n);
  }
  if (p.grad_seen) s.Set(Signal::kGradNorm, p.grad_nonfinite ? kNaN : p.grad_max);
  if (p.counts_seen) {
    s.nonfinite = p.nonfinite;
    s.elements = p.elements;
    s.Set(Signal::kNanFrac,
          p.elements > 0 ? static_cast<double>(p.nonfinite) / static_cast<double>(p.elements)
                         : 0.0);
  } else if (p.nan_frac_max >= 0) {
    s.Set(Signal::kNanFrac, p.nan_frac_max);
  }
  s.shards.assign(p.shards.begin(), p.shards.end());
  std::vector<int32_t> missing;
  for (int32_t r = 0; r < world_size; ++r) {
    if (r >= static_cast<int32_t>(p.seen.size()) || !p.seen[r]) missing.push_back(r);
  }
  s.missing_ranks = absl::StrJoin(missing, ",");
  return s;
}

StoredStep FromReport(const StepReport& r) {
  Pending p;
  Merge(p, r);
  StoredStep s = FromPending(r.step(), p, 0);
  // A global record carries nan_frac as reported when it has no counts.
  if (r.element_count() == 0 && r.metrics().has_nan_frac()) {
    s.Set(Signal::kNanFrac, r.metrics().nan_frac());
  }
  return s;
}

IncidentState InitialState(const core::Event& e) {
  if (e.action == core::Action::kPage || e.action == core::Action::kHalt) {
    return IncidentState::kAwaitingDecision;
  }
  // A transient is over when it is reported: a record, not a open matter.
  if (e.kind == core::EventKind::kTransient) return IncidentState::kResolved;
  return IncidentState::kOpen;
}

bool IsClosed(IncidentState s) {
  return s == IncidentState::kResolved || s == IncidentState::kDismissed;
}

}  // namespace

struct Ingestor::RunState {
  RunRow row;
  bool mode_known = false;
  bool rank_mode = false;
  std::unique_ptr<core::RuleEngine> engine;
  core::StepOutcome out;
  std::map<int64_t, Pending> pending;
  std::map<uint64_t, IncidentRow> incidents;  // by episode
  StoredStep latest;
  bool has_latest = false;
  bool row_dirty = false;
  int64_t skipped_total = 0;
  int64_t incidents_total[4] = {0, 0, 0, 0};
  int64_t missing_rank_steps_total = 0;
  // The approved rollback being carried out, until every rank applied it.
  struct ActiveCommand {
    std::string id;
    std::string message;  // the serialized ServerMessage
    int64_t incident_id = 0;
    int64_t target_step = 0;
    std::set<int32_t> applied, failed;
  };
  std::optional<ActiveCommand> command;
  // After a completed rollback: the incident resolves once the run passes
  // `until_step` without a new tier 2 or 3 event, and re-opens otherwise.
  struct Watch {
    int64_t incident_id = 0;
    uint64_t episode_key = 0;
    int64_t until_step = 0;
  };
  std::optional<Watch> watch;
  std::vector<std::pair<uint64_t, uint64_t>> quarantined;
};

namespace {
// Episode numbers restart with each attempt's fresh engine; incidents are
// keyed by both.
uint64_t EpisodeKey(int64_t attempt, uint64_t episode) {
  return (static_cast<uint64_t>(attempt) << 40) | episode;
}
}  // namespace

Ingestor::Ingestor(Store* store, const IngestOptions& options, Clock* clock)
    : store_(store), options_(options), clock_(clock) {}

Ingestor::~Ingestor() { Stop(); }

Ingestor::RunState* Ingestor::RunFor(const std::string& run_id, int32_t world_size,
                                     int64_t now) {
  auto it = runs_.find(run_id);
  if (it == runs_.end()) {
    auto rs = std::make_unique<RunState>();
    rs->row.run_id = run_id;
    rs->row.world_size = std::max(1, world_size);
    rs->row.created_ms = now;
    rs->row.last_seen_ms = now;
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
  next_incident_id_ = *max_id + 1;
  absl::StatusOr<int64_t> max_decision = store_->MaxDecisionId();
  if (!max_decision.ok()) return max_decision.status();
  next_decision_id_ = *max_decision + 1;
  for (const RunRow& row : *runs) {
    auto rs = std::make_unique<RunState>();
    rs->row = row;
    rs->engine = std::make_unique<core::RuleEngine>(options_.rules);
    RunState& r = *rs;
    int64_t steps = 0;
    absl::Status st = store_->ForEachStep(
        row.run_id, row.attempt, [&](const StoredStep& s, const std::string& ckpt) {
          core::StepRecord rec = s.View();
          rec.checkpoint_uri = ckpt;
          // Events were stored the first time; this only rebuilds state.
          if (r.engine->Observe(rec, &r.out).ok()) {
            r.latest = s;
            r.has_latest = true;
            r.skipped_total += s.decision == static_cast<int>(core::Decision::kSkipUpdate);
            ++steps;
          }
        });
    if (!st.ok()) return st;
    // Checkpoints reported apart from steps (and after the last one).
    absl::StatusOr<std::vector<CheckpointRow>> cks = store_->Checkpoints(row.run_id);
    if (!cks.ok()) return cks.status();
    for (const CheckpointRow& c : *cks) r.engine->NoteCheckpoint(c.step, c.uri);
    IncidentFilter f;
    f.run_id = row.run_id;
    f.limit = 1 << 30;
    absl::StatusOr<std::vector<IncidentRow>> inc = store_->ListIncidents(f);
    if (!inc.ok()) return inc.status();
    for (IncidentRow& i : *inc) {
      r.incidents_total[std::clamp(i.tier, 0, 3)]++;
      if (!IsClosed(i.state)) r.incidents[i.episode] = std::move(i);  // episode holds the key
    }
    // A rollback under way or completed and being watched.
    for (auto& [key, inc] : r.incidents) {
      if (inc.state != IncidentState::kRollingBack) continue;
      absl::StatusOr<std::optional<CommandRow>> cmd = store_->LatestCommand(inc.id);
      if (!cmd.ok()) return cmd.status();
      if (!cmd->has_value()) continue;
      trainwatch::v1::ServerMessage msg;
      msg.mutable_command()->ParseFromString((*cmd)->payload);
      RunState::ActiveCommand ac;
      ac.id = (*cmd)->id;
      ac.message = msg.SerializeAsString();
      ac.incident_id = inc.id;
      ac.target_step = msg.command().rollback().target_step();
      absl::StatusOr<std::vector<CommandAckRow>> acks = store_->CommandAcks(ac.id);
      if (!acks.ok()) return acks.status();
      for (const CommandAckRow& a : *acks) {
        if (a.status == trainwatch::v1::ACK_STATUS_APPLIED) ac.applied.insert(a.rank);
        if (a.status == trainwatch::v1::ACK_STATUS_FAILED) ac.failed.insert(a.rank);
      }
      if (static_cast<int32_t>(ac.applied.size()) >= row.world_size) {
        r.watch = RunState::Watch{inc.id, key, inc.detection_step};
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
      Pending& p = r.pending[rk.step];
      if (p.first_ms == 0) p.first_ms = clock_->NowMs();
      if (static_cast<int32_t>(p.seen.size()) < row.world_size) p.seen.resize(row.world_size);
      if (rk.rank < row.world_size && !p.seen[rk.rank]) {
        p.seen[rk.rank] = true;
        ++p.count;
        Merge(p, rep);
      }
    }
    if (!r.mode_known && steps > 0) r.mode_known = true;
    LOG(INFO) << "recovered run " << row.run_id << ": " << steps << " steps, "
              << r.incidents.size() << " open incidents, " << r.pending.size()
              << " pending steps";
    runs_.emplace(row.run_id, std::move(rs));
  }
  PublishSnapshot();
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
      absl::StatusOr<core::JsonValue> actions = core::ParseJson(inc.actions_json, "actions");
      if (actions.ok()) {
        for (const core::JsonValue& a : actions->array) {
          if (const core::JsonValue* t = a.Find("text")) absl::StrAppend(&summary, " ", t->string, ".");
        }
      }
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
      // A (re)connected rank gets what it has not applied yet.
      if (!run->quarantined.empty()) {
        outgoing_.emplace_back(run->row.run_id, item.stream_id, QuarantineMessage(*run));
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
    Pending& p = run.pending[r.step()];
    if (p.first_ms == 0) p.first_ms = now;
    if (static_cast<int32_t>(p.seen.size()) < run.row.world_size) {
      p.seen.resize(run.row.world_size);
    }
    if (p.seen[r.rank()]) {
      absl::MutexLock lock(&snap_mu_);
      stats_.duplicates_total++;
      return;
    }
    p.seen[r.rank()] = true;
    ++p.count;
    Merge(p, r);
    return;
  }
  StoredStep s = FromReport(r);
  s.received_ms = now;
  if (r.step() <= run.row.last_step) {
    // Already evaluated: a re-send after a reconnect (ignored by the store)
    // or a record that arrived after later ones (stored, not evaluated).
    s.late = true;
    s.decision = r.update_skipped() ? static_cast<int>(core::Decision::kSkipUpdate) : 0;
    batch_.steps.push_back({run.row.run_id, run.row.attempt, std::move(s)});
    absl::MutexLock lock(&snap_mu_);
    stats_.duplicates_total++;
    return;
  }
  std::vector<core::TensorStat> tensors;
  tensors.reserve(static_cast<size_t>(r.tensors_size()));
  for (const auto& t : r.tensors()) {
    tensors.push_back({t.name(), t.sum_squares(), static_cast<int64_t>(t.nonfinite_count()),
                       static_cast<int64_t>(t.element_count())});
  }
  Evaluate(run, std::move(s), now, tensors);
}

void Ingestor::CompletePending(RunState& run, int64_t now, bool force) {
  while (!run.pending.empty()) {
    auto it = run.pending.begin();
    const Pending& p = it->second;
    const bool complete = p.count >= run.row.world_size;
    const bool timed_out = now - p.first_ms >= options_.aggregation_timeout_ms;
    if (!complete && !timed_out && !force) break;
    StoredStep s = FromPending(it->first, p, run.row.world_size);
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

void Ingestor::Evaluate(RunState& run, StoredStep s, int64_t now,
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
  if (!run.out.events.empty()) RecordEvents(run, run.out.events, now);
  if (run.watch && run.row.last_step >= run.watch->until_step) {
    auto w = run.incidents.find(run.watch->episode_key);
    if (w != run.incidents.end()) {
      IncidentRow inc = w->second;
      inc.state = IncidentState::kResolved;
      inc.closed_ms = now;
      inc.updated_ms = now;
      RecordIncident(inc, IncidentChange::kStateChanged);
      run.incidents.erase(w);
    }
    run.watch.reset();
  }
}

std::string Ingestor::QuarantineMessage(const RunState& run) const {
  trainwatch::v1::ServerMessage m;
  auto* q = m.mutable_quarantined_shards();
  q->set_run_id(run.row.run_id);
  q->set_version(static_cast<int64_t>(run.quarantined.size()));
  for (const auto& [first, last] : run.quarantined) {
    auto* r = q->mutable_shards()->add_ranges();
    r->set_first(first);
    r->set_last(last);
  }
  return m.SerializeAsString();
}

void Ingestor::SendPendingCommand(RunState& run, uint64_t stream, int32_t rank) {
  if (!run.command || run.command->applied.count(rank) > 0) return;
  outgoing_.emplace_back(run.row.run_id, stream, run.command->message);
}

void Ingestor::HandleCommandAck(RunState& run, const trainwatch::v1::CommandAck& a,
                                int64_t now) {
  if (!run.command || a.command_id() != run.command->id) return;
  if (a.status() == trainwatch::v1::ACK_STATUS_APPLIED) {
    run.command->applied.insert(a.rank());
    run.command->failed.erase(a.rank());
  } else if (a.status() == trainwatch::v1::ACK_STATUS_FAILED) {
    run.command->failed.insert(a.rank());
    LOG(WARNING) << "run " << run.row.run_id << ": rank " << a.rank() << " failed command "
                 << a.command_id() << ": " << a.message();
  }
  if (static_cast<int32_t>(run.command->applied.size()) >= run.row.world_size) {
    CompleteRollback(run, now);
  }
}

void Ingestor::CompleteRollback(RunState& run, int64_t now) {
  const RunState::ActiveCommand cmd = *run.command;
  run.command.reset();
  const int64_t old_attempt = run.row.attempt;
  const int64_t target = cmd.target_step;
  // A new attempt: its history is the old one's up to the checkpoint, and
  // the engine is rebuilt from exactly that.
  batch_.attempt_copies.push_back({run.row.run_id, old_attempt, old_attempt + 1, target});
  run.engine = std::make_unique<core::RuleEngine>(options_.rules);
  run.has_latest = false;
  int64_t fed = 0;
  absl::Status st = store_->ForEachStep(
      run.row.run_id, old_attempt, [&](const StoredStep& s, const std::string& ckpt) {
        if (s.step > target) return;
        core::StepRecord rec = s.View();
        rec.checkpoint_uri = ckpt;
        if (run.engine->Observe(rec, &run.out).ok()) {
          run.latest = s;
          run.has_latest = true;
          ++fed;
        }
      });
  if (!st.ok()) LOG(ERROR) << "run " << run.row.run_id << ": rebuilding after rollback: " << st;
  absl::StatusOr<std::vector<CheckpointRow>> cks = store_->Checkpoints(run.row.run_id);
  if (cks.ok()) {
    for (const CheckpointRow& c : *cks) {
      if (c.step <= target) run.engine->NoteCheckpoint(c.step, c.uri);
    }
  }
  run.row.attempt = old_attempt + 1;
  run.row.last_step = target;
  run.row_dirty = true;
  run.pending.clear();
  for (auto& [key, inc] : run.incidents) {
    if (inc.id != cmd.incident_id) continue;
    inc.updated_ms = now;
    RecordIncident(inc, IncidentChange::kUpdated);
    run.watch = RunState::Watch{inc.id, key, inc.detection_step};
  }
  LOG(INFO) << "run " << run.row.run_id << ": rollback " << cmd.id << " applied by all "
            << run.row.world_size << " ranks; attempt " << run.row.attempt << " resumes after step "
            << target << " (" << fed << " steps of history)";
}

std::optional<std::pair<int64_t, int64_t>> Ingestor::DefaultSkipSteps(
    const IncidentRow& incident, int64_t checkpoint_step) const {
  // A numerical failure is no batch's fault.
  if (incident.tier != 2) return std::nullopt;
  const int64_t first = std::max(incident.onset_step - options_.rules.shard_steps_before_onset,
                                 checkpoint_step + 1);
  if (first > incident.detection_step) return std::nullopt;
  return std::make_pair(first, incident.detection_step);
}

void Ingestor::RecordIncident(const IncidentRow& incident, IncidentChange change) {
  batch_.incidents.push_back(incident);
  changed_incidents_.emplace_back(incident, change);
}

void Ingestor::RecordEvents(RunState& run, const std::vector<core::Event>& events,
                            int64_t now) {
  for (const core::Event& e : events) {
    const uint64_t key = EpisodeKey(run.row.attempt, e.episode);
    if (run.watch && e.tier >= 2 && e.action != core::Action::kNone) {
      // The failure came back after the rollback: the incident re-opens.
      auto w = run.incidents.find(run.watch->episode_key);
      if (w != run.incidents.end()) {
        w->second.state = IncidentState::kAwaitingDecision;
        w->second.updated_ms = now;
        w->second.title = absl::StrCat("recurred after rollback: ", w->second.title);
        RecordIncident(w->second, IncidentChange::kStateChanged);
      }
      run.watch.reset();
    }
    auto it = run.incidents.find(key);
    bool opened = false;
    if (it == run.incidents.end()) {
      if (e.action == core::Action::kNone) {
        // A note about an episode whose incident already closed.
        batch_.events.push_back({run.row.run_id, 0, e, now});
        continue;
      }
      IncidentRow inc;
      inc.id = next_incident_id_++;
      inc.run_id = run.row.run_id;
      inc.episode = key;
      inc.tier = e.tier;
      inc.state = InitialState(e);
      inc.kind = e.kind;
      inc.onset_step = e.onset_step;
      inc.opened_ms = now;
      if (IsClosed(inc.state)) inc.closed_ms = now;
      it = run.incidents.emplace(key, std::move(inc)).first;
      run.incidents_total[std::clamp(e.tier, 0, 3)]++;
      opened = true;
    }
    IncidentRow& inc = it->second;
    const IncidentState before = inc.state;
    if (opened && (e.action == core::Action::kSkipUpdate || e.action == core::Action::kHalt)) {
      // The agents acted on their own (same rules, same numbers): recorded
      // like a human decision, with the rule as the actor.
      const int64_t did = next_decision_id_++;
      trainwatch::v1::Decision d;
      d.set_decision_id(absl::StrCat("D-", did));
      d.set_incident_id(inc.public_id());
      d.set_run_id(run.row.run_id);
      d.mutable_actor()->set_kind(trainwatch::v1::ACTOR_KIND_SERVER);
      d.mutable_actor()->set_id(absl::StrCat("rule:", core::EventKindName(e.kind)));
      d.mutable_actor()->set_via("agent");
      d.mutable_decided_at()->set_seconds(now / 1000);
      d.set_comment(e.reason);
      batch_.decisions.push_back({did, inc.id, run.row.run_id, d.actor().id(),
                                  e.action == core::Action::kHalt ? "halt" : "skip_update",
                                  e.reason, d.SerializeAsString(), "", now});
    }
    if (e.action != core::Action::kNone && (opened || e.tier >= inc.tier)) {
      // The event with the highest tier so far defines the incident.
      if (e.tier > inc.tier) run.incidents_total[std::clamp(e.tier, 0, 3)]++;
      inc.tier = e.tier;
      inc.kind = e.kind;
      inc.title = absl::StrFormat("tier %d %s at step %d: %s", e.tier,
                                  core::EventKindName(e.kind), e.step, e.reason);
      if (inc.title.size() > 240) inc.title = inc.title.substr(0, 237) + "...";
      inc.onset_step = std::min(inc.onset_step, e.onset_step);
      inc.detection_step = e.step;
      inc.recommended_checkpoint_step = e.recommended_checkpoint_step;
      inc.recommended_checkpoint_uri = e.recommended_checkpoint_uri;
      if (!e.shards.empty()) inc.shards = e.shards;
      inc.actions_json.clear();
      core::AppendRecommendedActionsJson(&inc.actions_json, e.recommended_actions);
      if (!opened && (e.action == core::Action::kPage || e.action == core::Action::kHalt) &&
          !IsClosed(inc.state) && inc.state != IncidentState::kRollingBack) {
        inc.state = IncidentState::kAwaitingDecision;
      }
    }
    if (e.closes_episode && !IsClosed(inc.state) && inc.state != IncidentState::kRollingBack) {
      inc.state = IncidentState::kResolved;
      inc.closed_ms = now;
    }
    inc.updated_ms = now;
    batch_.events.push_back({run.row.run_id, inc.id, e, now});
    RecordIncident(inc, opened                 ? IncidentChange::kOpened
                        : inc.state != before ? IncidentChange::kStateChanged
                                              : IncidentChange::kUpdated);
    if (IsClosed(inc.state)) run.incidents.erase(it);
  }
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
    for (int t = 0; t < 4; ++t) s.incidents_total[t] = r->incidents_total[t];
    for (const auto& [ep, inc] : r->incidents) s.open_incidents[std::clamp(inc.tier, 0, 3)]++;
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

namespace trainwatch::server {

void Ingestor::Decide(DecisionRequest request, std::function<void(DecisionOutcome)> done) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back({std::move(request), std::move(done)});
}

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

}  // namespace

DecisionOutcome Ingestor::RunDecision(const DecisionRequest& r, int64_t now) {
  namespace v1 = trainwatch::v1;
  DecisionOutcome out;
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
  RunState* run = nullptr;
  IncidentRow* live = nullptr;
  for (auto& [id, rs] : runs_) {
    for (auto& [key, inc] : rs->incidents) {
      if (inc.id == r.incident_id) {
        run = rs.get();
        live = &inc;
      }
    }
  }
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
  }
  const IncidentRow& inc = live != nullptr ? *live : stored;
  out.state = inc.state;
  // What was decided before, for refusals that say who and when.
  absl::StatusOr<std::vector<DecisionRow>> prior = store_->DecisionsOfIncident(inc.id);
  std::string earlier;
  const DecisionRow* human = nullptr;
  if (prior.ok()) {
    for (const DecisionRow& d : *prior) {
      if (d.kind == "approve_rollback" || d.kind == "reject_rollback") human = &d;
    }
  }
  if (human != nullptr) {
    const DecisionRow& d = *human;
    earlier = absl::StrFormat(" (%s by %s, D-%d: \"%s\")",
                              d.kind == "approve_rollback" ? "approved" : "rejected", d.actor,
                              d.id, d.comment);
  }
  if (r.approve && inc.tier < 2) {
    out.status = absl::FailedPreconditionError(absl::StrCat(
        pub, " is tier ", inc.tier, " (", StateWord(inc.state),
        "): tier 0 and 1 incidents are handled in place and need no rollback"));
    return out;
  }
  if (inc.state == IncidentState::kDismissed) {
    out.status = absl::FailedPreconditionError(
        absl::StrCat(pub, " was rejected", earlier, ": ", r.approve ? "approving" : "rejecting",
                     " it again changes nothing"));
    return out;
  }
  if (inc.state == IncidentState::kRollingBack) {
    out.status = absl::FailedPreconditionError(absl::StrCat(
        pub, " is already rolling back", earlier, ": a second decision changes nothing"));
    return out;
  }
  if (inc.state == IncidentState::kResolved) {
    out.status = absl::FailedPreconditionError(
        absl::StrCat(pub, " is resolved", earlier, ": nothing to decide"));
    return out;
  }
  if (run == nullptr) {
    out.status = absl::FailedPreconditionError(absl::StrCat(pub, " is not open"));
    return out;
  }
  const int64_t decision_id = next_decision_id_;
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
  std::vector<std::pair<uint64_t, uint64_t>> quarantine;
  std::optional<double> z_loss;
  if (r.approve) {
    // The checkpoint: the operator's, which must be one the run still
    // retains, or the recommendation.
    absl::StatusOr<std::vector<CheckpointRow>> cks = store_->Checkpoints(inc.run_id);
    if (!cks.ok()) {
      out.status = cks.status();
      return out;
    }
    const size_t keep = static_cast<size_t>(options_.rules.checkpoints_retained);
    std::vector<CheckpointRow> retained(
        cks->size() > keep ? cks->end() - static_cast<std::ptrdiff_t>(keep) : cks->begin(),
        cks->end());
    const int64_t target = r.to_step.value_or(inc.recommended_checkpoint_step);
    const CheckpointRow* ck = nullptr;
    for (const CheckpointRow& c : retained) {
      if (c.step == target) ck = &c;
    }
    if (ck == nullptr) {
      std::vector<int64_t> steps;
      for (const CheckpointRow& c : retained) steps.push_back(c.step);
      out.status = (r.to_step ? absl::InvalidArgumentError("") : absl::FailedPreconditionError(""));
      out.status = absl::Status(
          out.status.code(),
          absl::StrCat(r.to_step ? absl::StrCat("step ", target, " is not")
                                 : absl::StrCat(pub, " has no recommended checkpoint that is"),
                       " a retained checkpoint of run ", inc.run_id, " (retained: ",
                       steps.empty() ? "none" : absl::StrJoin(steps, ", "),
                       "); pass --to-step with one of them"));
      return out;
    }
    // Quarantine and settings: the operator's, or the recommendation.
    absl::StatusOr<core::JsonValue> actions = core::ParseJson(inc.actions_json, "actions");
    if (r.quarantine) {
      quarantine = *r.quarantine;
    } else if (actions.ok()) {
      for (const core::JsonValue& a : actions->array) {
        const core::JsonValue* k = a.Find("kind");
        if (k != nullptr && k->string == "quarantine_shards") {
          quarantine.emplace_back(static_cast<uint64_t>(a.Find("shard_first")->number),
                                  static_cast<uint64_t>(a.Find("shard_last")->number));
        }
      }
    }
    if (r.z_loss_alpha) {
      z_loss = r.z_loss_alpha;
    } else if (actions.ok()) {
      for (const core::JsonValue& a : actions->array) {
        const core::JsonValue* k = a.Find("kind");
        if (k != nullptr && k->string == "set_z_loss_alpha") z_loss = a.Find("z_loss_alpha")->number;
      }
    }
    // The batches every rank skips: the operator's steps, or the default.
    std::optional<std::pair<int64_t, int64_t>> skip;
    if (r.skip_steps) {
      if (r.skip_steps->first < 0) {
        out.status = absl::InvalidArgumentError("skip_steps must not start below step 0");
        return out;
      }
      if (r.skip_steps->second >= r.skip_steps->first) skip = r.skip_steps;
      if (skip) skip->first = std::max(skip->first, ck->step + 1);
    } else {
      skip = DefaultSkipSteps(inc, ck->step);
    }
    auto* plan = d.mutable_plan();
    plan->set_incident_id(pub);
    plan->set_target_step(ck->step);
    plan->set_checkpoint_uri(ck->uri);
    if (skip && skip->second >= skip->first) {
      plan->mutable_skip_steps()->set_first(skip->first);
      plan->mutable_skip_steps()->set_last(skip->second);
    }
    for (const auto& [first, last] : quarantine) {
      auto* range = plan->mutable_quarantine()->add_ranges();
      range->set_first(first);
      range->set_last(last);
    }
    if (z_loss) plan->add_settings()->set_z_loss_alpha(*z_loss);
    d.set_command_id(absl::StrCat("C-", decision_id));
  }
  out.decision = d.SerializeAsString();
  if (r.dry_run) return out;  // what would happen; nothing recorded

  ++next_decision_id_;
  batch_.decisions.push_back({decision_id, inc.id, inc.run_id, r.actor,
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
    batch_.commands.push_back(
        {d.command_id(), inc.run_id, inc.id, "rollback", c->SerializeAsString(), now});
    for (const auto& [first, last] : quarantine) {
      batch_.quarantines.push_back({inc.run_id, first, last, inc.id, decision_id, now});
      run->quarantined.emplace_back(first, last);
    }
    RunState::ActiveCommand ac;
    ac.id = d.command_id();
    ac.message = msg.SerializeAsString();
    ac.incident_id = inc.id;
    ac.target_step = d.plan().target_step();
    run->command = ac;
    outgoing_.emplace_back(inc.run_id, 0, ac.message);
    if (!quarantine.empty()) outgoing_.emplace_back(inc.run_id, 0, QuarantineMessage(*run));
  } else {
    updated.state = IncidentState::kDismissed;
    updated.closed_ms = now;
  }
  out.state = updated.state;
  RecordIncident(updated, updated.state != inc.state ? IncidentChange::kStateChanged
                                                     : IncidentChange::kUpdated);
  if (live != nullptr) {
    if (IsClosed(updated.state)) {
      for (auto it = run->incidents.begin(); it != run->incidents.end(); ++it) {
        if (it->second.id == inc.id) {
          run->incidents.erase(it);
          break;
        }
      }
    } else {
      *live = updated;
    }
  }
  return out;
}

}  // namespace trainwatch::server
