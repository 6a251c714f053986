#include "sink_service.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace trainwatch::bench {

using trainwatch::v1::AgentMessage;
using trainwatch::v1::ServerMessage;

namespace {

int32_t AckKeyOf(const trainwatch::v1::StepReport& report) {
  return report.scope() == trainwatch::v1::REPORT_SCOPE_RANK ? report.rank() : 0;
}

}  // namespace

// One agent stream. Reactions (OnReadDone, OnWriteDone, OnCancel) may run
// concurrently on gRPC's threads; the state they share is behind mu_. The
// object deletes itself in OnDone, which gRPC calls once, last.
//
// Invariants: at most one write in flight (write_in_flight_); Finish() is
// called once (finished_), and only when no write is in flight, so the
// message being written (out_) is never touched by two parties.
//
// With a batcher (kBatch), step reports go to it and their acks come back
// through Durable(); the stream is registered with it until OnDone.
class SinkStream final
    : public grpc::ServerBidiReactor<AgentMessage, ServerMessage> {
 public:
  SinkStream(grpc::CallbackServerContext* context,
             const std::string& expected_authorization, SinkCounters* counters,
             AckBatcher* batcher)
      : counters_(counters), batcher_(batcher) {
    counters_->streams_opened.fetch_add(1, std::memory_order_relaxed);
    if (batcher_ != nullptr) id_ = batcher_->Register(this);
    if (!expected_authorization.empty() &&
        !HasAuthorization(*context, expected_authorization)) {
      counters_->streams_rejected.fetch_add(1, std::memory_order_relaxed);
      RequestFinish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                 "missing or wrong bearer token"));
      return;
    }
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The agent half-closed (or the call died): nothing more will come.
      RequestFinish(grpc::Status::OK);
      return;
    }
    if (batcher_ != nullptr && saw_hello_unlocked_ && in_.has_step_report()) {
      counters_->step_reports.fetch_add(1, std::memory_order_relaxed);
      // As trainwatchd's stream: the message moves to the writer whole.
      batcher_->Submit(id_, std::move(in_));
      in_.Clear();
      StartRead(&in_);
      return;
    }
    bool write = false;
    {
      absl::MutexLock lock(&mu_);
      if (!saw_hello_) {
        if (!in_.has_hello()) {
          finish_error_ = true;
        } else {
          saw_hello_ = true;
          saw_hello_unlocked_ = true;
          run_id_ = in_.hello().run_id();
          hello_ack_pending_ = true;
          quarantine_pending_ = true;
        }
      } else if (in_.has_step_report()) {
        const auto& report = in_.step_report();
        counters_->step_reports.fetch_add(1, std::memory_order_relaxed);
        // A duplicate or older report is acknowledged again; that is
        // harmless and keeps the sink free of per-step state.
        RaiseDurableLocked(AckKeyOf(report), report.step());
      } else if (in_.has_heartbeat()) {
        counters_->heartbeats.fetch_add(1, std::memory_order_relaxed);
      }
      if (!finish_error_) write = PrepareWriteLocked();
    }
    if (finish_error_) {
      RequestFinish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "the first message must be a Hello"));
      return;
    }
    if (write) StartWrite(&out_);
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    bool write = false;
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (ok) counters_->acks_sent.fetch_add(1, std::memory_order_relaxed);
      if (!ok) broken_ = true;
      if (finish_requested_ && !finished_) {
        finished_ = true;
        finish = true;
        status = finish_status_;
      } else {
        write = PrepareWriteLocked();
      }
    }
    if (finish) {
      Finish(status);
      return;
    }
    if (write) StartWrite(&out_);
  }

  void OnCancel() override {
    RequestFinish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    if (batcher_ != nullptr) batcher_->Unregister(id_);
    delete this;
  }

  // From the batcher, after a batch: every report of this stream up to
  // `step` for `key` is durable. Returns whether the caller must call
  // StartWrite(out()) once it holds no lock of the batcher's; the write in
  // flight keeps this stream alive until then (Finish waits for it).
  bool Durable(int32_t key, int64_t step) {
    absl::MutexLock lock(&mu_);
    RaiseDurableLocked(key, step);
    return PrepareWriteLocked();
  }
  void StartPreparedWrite() { StartWrite(&out_); }

 private:
  void RaiseDurableLocked(int32_t key, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto [it, inserted] = durable_.try_emplace(key, step);
    if (!inserted) it->second = std::max(it->second, step);
    ack_pending_ = true;
  }

  static bool HasAuthorization(const grpc::CallbackServerContext& context,
                               const std::string& expected) {
    const auto& md = context.client_metadata();
    auto it = md.find("authorization");
    return it != md.end() &&
           absl::string_view(it->second.data(), it->second.size()) == expected;
  }

  // Fills out_ with the next message owed to the agent, if any and if the
  // stream is free to write. Returns whether the caller must StartWrite.
  bool PrepareWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (write_in_flight_ || broken_ || finish_requested_) return false;
    out_.Clear();
    if (hello_ack_pending_) {
      hello_ack_pending_ = false;
      // Nothing is durable for a new agent: an empty map.
      out_.mutable_durability_ack()->set_run_id(run_id_);
    } else if (quarantine_pending_) {
      quarantine_pending_ = false;
      out_.mutable_quarantined_shards()->set_run_id(run_id_);
    } else if (ack_pending_) {
      ack_pending_ = false;
      auto* ack = out_.mutable_durability_ack();
      ack->set_run_id(run_id_);
      for (const auto& [rank, step] : durable_) {
        (*ack->mutable_durable_step())[rank] = step;
      }
    } else {
      return false;
    }
    write_in_flight_ = true;
    return true;
  }

  // Ends the call with `status` now, or after the write in flight completes.
  // Safe to call more than once; the first status wins.
  void RequestFinish(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (finish_requested_) return;
      finish_requested_ = true;
      if (write_in_flight_) {
        finish_status_ = std::move(status);
        return;  // OnWriteDone finishes.
      }
      finished_ = true;
    }
    // May run OnDone inline; `this` must not be touched afterwards.
    Finish(status);
  }

  SinkCounters* const counters_;
  AckBatcher* const batcher_;
  uint64_t id_ = 0;  // the batcher's name for this stream
  // Read only by reactions that gRPC serialises (one read at a time).
  AgentMessage in_;
  bool finish_error_ = false;
  bool saw_hello_unlocked_ = false;  // saw_hello_, for the read path alone

  absl::Mutex mu_;
  ServerMessage out_ ABSL_GUARDED_BY(mu_);
  bool saw_hello_ ABSL_GUARDED_BY(mu_) = false;
  std::string run_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int32_t, int64_t> durable_ ABSL_GUARDED_BY(mu_);
  bool hello_ack_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool quarantine_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool ack_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

