// What the streams and the operator API hand the writer thread: agent
// messages and decisions, queued without waiting, taken in batches. Group
// commit: a batch of fewer than kCommitEarlyItems records waits for more,
// up to IngestOptions::commit_interval_ms after the previous batch began
// (LingerForMore says why).
//
// Thread-safe: Submit, SubmitApproval, Flush and Depth from any thread;
// Take, Done, Stop and Closed from the writer's owner.

#ifndef TRAINWATCH_SERVER_INGEST_INGEST_QUEUE_H_
#define TRAINWATCH_SERVER_INGEST_INGEST_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ingest/batch.h"
#include "ingest/rollback.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::server {

struct IngestItem {
  uint64_t stream_id = 0;
  int64_t received_ms = 0;
  trainwatch::v1::AgentMessage message;
};

struct ApprovalTask {
  ApprovalRequest request;
  std::function<void(ApprovalOutcome)> done;
};

class IngestQueue {
 public:
  // A batch this large commits without waiting for the commit interval.
  static constexpr size_t kCommitEarlyItems = 1000;

  IngestQueue(size_t max_batch_items, int64_t commit_interval_ms)
      : max_batch_items_(max_batch_items), commit_interval_ms_(commit_interval_ms) {}

  // Never blocks on the store.
  void Submit(IngestItem item);
  void SubmitApproval(ApprovalTask task);
  // Waits until everything submitted before the call was taken and done.
  void Flush();
  int64_t Depth() const;

  // Waits for work (at most 50 ms, none when `busy`), lingers for a batch
  // worth committing, and moves at most max_batch_items messages and every
  // decision out. Returns whether Stop() was called.
  bool Take(bool busy, std::vector<IngestItem>* items, std::vector<ApprovalTask>* tasks);
  // `n` items taken are done; true when nothing is left queued.
  bool Done(size_t n);
  // False when already stopping.
  bool Stop();
  // The writer has ended: Flush() returns at once.
  void Closed();

 private:
  void LingerForMore() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_batch_items_;
  const int64_t commit_interval_ms_;
  mutable absl::Mutex mu_;
  std::vector<IngestItem> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<ApprovalTask> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int flushing_ ABSL_GUARDED_BY(mu_) = 0;  // Flush() calls waiting
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_batch_start_;  // the writer's
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_INGEST_QUEUE_H_
