#include "ingest/ingest_queue.h"

#include <iterator>
#include <utility>

namespace trainwatch::server {

void IngestQueue::Submit(IngestItem item) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(item));
  ++submitted_;
}

void IngestQueue::SubmitApproval(ApprovalTask task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void IngestQueue::Flush() {
  absl::MutexLock lock(&mu_);
  const uint64_t target = submitted_;
  auto done = [this, target]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return done_ >= target || (stop_ && closed_);
  };
  ++flushing_;  // the writer stops waiting for more (LingerForMore)
  mu_.Await(absl::Condition(&done));
  --flushing_;
}

int64_t IngestQueue::Depth() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

// Every commit writes each database page it dirtied whole, a page or two
// per run however few its records: waiting a few milliseconds for more
// records writes fewer bytes per record for a little more ack latency
// (make bench: ingest). A flood fills its batches and never waits; Flush()
// and decisions do not wait.
void IngestQueue::LingerForMore() {
  if (commit_interval_ms_ <= 0 || queue_.empty()) return;
  auto commit_now = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return queue_.size() >= kCommitEarlyItems || !tasks_.empty() || stop_ || flushing_ > 0;
  };
  // Real time, whatever the runs' clock is: this is about the disk.
  mu_.AwaitWithDeadline(absl::Condition(&commit_now),
                        last_batch_start_ + absl::Milliseconds(commit_interval_ms_));
}

bool IngestQueue::Take(bool busy, std::vector<IngestItem>* items,
                       std::vector<ApprovalTask>* tasks) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || !tasks_.empty() || stop_;
  };
  // Wake at least every 50 ms for aggregation timeouts, at once while the
  // caller has work of its own.
  mu_.AwaitWithTimeout(absl::Condition(&ready),
                       busy ? absl::ZeroDuration() : absl::Milliseconds(50));
  LingerForMore();
  last_batch_start_ = absl::Now();
  tasks->swap(tasks_);
  if (queue_.size() <= max_batch_items_) {
    items->swap(queue_);
  } else {
    items->assign(std::make_move_iterator(queue_.begin()),
                  std::make_move_iterator(queue_.begin() + max_batch_items_));
    queue_.erase(queue_.begin(), queue_.begin() + max_batch_items_);
  }
  return stop_;
}

bool IngestQueue::Done(size_t n) {
  absl::MutexLock lock(&mu_);
  done_ += n;
  return queue_.empty() && tasks_.empty();
}

bool IngestQueue::Stop() {
  absl::MutexLock lock(&mu_);
  if (stop_) return false;
  stop_ = true;
  return true;
}

void IngestQueue::Closed() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace trainwatch::server
