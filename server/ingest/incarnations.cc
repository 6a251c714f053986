// Hellos, incarnations and resumes (incarnations.h).

#include "ingest/incarnations.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
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

void Incarnations::HandleHello(const trainwatch::v1::Hello& h, uint64_t stream, int64_t now) {
  if (h.run_id().empty()) return;
  RunState* run = runs_->Get(h.run_id(), h.world_size(), now);
  if (run == nullptr) return;
  // Known before Admit makes it the run's current one.
  const HelloKind kind = h.incarnation_id().empty()               ? HelloKind::kUnknown
                         : h.incarnation_id() == run->row.incarnation ? HelloKind::kReconnect
                                                                      : HelloKind::kRestart;
  if (!h.incarnation_id().empty() && !Admit(*run, h, stream, now)) return;
  if (run->row.observed != h.observed()) {
    // The latest launch says how the run is watched.
    LOG(INFO) << "run " << run->row.run_id << ": "
              << (h.observed() ? "followed from its log: observed, not enforced"
                               : "streamed by its trainer's agent: enforced");
    run->row.observed = h.observed();
    run->row_dirty = true;
    run->incidents.set_observed(h.observed());
  }
  if (run->row.attachment != h.attachment()) {  // the latest launch's, as observed
    run->row.attachment = h.attachment();
    run->row_dirty = true;
  }
  rules_->AdoptHello(*run, h);
  // A job restarted for the rollback under way may have fewer ranks: the
  // command waits for the world it says it has.
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
  approvals_->AnswerHello(*run, h, kind, now, ack.mutable_durability_ack());
  ack.mutable_durability_ack()->set_run_last_step(run->row.last_step);
  ack.mutable_durability_ack()->set_rules_json(run->row.rules_json);
  ack.mutable_durability_ack()->set_rules_source(run->row.rules_source);
  batch_->outgoing.emplace_back(run->row.run_id, stream, ack.SerializeAsString());
  // A (re)connected rank gets what it has not applied yet.
  if (!run->quarantined.empty() && !run->row.observed) {
    batch_->outgoing.emplace_back(run->row.run_id, stream,
                           QuarantineMessage(run->row.run_id, run->quarantined));
  }
  approvals_->SendPendingCommand(*run, stream, h.rank());
}

bool Incarnations::Admit(RunState& run, const trainwatch::v1::Hello& h, uint64_t stream,
                         int64_t now) {
  const std::string& inc = h.incarnation_id();
  std::map<int32_t, uint64_t>& streams = streams_[run.row.run_id];
  if (inc == run.row.incarnation) {
    streams[h.rank()] = stream;  // a reconnect: the rank's earlier stream is gone
    return true;
  }
  if (run.incarnations.count(inc) > 0) {
    // Replaced already: a lingering stream of an earlier launch.
    LOG(WARNING) << "run " << run.row.run_id << ": refused rank " << h.rank()
                 << " of incarnation " << inc << ", replaced by incarnation "
                 << run.row.incarnation;
    superseded_.emplace(stream, now);
    batch_->ending.emplace_back(stream, Replaced(run.row.run_id, inc, run.row.incarnation));
    views_->Count(&IngestStats::incarnation_conflicts_total);
    return false;
  }
  // A newer launch takes over; the older one's streams still open end.
  int open = 0;
  for (const auto& [rank, old] : streams) {
    if (listener_ != nullptr && !listener_->IsStreamOpen(old)) continue;
    ++open;
    superseded_.emplace(old, now);
    batch_->ending.emplace_back(old, Replaced(run.row.run_id, run.row.incarnation, inc));
  }
  if (open > 0) {
    LOG(WARNING) << "run " << run.row.run_id << ": incarnation " << inc
                 << " takes over from incarnation " << run.row.incarnation
                 << ", still streaming; ending its " << open << " open streams";
    views_->Count(&IngestStats::incarnation_conflicts_total);
  }
  streams.clear();
  streams[h.rank()] = stream;
  LOG(INFO) << "run " << run.row.run_id << ": incarnation " << inc << " started (rank "
            << h.rank() << " of " << h.world_size() << ")";
  run.incarnations.insert(inc);
  batch_->rows.incarnations.push_back({run.row.run_id, inc, now});
  run.row.incarnation = inc;
  run.row.resume_step.reset();
  run.row_dirty = true;
  return true;
}

bool Incarnations::AwaitsResumeStep(const RunState& run, uint64_t stream) const {
  if (run.row.resume_step || run.row.incarnation.empty()) return false;
  auto it = streams_.find(run.row.run_id);
  if (it == streams_.end()) return false;
  for (const auto& [rank, s] : it->second) {
    if (s == stream) return true;
  }
  return false;
}

void Incarnations::DecideResume(RunState& run, int64_t step, int64_t now) {
  run.row.resume_step = step;
  run.row_dirty = true;
  if (run.command && run.row.observed && step == run.command->target_step) {
    // The manual restart of a followed run's approved rollback (approvals.h).
    LOG(INFO) << "run " << run.row.run_id << ": incarnation " << run.row.incarnation
              << " resumes after step " << step << ", the checkpoint of rollback "
              << run.command->id << ": restarted by hand";
    approvals_->CompleteRollback(run, now);
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
      snapshots_->OpenAttempt(run, step, AttemptStart::kResume, 0, run.row.world_size, now);
  views_->Count(&IngestStats::resumes_total);
  LOG(INFO) << "run " << run.row.run_id << ": incarnation " << run.row.incarnation
            << " resumes after step " << step << ", before the last stored step " << last
            << "; attempt " << run.row.attempt << " begins (" << fed
            << " steps of history), attempt " << from << " keeps its records";
}

void Incarnations::ForgetTakeovers(const std::vector<std::pair<uint64_t, absl::Status>>& ending) {
  for (const auto& [stream, status] : ending) superseded_.erase(stream);
}

void Incarnations::Expire(int64_t now) {
  for (auto it = superseded_.begin(); it != superseded_.end();) {
    it = now - it->second > 60'000 ? superseded_.erase(it) : std::next(it);
  }
}

}  // namespace trainwatch::server