AckBatcher::AckBatcher(size_t max_batch_items, int64_t commit_interval_ms,
                       SinkCounters* counters)
    : max_batch_items_(std::max<size_t>(1, max_batch_items)),
      commit_interval_(absl::Milliseconds(std::max<int64_t>(0, commit_interval_ms))),
      counters_(counters),
      thread_([this] { Loop(); }) {}

AckBatcher::~AckBatcher() {
  {
    absl::MutexLock lock(&queue_mu_);
    stop_ = true;
  }
  thread_.join();
}

uint64_t AckBatcher::Register(SinkStream* stream) {
  absl::MutexLock lock(&streams_mu_);
  const uint64_t id = next_id_++;
  streams_[id] = stream;
  return id;
}

void AckBatcher::Unregister(uint64_t stream_id) {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(stream_id);
}

void AckBatcher::Submit(uint64_t stream_id, AgentMessage message) {
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back({stream_id, std::move(message)});
}

// IngestQueue::Take without the store: the same wake-up, the same batch bound,
// the same wait for more (IngestQueue::LingerForMore; 1,000 is its
// kCommitEarlyItems).
void AckBatcher::Loop() {
  constexpr size_t kCommitEarlyItems = 1000;
  std::vector<Item> items;
  absl::Time last_batch;
  for (;;) {
    bool stopping;
    {
      absl::MutexLock lock(&queue_mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(queue_mu_) {
        return !queue_.empty() || stop_;
      };
      queue_mu_.AwaitWithTimeout(absl::Condition(&ready),
                                 absl::Milliseconds(50));
      if (commit_interval_ > absl::ZeroDuration() && !queue_.empty()) {
        auto commit_now = [this]() ABSL_SHARED_LOCKS_REQUIRED(queue_mu_) {
          return queue_.size() >= kCommitEarlyItems || stop_;
        };
        queue_mu_.AwaitWithDeadline(absl::Condition(&commit_now), last_batch + commit_interval_);
      }
      last_batch = absl::Now();
      stopping = stop_;
      if (queue_.size() <= max_batch_items_) {
        items.swap(queue_);
      } else {
        items.assign(std::make_move_iterator(queue_.begin()),
                     std::make_move_iterator(queue_.begin() + max_batch_items_));
        queue_.erase(queue_.begin(), queue_.begin() + max_batch_items_);
      }
    }
    Process(items);
    items.clear();
    if (stopping) {
      absl::MutexLock lock(&queue_mu_);
      if (queue_.empty()) return;
    }
  }
}

void AckBatcher::Process(std::vector<Item>& items) {
  if (items.empty()) return;
  counters_->batches.fetch_add(1, std::memory_order_relaxed);
  // (stream, key) -> highest step in this batch, as Batch::acks.
  absl::flat_hash_map<std::pair<uint64_t, int32_t>, int64_t> acks;
  for (const Item& item : items) {
    const auto& report = item.message.step_report();
    auto [it, inserted] =
        acks.try_emplace({item.stream_id, AckKeyOf(report)}, report.step());
    if (!inserted) it->second = std::max(it->second, report.step());
  }
  counters_->batch_acks_owed.fetch_add(acks.size(), std::memory_order_relaxed);
  std::vector<SinkStream*> to_write;
  {
    absl::MutexLock lock(&streams_mu_);
    for (const auto& [key, step] : acks) {
      auto it = streams_.find(key.first);
      if (it == streams_.end()) continue;  // gone; re-sent on reconnect
      if (it->second->Durable(key.second, step)) to_write.push_back(it->second);
    }
  }
  // Outside streams_mu_: a reaction may run inline and end the stream.
  for (SinkStream* s : to_write) s->StartPreparedWrite();
}

SinkService::SinkService(const SinkOptions& options)
    : expected_authorization_(options.token.empty()
                                  ? std::string()
                                  : absl::StrCat("Bearer ", options.token)) {
  if (options.ack == AckMode::kBatch) {
    batcher_ = std::make_unique<AckBatcher>(options.max_batch_items, options.commit_interval_ms,
                                            &counters_);
  }
}

grpc::ServerBidiReactor<AgentMessage, ServerMessage>* SinkService::Stream(
    grpc::CallbackServerContext* context) {
  return new SinkStream(context, expected_authorization_, &counters_,
                        batcher_.get());
}

}  // namespace trainwatch::bench
