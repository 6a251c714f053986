// The runs the writer holds (run_table.h): creating a run, rebuilding one
// from the store, evicting the least recently used, and every run's view.

#include "ingest/run_table.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace trainwatch::server {

using trainwatch::v1::StepReport;

namespace {

// Every incident of the run, the ones not closed open again.
absl::Status RestoreIncidents(Store* store, IncidentTracker* tracker, const std::string& run_id) {
  IncidentFilter f;
  f.run_id = run_id;
  f.limit = 1 << 30;
  absl::StatusOr<std::vector<IncidentRow>> inc = store->ListIncidents(f);
  if (!inc.ok()) return inc.status();
  tracker->Restore(*std::move(inc));
  return absl::OkStatus();
}

}  // namespace

RunState* RunTable::Get(const std::string& run_id, int32_t world_size, int64_t now,
                        bool create) {
  auto it = runs_.find(run_id);
  if (it == runs_.end()) {
    auto evicted = evicted_.find(run_id);
    if (evicted == evicted_.end() && !create) return nullptr;
    MakeRoom();
    if (evicted != evicted_.end()) {
      if (RebuildEvicted(evicted) == nullptr) return nullptr;
      views_->Count(&IngestStats::runs_rebuilt_total);
    } else {
      RunRow row;
      row.run_id = run_id;
      row.world_size = std::max(1, world_size);
      row.created_ms = now;
      row.last_seen_ms = now;
      auto rs = std::make_unique<RunState>(row);
      rules_->Assign(*rs);
      rs->engine = std::make_unique<core::RuleEngine>(rs->rules);
      rs->row_dirty = true;
      runs_.emplace(run_id, std::move(rs));
    }
    it = runs_.find(run_id);
  }
  RunState& r = *it->second;
  r.last_batch = batch_seq_;
  if (world_size > r.row.world_size) {
    r.row.world_size = world_size;
    r.row_dirty = true;
  }
  r.row.last_seen_ms = now;
  return &r;
}

RunState* RunTable::RebuildEvicted(std::map<std::string, RunRow>::iterator it) {
  const std::string run_id = it->first;
  absl::StatusOr<RunState*> rebuilt = RecoverRun(it->second);
  if (!rebuilt.ok()) {
    LOG(ERROR) << "run " << run_id << ": rebuilding from the store: " << rebuilt.status();
    return nullptr;
  }
  evicted_.erase(it);
  rebuilding_.erase(run_id);
  RunState& run = **rebuilt;
  views_->Edit([&](std::map<std::string, RunView>& views, IngestStats& stats) {
    // Not rebuilt from the store: carried over from the view.
    run.missing_rank_steps_total = views[run_id].missing_rank_steps_total;
    // Readers see the rebuilt run at once, not after the next batch.
    views[run_id] = ViewOf(run);
    stats.runs_rebuilding = static_cast<int64_t>(rebuilding_.size());
    stats.runs_in_memory = static_cast<int64_t>(runs_.size());
  });
  return &run;
}

bool RunTable::RebuildNextAtStartup() {
  const size_t bound = std::max<size_t>(1, options_->max_runs_in_memory);
  while (startup_next_ < startup_order_.size()) {
    const std::string& id = startup_order_[startup_next_++];
    auto it = evicted_.find(id);
    if (it == evicted_.end()) continue;  // rebuilt on demand already
    // New runs took the room: a background rebuild evicts none of them, the
    // rest are rebuilt on demand like any evicted run. A run whose rebuild
    // failed (logged) is left the same way.
    if (runs_.size() < bound && RebuildEvicted(it) != nullptr) return true;
    rebuilding_.erase(id);
    views_->Edit([&](std::map<std::string, RunView>& views, IngestStats& stats) {
      views[id].rebuilding = false;
      stats.runs_rebuilding = static_cast<int64_t>(rebuilding_.size());
    });
  }
  return false;
}

void RunTable::MakeRoom() {
  const size_t bound = std::max<size_t>(1, options_->max_runs_in_memory);
  while (runs_.size() >= bound) {
    // The least recently used run this batch has not touched, an idle one
    // (no step waiting for ranks, no rollback under way) before a busy one.
    auto victim = runs_.end();
    auto key = [](const RunState& r) {
      return std::make_pair(!r.pending.empty() || r.command.has_value(), r.last_batch);
    };
    for (auto it = runs_.begin(); it != runs_.end(); ++it) {
      if (it->second->last_batch == batch_seq_) continue;
      if (victim == runs_.end() || key(*it->second) < key(*victim->second)) victim = it;
    }
    // Ingestor::ProcessInBatches keeps this from happening.
    if (victim == runs_.end()) return;
    // Its rebuild, when it streams again, starts from here.
    snapshots_->MaybeSave(*victim->second, /*force=*/true, clock_->NowMs());
    views_->Edit([&](std::map<std::string, RunView>& views, IngestStats& stats) {
      views[victim->first] = ViewOf(*victim->second);
      stats.runs_evicted_total++;
    });
    evicted_.emplace(victim->first, victim->second->row);
    runs_.erase(victim);
  }
}

