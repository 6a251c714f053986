// Hellos, incarnations and resumes (the rules are in ingest.h): which launch
// of a job streams a run, where a new launch resumes, and the new attempt
// it opens when its steps would collide with the earlier job's. Writer
// thread only.

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "ingest/ingest.h"
#include "common/log.h"

namespace trainwatch::server {

namespace {

absl::Status Replaced(const std::string& run, const std::string& old_incarnation,
                      const std::string& newer) {
  return absl::FailedPreconditionError(absl::StrCat(
      "run ", run, ": incarnation ", old_incarnation, " was replaced by incarnation ", newer,
      " (a newer launch of the job); this process no longer streams, its local verdicts go "
      "on"));
}

}  // namespace

void Ingestor::HandleHello(const trainwatch::v1::Hello& h, uint64_t stream, int64_t now) {
  if (h.run_id().empty()) return;
  RunState* run = RunFor(h.run_id(), h.world_size(), now);
  if (run == nullptr) return;
  // Known before AdmitIncarnation makes it the run's current one.
  const HelloKind kind = h.incarnation_id().empty()               ? HelloKind::kUnknown
                         : h.incarnation_id() == run->row.incarnation ? HelloKind::kReconnect
                                                                      : HelloKind::kRestart;
  if (!h.incarnation_id().empty() && !AdmitIncarnation(*run, h, stream, now)) return;
  if (run->row.observed != h.observed()) {
    // The latest launch says how the run is watched (ingest.h).
    LOG(INFO) << "run " << run->row.run_id << ": "
              << (h.observed() ? "followed from its log: observed, not enforced"
                               : "streamed by its trainer's agent: enforced");
    run->row.observed = h.observed();
    run->row_dirty = true;
    run->incidents.set_observed(h.observed());
  }
  AdoptHelloRules(*run, h);
  // A job restarted for the rollback under way may have fewer ranks: the
  // command waits for the world it says it has (see ingest.h).
  if (run->command && h.world_size() > 0) run->command->world_size = h.world_size();
  if (!h.incarnation_id().empty() && h.has_resume_step() && AwaitsResumeStep(*run, stream)) {
    DecideResume(*run, h.resume_step(), now);
  }
  // The protocol's first answer (agent.proto, step 2): where to resume.
  // The server knows it for the global record (rank 0); other ranks get an
  // empty map and resend their buffer, which the store deduplicates. An
  // incarnation is told only of its own records: the run's last step may
  // be the earlier job's, and a resumed agent taking it as its own would
  // drop its records of those steps unsent.
  const bool own = h.incarnation_id().empty() ||
                   (run->row.resume_step && run->row.last_step > *run->row.resume_step);
  trainwatch::v1::ServerMessage ack;
  ack.mutable_durability_ack()->set_run_id(run->row.run_id);
  if (h.rank() == 0 && !run->rank_mode && run->row.last_step >= 0 && own) {
    (*ack.mutable_durability_ack()->mutable_durable_step())[0] = run->row.last_step;
  }
  AnswerHello(*run, h, kind, now, ack.mutable_durability_ack());
  ack.mutable_durability_ack()->set_rules_json(run->row.rules_json);
  ack.mutable_durability_ack()->set_rules_source(run->row.rules_source);
  outgoing_.emplace_back(run->row.run_id, stream, ack.SerializeAsString());
  // A (re)connected rank gets what it has not applied yet.
  if (!run->quarantined.empty() && !run->row.observed) {
    outgoing_.emplace_back(run->row.run_id, stream,
                           QuarantineMessage(run->row.run_id, run->quarantined));
  }
  SendPendingCommand(*run, stream, h.rank());
}

bool Ingestor::AdmitIncarnation(RunState& run, const trainwatch::v1::Hello& h, uint64_t stream,
                                int64_t now) {
  const std::string& inc = h.incarnation_id();
  std::map<int32_t, uint64_t>& streams = incarnation_streams_[run.row.run_id];
  if (inc == run.row.incarnation) {
    streams[h.rank()] = stream;  // a reconnect: the rank's earlier stream is gone
    return true;
  }
  if (run.incarnations.count(inc) > 0) {
    // Replaced already: a lingering stream of an earlier launch.
    LOG(WARNING) << "run " << run.row.run_id << ": refused rank " << h.rank()
                 << " of incarnation " << inc << ", replaced by incarnation "
                 << run.row.incarnation;
    superseded_streams_.emplace(stream, now);
    ending_.emplace_back(stream, Replaced(run.row.run_id, inc, run.row.incarnation));
    absl::MutexLock lock(&snap_mu_);
    stats_.incarnation_conflicts_total++;
    return false;
  }
  // A newer launch takes over; the older one's streams still open end.
  int open = 0;
  for (const auto& [rank, old] : streams) {
    if (listener_ != nullptr && !listener_->IsStreamOpen(old)) continue;
    ++open;
    superseded_streams_.emplace(old, now);
    ending_.emplace_back(old, Replaced(run.row.run_id, run.row.incarnation, inc));
  }
  if (open > 0) {
    LOG(WARNING) << "run " << run.row.run_id << ": incarnation " << inc
                 << " takes over from incarnation " << run.row.incarnation
                 << ", still streaming; ending its " << open << " open streams";
    absl::MutexLock lock(&snap_mu_);
    stats_.incarnation_conflicts_total++;
  }
  streams.clear();
  streams[h.rank()] = stream;
  LOG(INFO) << "run " << run.row.run_id << ": incarnation " << inc << " started (rank "
            << h.rank() << " of " << h.world_size() << ")";
  run.incarnations.insert(inc);
  batch_.incarnations.push_back({run.row.run_id, inc, now});
  run.row.incarnation = inc;
  run.row.resume_step.reset();
  run.row_dirty = true;
  return true;
}

bool Ingestor::AwaitsResumeStep(const RunState& run, uint64_t stream) const {
  if (run.row.resume_step || run.row.incarnation.empty()) return false;
  auto it = incarnation_streams_.find(run.row.run_id);
  if (it == incarnation_streams_.end()) return false;
  for (const auto& [rank, s] : it->second) {
    if (s == stream) return true;
  }
  return false;
}

void Ingestor::DecideResume(RunState& run, int64_t step, int64_t now) {
  run.row.resume_step = step;
  run.row_dirty = true;
  if (run.command && run.row.observed && step == run.command->target_step) {
    // The manual restart of a followed run's approved rollback (ingest.h).
    LOG(INFO) << "run " << run.row.run_id << ": incarnation " << run.row.incarnation
              << " resumes after step " << step << ", the checkpoint of rollback "
              << run.command->id << ": restarted by hand";
    CompleteRollback(run, now);
    return;
  }
  if (run.command && !run.row.observed) {
    LOG(INFO) << "run " << run.row.run_id << ": incarnation " << run.row.incarnation
              << " resumes after step " << step << "; rollback " << run.command->id
              << " is under way and its attempt governs";
    return;
  }
  if (step >= run.row.last_step) return;  // nothing stored past it: the attempt goes on
  const int64_t last = run.row.last_step, from = run.row.attempt;
  const int64_t fed =
      StartAttempt(run, step, AttemptStart::kResume, 0, run.row.world_size, now);
  {
    absl::MutexLock lock(&snap_mu_);
    stats_.resumes_total++;
  }
  LOG(INFO) << "run " << run.row.run_id << ": incarnation " << run.row.incarnation
            << " resumes after step " << step << ", before the last stored step " << last
            << "; attempt " << run.row.attempt << " begins (" << fed
            << " steps of history), attempt " << from << " keeps its records";
}

int64_t Ingestor::StartAttempt(RunState& run, int64_t up_to_step, AttemptStart start,
                               int64_t incident_id, int32_t world_size, int64_t now) {
  AttemptCopy copy;
  copy.run_id = run.row.run_id;
  copy.from_attempt = run.row.attempt;
  copy.to_attempt = run.row.attempt + 1;
  copy.up_to_step = up_to_step;
  copy.start = start;
  copy.incident_id = incident_id;
  if (start == AttemptStart::kResume) copy.incarnation = run.row.incarnation;
  copy.started_ms = now;
  batch_.attempt_copies.push_back(copy);
  run.has_latest = false;
  // From the old attempt's newest engine snapshot at or before the step,
  // when one is usable.
  absl::StatusOr<EngineReplay> started =
      StartReplay(copy.run_id, copy.from_attempt, copy.up_to_step, run.rules);
  if (!started.ok()) {
    LOG(ERROR) << "run " << copy.run_id << ": reading the engine snapshots: " << started.status();
    started = EngineReplay{core::EngineRebuilder(run.rules, copy.up_to_step)};
  }
  EngineReplay& replay = *started;
  auto feed = [&](const StepRow& s, const std::string& ckpt) {
    if (replay.Feed(s, ckpt) || s.step == replay.snapshot_step) {
      run.latest = s;
      run.has_latest = true;
    }
  };
  absl::Status st =
      store_->ForEachStep(copy.run_id, copy.from_attempt, feed, replay.after());
  if (!st.ok()) LOG(ERROR) << "run " << copy.run_id << ": rebuilding the engine: " << st;
  // The old attempt's records evaluated in this batch are not in the store
  // yet; the copy takes them (it runs after the steps), and so must the
  // engine. They come after the stored ones, in step order.
  const int64_t stored_last = run.has_latest ? run.latest.step : -1;
  for (const WriteBatch::Step& w : batch_.steps) {
    if (w.run_id == copy.run_id && w.attempt == copy.from_attempt && !w.step.late &&
        w.step.step > stored_last) {
      feed(w.step, "");
    }
  }
  absl::StatusOr<std::vector<CheckpointRow>> cks = store_->Checkpoints(copy.run_id);
  if (cks.ok()) {
    for (const CheckpointRow& c : *cks) replay.rebuild.NoteCheckpoint(c.step, c.uri);
  }
  for (const CheckpointRow& c : batch_.checkpoints) {
    if (c.run_id == copy.run_id) replay.rebuild.NoteCheckpoint(c.step, c.uri);
  }
  const int64_t fed = replay.rebuild.fed();
  run.engine = std::move(replay.rebuild).Finish();
  // The new attempt holds copies of these steps; its first snapshot comes
  // with its next evaluated step.
  run.attempt_skipped = replay.skipped;
  run.attempt_overflows = replay.overflows;
  run.snapshot_step = -1;
  run.row.attempt = copy.to_attempt;
  run.row.world_size = world_size;
  run.row.last_step = copy.up_to_step;
  run.row_dirty = true;
  run.pending.clear();
  return fed;
}

}  // namespace trainwatch::server
