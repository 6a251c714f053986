// The ingestor's failure path: what a batch the store could not write
// leaves behind (see the invariant in ingest.h). Writer thread only.

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ingest/ingest.h"
#include "common/log.h"

namespace trainwatch::server {

namespace {

// Every run with a row in the batch.
void AddRunsOf(const WriteBatch& b, std::set<std::string>* runs) {
  for (const RunRow& r : b.runs) runs->insert(r.run_id);
  for (const WriteBatch::Step& r : b.steps) runs->insert(r.run_id);
  for (const RankStepRow& r : b.rank_steps) runs->insert(r.run_id);
  for (const CheckpointRow& r : b.checkpoints) runs->insert(r.run_id);
  for (const EventRow& r : b.events) runs->insert(r.run_id);
  for (const IncidentRow& r : b.incidents) runs->insert(r.run_id);
  for (const CommandAckRow& r : b.command_acks) runs->insert(r.run_id);
  for (const DecisionRow& r : b.decisions) runs->insert(r.run_id);
  for (const CommandRow& r : b.commands) runs->insert(r.run_id);
  for (const QuarantineRow& r : b.quarantines) runs->insert(r.run_id);
  for (const AttemptCopy& r : b.attempt_copies) runs->insert(r.run_id);
  for (const IncarnationRow& r : b.incarnations) runs->insert(r.run_id);
}

}  // namespace

void Ingestor::FailBatch(std::vector<IngestItem>& items, const absl::Status& st,
                         int64_t now) {
  LOG(ERROR) << "store write failed; batch of " << items.size()
             << " messages not acknowledged, its streams ended: " << st;
  // Every run the batch may have changed in memory.
  for (const IngestItem& item : items) {
    if (const std::string& run = RunIdOf(item.message); !run.empty()) stale_runs_.insert(run);
  }
  AddRunsOf(batch_, &stale_runs_);
  batch_.clear();
  acks_.clear();
  changed_incidents_.clear();
  outgoing_.clear();
  // A takeover in the batch is forgotten with it: the newer incarnation's
  // stream is ended below, and its next Hello takes over again.
  for (const auto& [stream, status] : ending_) superseded_streams_.erase(stream);
  ending_.clear();
  for (auto& [done, out] : answers_) {
    out.status = absl::UnavailableError(
        absl::StrCat("the decision could not be recorded: ", st.message()));
    done(out);
  }
  answers_.clear();
  const absl::Status retry = absl::UnavailableError(absl::StrCat(
      "trainwatchd's store failed to write your records (", st.message(),
      "); reconnect and send everything after the last acknowledged step"));
  for (IngestItem& item : items) {
    const uint64_t stream = item.stream_id;
    if (item.message.has_checkpoint() || item.message.has_command_ack()) {
      item.stream_id = 0;
      carried_.push_back(std::move(item));
    }
    if (stream == 0 || !ended_streams_.emplace(stream, now).second) continue;
    if (listener_ != nullptr) listener_->OnStreamFailed(stream, retry);
  }
  if (absl::Status rs = RebuildStaleRuns(); !rs.ok()) {
    LOG(ERROR) << "cannot rebuild " << stale_runs_.size()
               << " runs from the store; refusing records until it can: " << rs;
  }
  PublishSnapshot();
}

absl::Status Ingestor::RebuildStaleRuns() {
  if (stale_runs_.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<RunRow>> rows = store_->LoadRuns();
  if (!rows.ok()) return rows.status();
  for (const RunRow& row : *rows) {
    if (stale_runs_.count(row.run_id) == 0) continue;
    absl::StatusOr<RunState*> rebuilt = RecoverRun(row);
    if (!rebuilt.ok()) return rebuilt.status();
    {
      // Not rebuilt from the store: the last published (durable) count.
      absl::MutexLock lock(&snap_mu_);
      (*rebuilt)->missing_rank_steps_total = snapshot_[row.run_id].missing_rank_steps_total;
    }
    stale_runs_.erase(row.run_id);
  }
  // The rest were new in the failed batch: the store never had them.
  for (const std::string& id : stale_runs_) {
    runs_.erase(id);
    evicted_.erase(id);
    absl::MutexLock lock(&snap_mu_);
    snapshot_.erase(id);
  }
  stale_runs_.clear();
  return absl::OkStatus();
}

}  // namespace trainwatch::server