absl::Status RunTable::Recover() {
  absl::StatusOr<std::vector<RunRow>> runs = store_->LoadRuns();
  if (!runs.ok()) return runs.status();
  absl::StatusOr<int64_t> max_id = store_->MaxIncidentId();
  if (!max_id.ok()) return max_id.status();
  batch_->ids.next_incident = *max_id + 1;
  absl::StatusOr<int64_t> max_decision = store_->MaxDecisionId();
  if (!max_decision.ok()) return max_decision.status();
  batch_->ids.next_decision = *max_decision + 1;
  // The most recently seen runs are the likeliest to stream again.
  std::stable_sort(runs->begin(), runs->end(), [](const RunRow& a, const RunRow& b) {
    return a.last_seen_ms > b.last_seen_ms;
  });
  // Nothing is replayed here, so that the port opens at once: every run
  // starts evicted with its stored figures, and the writer thread rebuilds
  // those that fit (run_table.h).
  const size_t bound = std::max<size_t>(1, options_->max_runs_in_memory);
  for (size_t i = 0; i < runs->size(); ++i) {
    const RunRow& row = (*runs)[i];
    absl::StatusOr<RunView> snap = StoredView(store_, row);
    if (!snap.ok()) return snap.status();
    evicted_.emplace(row.run_id, row);
    if (i < bound) {
      snap->rebuilding = true;
      startup_order_.push_back(row.run_id);
      rebuilding_.insert(row.run_id);
    }
    views_->Set(row.run_id, *std::move(snap));
  }
  if (!runs->empty()) {
    LOG(INFO) << "rebuilding " << startup_order_.size() << " of " << runs->size()
              << " runs in the background"
              << (runs->size() > bound ? "; the others when they stream again" : "");
  }
  views_->Edit([&](std::map<std::string, RunView>&, IngestStats& stats) {
    stats.runs_rebuilding = static_cast<int64_t>(rebuilding_.size());
  });
  Publish();
  return absl::OkStatus();
}

absl::StatusOr<RunState*> RunTable::RecoverRun(const RunRow& row) {
  auto rs = std::make_unique<RunState>(row);
  RunState& r = *rs;
  if (absl::Status st = rules_->Restore(r); !st.ok()) return st;
  // From the attempt's newest engine snapshot, when one is usable.
  absl::StatusOr<EngineReplay> replay =
      snapshots_->StartReplay(row.run_id, row.attempt, std::numeric_limits<int64_t>::max(), r.rules);
  if (!replay.ok()) return replay.status();
  absl::Status st = store_->ForEachStep(
      row.run_id, row.attempt,
      [&](const StepRow& s, const std::string& ckpt) {
        if (replay->Feed(s, ckpt) || s.step == replay->snapshot_step) {
          r.latest = s;
          r.has_latest = true;
        }
      },
      replay->after());
  if (!st.ok()) return st;
  // Checkpoints reported apart from steps (and after the last one).
  absl::StatusOr<std::vector<CheckpointRow>> cks = store_->Checkpoints(row.run_id);
  if (!cks.ok()) return cks.status();
  for (const CheckpointRow& c : *cks) replay->rebuild.NoteCheckpoint(c.step, c.uri);
  const int64_t steps = replay->rebuild.fed();
  (row.observed ? r.skips_recommended_total : r.skipped_total) = r.attempt_skipped =
      replay->skipped;
  r.loss_scale_overflows_total = r.attempt_overflows = replay->overflows;
  r.snapshot_step = replay->snapshot_step;
  r.engine = std::move(replay->rebuild).Finish();
  if (absl::Status st = RestoreIncidents(store_, &r.incidents, row.run_id); !st.ok()) return st;
  absl::StatusOr<std::vector<std::string>> incarnations = store_->Incarnations(row.run_id);
  if (!incarnations.ok()) return incarnations.status();
  r.incarnations.insert(incarnations->begin(), incarnations->end());
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
    ac.world_size = row.world_size;
    // Only this run's agents' acknowledgements count.
    absl::StatusOr<std::vector<CommandAckRow>> acks = store_->CommandAcks(row.run_id, ac.id);
    if (!acks.ok()) return acks.status();
    bool complete = false;
    for (const CommandAckRow& a : *acks) {
      complete = ac.OnAck(a.rank, static_cast<trainwatch::v1::AckStatus>(a.status),
                          ac.world_size);
    }
    if (complete) {
      r.incidents.Watch(open.id, open.detection_step);
    } else {
      r.command = std::move(ac);
    }
  }
  absl::StatusOr<std::vector<QuarantineRow>> q = store_->Quarantines(row.run_id);
  if (!q.ok()) return q.status();
  for (const QuarantineRow& qr : *q) {
    if (qr.name.empty()) {
      r.quarantined.ranges.emplace_back(qr.first, qr.last);
    } else {
      r.quarantined.names.push_back(qr.name);
    }
  }
  // Per-rank records of steps not yet completed; one too far ahead was
  // refused when it came and stays so.
  absl::StatusOr<std::vector<RankStepRow>> ranks =
      store_->LoadRankStepsAfter(row.run_id, row.attempt, row.last_step);
  if (!ranks.ok()) return ranks.status();
  const int64_t base = std::max<int64_t>(row.last_step, 0);
  for (const RankStepRow& rk : *ranks) {
    StepReport rep;
    if (!rep.ParseFromString(rk.report)) continue;
    r.mode_known = true;
    r.rank_mode = true;
    if (rk.rank < 0 || rk.rank >= row.world_size) continue;
    if (rk.step - base > options_->max_step_jump) continue;
    r.pending.try_emplace(rk.step, clock_->NowMs())
        .first->second.Add(rk.rank, wire::StepFromProto(rep));
  }
  if (!r.mode_known && (steps > 0 || r.snapshot_step >= 0)) r.mode_known = true;
  LOG(INFO) << "recovered run " << row.run_id << ": "
            << (r.snapshot_step >= 0 ? absl::StrCat("the engine snapshot at step ",
                                                    r.snapshot_step, " and ")
                                     : std::string())
            << steps << " steps, "
            << r.incidents.open().size() << " open incidents, " << r.pending.size()
            << " pending steps";
  r.last_batch = batch_seq_;
  return runs_.insert_or_assign(row.run_id, std::move(rs)).first->second.get();
}

