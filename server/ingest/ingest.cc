// The Ingestor: the writer thread's loop, each batch's commit and its
// failure path (ingest.h); the components do the rest.

#include "ingest/ingest.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "incidents/incident_text.h"

namespace trainwatch::server {

using trainwatch::v1::StepReport;

namespace {

// Every run with a row in the batch.
std::set<std::string> RunsOf(const WriteBatch& b) {
  std::set<std::string> runs;
  for (const RunRow& r : b.runs) runs.insert(r.run_id);
  for (const WriteBatch::Step& r : b.steps) runs.insert(r.run_id);
  for (const RankStepRow& r : b.rank_steps) runs.insert(r.run_id);
  for (const CheckpointRow& r : b.checkpoints) runs.insert(r.run_id);
  for (const EventRow& r : b.events) runs.insert(r.run_id);
  for (const IncidentRow& r : b.incidents) runs.insert(r.run_id);
  for (const CommandAckRow& r : b.command_acks) runs.insert(r.run_id);
  for (const DecisionRow& r : b.decisions) runs.insert(r.run_id);
  for (const CommandRow& r : b.commands) runs.insert(r.run_id);
  for (const QuarantineRow& r : b.quarantines) runs.insert(r.run_id);
  for (const AttemptCopy& r : b.attempt_copies) runs.insert(r.run_id);
  for (const IncarnationRow& r : b.incarnations) runs.insert(r.run_id);
  return runs;
}

}  // namespace

const std::string& RunIdOf(const trainwatch::v1::AgentMessage& m) {
  switch (m.kind_case()) {
    case trainwatch::v1::AgentMessage::kHello:
      return m.hello().run_id();
    case trainwatch::v1::AgentMessage::kStepReport:
      return m.step_report().run_id();
    case trainwatch::v1::AgentMessage::kCheckpoint:
      return m.checkpoint().run_id();
    case trainwatch::v1::AgentMessage::kCommandAck:
      return m.command_ack().run_id();
    default: {
      static const std::string* const kNone = new std::string;
      return *kNone;
    }
  }
}

Ingestor::Ingestor(Store* store, const IngestOptions& options, core::Clock* clock)
    : store_(store),
      options_(options),
      clock_(clock),
      queue_(options.max_batch_items, options.commit_interval_ms),
      snapshots_(store, &options_, &views_, &batch_),
      rules_(&options_, &batch_),
      runs_(store, &options_, clock, &views_, &rules_, &snapshots_, &batch_),
      approvals_(store, &runs_, &snapshots_, &views_, &batch_),
      incarnations_(&runs_, &rules_, &approvals_, &snapshots_, &views_, &batch_),
      intake_(&options_, &views_, &batch_, &snapshots_, &rules_),
      liveness_(options.liveness, &views_) {}

Ingestor::~Ingestor() { Stop(); }

absl::Status Ingestor::Recover() { return runs_.Recover(); }

void Ingestor::SetListener(IngestListener* listener) {
  listener_ = listener;
  incarnations_.set_listener(listener);
}

void Ingestor::Start() {
  writer_ = std::thread([this] { Loop(); });
}

void Ingestor::Stop() {
  if (!queue_.Stop()) return;
  if (writer_.joinable()) writer_.join();
  queue_.Closed();
}

void Ingestor::SubmitApproval(ApprovalRequest request, std::function<void(ApprovalOutcome)> done) {
  queue_.SubmitApproval({std::move(request), std::move(done)});
}

IngestStats Ingestor::Stats() const {
  IngestStats s = views_.Stats();
  s.queue_depth = queue_.Depth();
  return s;
}

void Ingestor::Loop() {
  std::vector<IngestItem> items;
  std::vector<ApprovalTask> tasks;
  for (;;) {
    // At once while runs are left to rebuild after a restart.
    const bool stopping = queue_.Take(runs_.HasStartupWork(), &items, &tasks);
    const size_t n = items.size();
    const bool idle = n == 0 && tasks.empty() && !stopping;
    ProcessInBatches(items);
    items.clear();
    if (!tasks.empty()) {
      // Approvals commit in a batch of their own, after the records that
      // arrived before them.
      runs_.BeginBatch();
      const int64_t now = clock_->NowMs();
      for (ApprovalTask& t : tasks) {
        ApprovalOutcome out = approvals_.Run(t.request, now);
        batch_.answers.emplace_back(std::move(t.done), std::move(out));
      }
      tasks.clear();
      std::vector<IngestItem> none;
      ProcessBatch(none);
    }
    // One run rebuilt after a restart per idle turn: a message waits for
    // at most one run's rebuild besides its own run's.
    if (idle) runs_.RebuildNextAtStartup();
    if (queue_.Done(n) && stopping) {
      // A clean shutdown: the next start replays nothing of the runs held.
      runs_.BeginBatch();
      for (const auto& [id, run] : runs_.held()) {
        snapshots_.MaybeSave(*run, /*force=*/true, clock_->NowMs());
      }
      std::vector<IngestItem> none;
      ProcessBatch(none);
      break;
    }
  }
}

void Ingestor::ProcessInBatches(std::vector<IngestItem>& items) {
  // A batch's runs must all stay in memory until its commit (their rows are
  // in batch_, and a rebuild reads the store), so a batch touches at most
  // max_runs_in_memory runs and MakeRoom always finds one to evict.
  const size_t bound = std::max<size_t>(1, options_.max_runs_in_memory);
  size_t begin = 0;
  do {
    std::unordered_set<std::string_view> touched;
    size_t end = begin;
    for (; end < items.size(); ++end) {
      const std::string& id = RunIdOf(items[end].message);
      if (touched.count(id) > 0) continue;
      if (touched.size() >= bound) break;
      touched.insert(id);
    }
    runs_.BeginBatch();
    if (begin == 0 && end == items.size()) {
      ProcessBatch(items);
      return;
    }
    std::vector<IngestItem> part(std::make_move_iterator(items.begin() + begin),
                                 std::make_move_iterator(items.begin() + end));
    ProcessBatch(part);
    begin = end;
  } while (begin < items.size());
}

void Ingestor::ProcessBatch(std::vector<IngestItem>& items) {
  const int64_t now = clock_->NowMs();
  batch_.records = 0;
  for (auto it = ended_streams_.begin(); it != ended_streams_.end();) {
    it = now - it->second > 60'000 ? ended_streams_.erase(it) : std::next(it);
  }
  incarnations_.Expire(now);
  if (!carried_.empty()) {
    items.insert(items.begin(), std::make_move_iterator(carried_.begin()),
                 std::make_move_iterator(carried_.end()));
    carried_.clear();
  }
  // No run's state may be used while it could still hold a failed batch.
  if (absl::Status st = runs_.RebuildStale(); !st.ok()) {
    FailBatch(items, st, now);
    return;
  }
  int64_t oldest_ms = now;
  for (IngestItem& item : items) {
    // The agent re-sends these, after its last acknowledged step: taken
    // now, they would be evaluated ahead of the lost ones.
    if (item.message.has_step_report() && ended_streams_.count(item.stream_id) > 0) continue;
    // A replaced incarnation's: its history was replaced too.
    if (incarnations_.IsSuperseded(item.stream_id)) continue;
    oldest_ms = std::min(oldest_ms, item.received_ms);
    Handle(item, now);
  }
  for (const auto& [id, run] : runs_.held()) intake_.CompletePending(*run, now, /*force=*/false);
  for (const auto& [id, run] : runs_.held()) {
    if (run->row_dirty) {
      batch_.rows.runs.push_back(run->row);
      run->row_dirty = false;
    }
  }
  liveness_.Check(now, [&](const std::string& id) { return runs_.Get(id, 0, now, false); },
                  &batch_.ids, batch_.sink());
  if (batch_.empty()) return;
  if (pager_ != nullptr) {
    for (const IncidentRow& inc : batch_.rows.incidents) {
      const std::string summary = PageSummary(inc, liveness_.PageDetail(inc, now));
      for (OutboxRow& row : pager_->Rows(inc, summary, now)) batch_.rows.outbox.push_back(std::move(row));
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = store_->Write(batch_.rows);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t lag_ms = clock_->NowMs() - oldest_ms;
  views_.Edit([&](std::map<std::string, RunView>&, IngestStats& stats) {
    stats.batches_total++;
    stats.records_total += batch_.records;
    stats.last_commit_seconds = seconds;
    stats.commit_seconds_sum += seconds;
    stats.last_lag_ms = lag_ms;
    if (!st.ok()) stats.store_errors_total++;
  });
  if (!st.ok()) {
    FailBatch(items, st, now);
    return;
  }
  batch_.rows.clear();
  // What a client learns from an ack or an answer must already be visible
  // in the views (metrics, run status).
  runs_.Publish();
  for (auto& [done, out] : batch_.answers) done(out);
  if (pager_ != nullptr) pager_->Wake();
  if (listener_ != nullptr) {
    for (const auto& [run, stream, bytes] : batch_.outgoing) {
      listener_->OnServerMessage(run, stream, bytes);
    }
  }
  if (listener_ != nullptr) {
    for (const auto& [key, step] : batch_.acks) {
      listener_->OnDurable(std::get<0>(key), std::get<1>(key), std::get<2>(key), step);
    }
    listener_->OnAcksDone();
    for (const auto& [incident, change] : batch_.changed_incidents) {
      listener_->OnIncident(incident, change);
    }
    // After the acks: what a replaced incarnation sent before the newer one
    // came is durable, and it hears so.
    for (const auto& [stream, status] : batch_.ending) listener_->OnStreamFailed(stream, status);
  }
  batch_.Clear();
}

void Ingestor::FailBatch(std::vector<IngestItem>& items, const absl::Status& st,
                         int64_t now) {
  LOG(ERROR) << "store write failed; batch of " << items.size()
             << " messages not acknowledged, its streams ended: " << st;
  // Every run the batch may have changed in memory.
  for (const IngestItem& item : items) {
    if (const std::string& run = RunIdOf(item.message); !run.empty()) runs_.MarkStale(run);
  }
  for (const std::string& run : RunsOf(batch_.rows)) runs_.MarkStale(run);
  // A takeover in the batch is forgotten with it: the newer incarnation's
  // stream is ended below, and its next Hello takes over again.
  incarnations_.ForgetTakeovers(batch_.ending);
  for (auto& [done, out] : batch_.answers) {
    out.status = absl::UnavailableError(
        absl::StrCat("the decision could not be recorded: ", st.message()));
    done(out);
  }
  batch_.Clear();
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
  if (absl::Status rs = runs_.RebuildStale(); !rs.ok()) {
    LOG(ERROR) << "cannot rebuild " << runs_.stale_count()
               << " runs from the store; refusing records until it can: " << rs;
  }
  runs_.Publish();
}

void Ingestor::Handle(IngestItem& item, int64_t now) {
  const auto& m = item.message;
  switch (m.kind_case()) {
    case trainwatch::v1::AgentMessage::kHello:
      incarnations_.HandleHello(m.hello(), item.stream_id, now);
      break;
    case trainwatch::v1::AgentMessage::kStepReport: {
      const StepReport& r = m.step_report();
      // Null when an evicted run could not be rebuilt (logged): the record is
      // not acknowledged, so the agent sends it again.
      RunState* run = runs_.Get(r.run_id(), r.world_size(), now);
      if (run == nullptr) break;
      // A new incarnation's first record says where it resumed.
      if (incarnations_.AwaitsResumeStep(*run, item.stream_id)) {
        incarnations_.DecideResume(*run, r.step() - 1, now);
      }
      intake_.Take(*run, r, item.stream_id, now);
      liveness_.OnProgress(r.run_id(), run->row.last_step, now);
      break;
    }
    case trainwatch::v1::AgentMessage::kCheckpoint: {
      const auto& c = m.checkpoint();
      RunState* run = runs_.Get(c.run_id(), 0, now);
      if (run == nullptr) break;
      // Sent before any step report: the checkpoint it resumed from.
      if (incarnations_.AwaitsResumeStep(*run, item.stream_id)) {
        incarnations_.DecideResume(*run, c.step(), now);
      }
      run->engine->NoteCheckpoint(c.step(), c.uri());
      batch_.rows.checkpoints.push_back({c.run_id(), c.step(), c.uri(), now});
      break;
    }
    case trainwatch::v1::AgentMessage::kCommandAck: {
      // An acknowledgement creates no run.
      approvals_.HandleCommandAck(runs_.Get(m.command_ack().run_id(), 0, now, /*create=*/false),
                                  m.command_ack(), now);
      break;
    }
    case trainwatch::v1::AgentMessage::kHeartbeat:
      liveness_.OnHeartbeat(m.heartbeat(), now);
      break;
    case trainwatch::v1::AgentMessage::KIND_NOT_SET:
      break;
  }
}

}  // namespace trainwatch::server
