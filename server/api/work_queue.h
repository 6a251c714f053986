// One thread that runs posted work in order. The operator API posts its
// store reads here so that gRPC's callback threads never wait on SQLite.

#ifndef TRAINWATCH_SERVER_WORK_QUEUE_H_
#define TRAINWATCH_SERVER_WORK_QUEUE_H_

#include <deque>
#include <functional>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace trainwatch::server {

class WorkQueue {
 public:
  WorkQueue() : thread_([this] { Loop(); }) {}
  // Runs what was posted before, then joins.
  ~WorkQueue() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Any thread; never blocks on the work.
  void Post(std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> fn;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return !queue_.empty() || stop_;
        };
        mu_.Await(absl::Condition(&ready));
        if (queue_.empty()) return;  // stopping, and all done
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the members it reads
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_WORK_QUEUE_H_