absl::StatusOr<RunView> RunTable::StoredView(Store* store, const RunRow& row) {
  RunState r(row);
  if (row.last_step >= 0) {
    absl::StatusOr<std::vector<StepRow>> last =
        store->StepsBetween(row.run_id, row.attempt, row.last_step, row.last_step);
    if (!last.ok()) return last.status();
    if (!last->empty()) {
      r.latest = last->back();
      r.has_latest = true;
    }
  }
  absl::StatusOr<int64_t> skipped = store->CountSkipped(row.run_id, row.attempt);
  if (!skipped.ok()) return skipped.status();
  (row.observed ? r.skips_recommended_total : r.skipped_total) = *skipped;
  absl::StatusOr<int64_t> overflows = store->CountLossScaleOverflows(row.run_id, row.attempt);
  if (!overflows.ok()) return overflows.status();
  r.loss_scale_overflows_total = *overflows;
  if (absl::Status st = RestoreIncidents(store, &r.incidents, row.run_id); !st.ok()) return st;
  return ViewOf(r);
}

RunView RunTable::ViewOf(const RunState& r) {
  RunView s;
  s.row = r.row;
  if (r.engine != nullptr && r.engine->first_step() >= 0) s.warm_up = r.engine->WarmUp();
  s.rank_mode = r.rank_mode;
  s.latest = r.latest;
  s.has_latest = r.has_latest;
  s.skipped_total = r.skipped_total;
  s.skips_recommended_total = r.skips_recommended_total;
  s.loss_scale_overflows_total = r.loss_scale_overflows_total;
  s.missing_rank_steps_total = r.missing_rank_steps_total;
  s.agent_decisions_total = r.agent_decisions_total;
  s.decision_divergences_total = r.decision_divergences_total;
  for (int t = 0; t < 4; ++t) s.incidents_total[t] = r.incidents.totals()[t];
  for (const auto& [ep, inc] : r.incidents.open()) {
    s.open_incidents[std::clamp(inc.tier, 0, 3)]++;
  }
  return s;
}

void RunTable::Publish() {
  // Only the runs held can have changed; evicted ones keep theirs.
  views_->Edit([&](std::map<std::string, RunView>& views, IngestStats& stats) {
    for (const auto& [id, r] : runs_) views[id] = ViewOf(*r);
    stats.runs_in_memory = static_cast<int64_t>(runs_.size());
  });
}

std::pair<RunState*, IncidentRow*> RunTable::FindOpenIncident(int64_t incident_id) {
  for (auto& [id, rs] : runs_) {
    if (IncidentRow* found = rs->incidents.FindOpen(incident_id)) return {rs.get(), found};
  }
  return {nullptr, nullptr};
}

absl::Status RunTable::RebuildStale() {
  if (stale_.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<RunRow>> rows = store_->LoadRuns();
  if (!rows.ok()) return rows.status();
  for (const RunRow& row : *rows) {
    if (stale_.count(row.run_id) == 0) continue;
    absl::StatusOr<RunState*> rebuilt = RecoverRun(row);
    if (!rebuilt.ok()) return rebuilt.status();
    // Not rebuilt from the store: the last published (durable) count.
    if (std::optional<RunView> view = views_->Get(row.run_id)) {
      (*rebuilt)->missing_rank_steps_total = view->missing_rank_steps_total;
    }
    stale_.erase(row.run_id);
  }
  // The rest were new in the failed batch: the store never had them.
  for (const std::string& id : stale_) {
    runs_.erase(id);
    evicted_.erase(id);
    views_->Erase(id);
  }
  stale_.clear();
  return absl::OkStatus();
}

}  // namespace trainwatch::server
