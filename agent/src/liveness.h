// What a rank's heartbeats say of its training thread (docs/hangs.md): the
// last step it finished and when, the median of its recent step intervals,
// the phase it is in, its stack when the step is late, and its lead time:
// how long each step took it from the end of the last one to its first
// wait on the other ranks (the start of backward, where DDP and FSDP
// all-reduce the gradients, as the trainer or `trainwatch run` says it; else
// the agent's own reduction). A straggler's lead is the longest; the other
// ranks make up the difference waiting for it. The training
// thread writes atomics only (Step(), SetPhase()), so the step path gains
// a few stores; the stack comes from a watchdog thread (the Python agent's)
// under a mutex; the sender's thread reads everything for each heartbeat.

#ifndef TRAINWATCH_AGENT_LIVENESS_H_
#define TRAINWATCH_AGENT_LIVENESS_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "absl/synchronization/mutex.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/core/clock.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::agent::internal {

class Liveness {
 public:
  // The stack a heartbeat carries is cut to this, innermost frames kept.
  static constexpr size_t kMaxStackBytes = 8192;

  explicit Liveness(core::Clock* clock) : clock_(clock), last_end_ms_(clock->NowMs()) {}

  // The training thread finished `step`. The phase a trainer set lasts
  // until it sets another or the next step finishes.
  void StepDone(int64_t step) {
    const int64_t now = clock_->NowMs();
    const uint64_t n = intervals_seen_.load(std::memory_order_relaxed);
    const int64_t last_end = last_end_ms_.load(std::memory_order_relaxed);
    if (finished_step_.load(std::memory_order_relaxed) >= 0) {
      intervals_[n % kWindow].store(now - last_end, std::memory_order_relaxed);
      const int64_t arrived = arrived_ms_.load(std::memory_order_relaxed);
      leads_[n % kWindow].store((arrived > 0 ? arrived : now) - last_end,
                                std::memory_order_relaxed);
      intervals_seen_.store(n + 1, std::memory_order_relaxed);
    }
    arrived_ms_.store(0, std::memory_order_relaxed);
    last_end_ms_.store(now, std::memory_order_relaxed);
    finished_step_.store(step, std::memory_order_release);
    phase_.store(Phase::kUnspecified, std::memory_order_relaxed);
  }
  // A followed log's step (Agent::StepObserved): an interval is counted
  // from one write of the log to the next, so only for the first step read
  // after the follower caught up; the steps read with it (the same write)
  // move the last step and restart the clock.
  void LogStep(int64_t step) {
    from_log_.store(true, std::memory_order_relaxed);
    if (caught_up_.exchange(false, std::memory_order_relaxed)) {
      StepDone(step);
      return;
    }
    last_end_ms_.store(clock_->NowMs(), std::memory_order_relaxed);
    finished_step_.store(step, std::memory_order_release);
  }
  void CaughtUp() { caught_up_.store(true, std::memory_order_relaxed); }
  void SetEnded(bool ended) { ended_.store(ended, std::memory_order_relaxed); }

  void SetPhase(Phase p) {
    phase_.store(p, std::memory_order_relaxed);
    if (p == Phase::kBackward || p == Phase::kCollective) Arrive();
  }
  // The agent's own reduction: a collective, whatever phase the trainer set.
  void InReduction(bool in) {
    if (in) Arrive();
    in_reduction_.store(in, std::memory_order_relaxed);
  }

  void SetStack(int64_t finished_step, std::string stack, std::string blocked_at,
                Phase phase) {
    if (stack.size() > kMaxStackBytes) {  // keep the innermost frames, from a line start
      size_t cut = stack.size() - kMaxStackBytes;
      const size_t nl = stack.find('\n', cut);
      stack.erase(0, nl == std::string::npos ? cut : nl + 1);
    }
    absl::MutexLock lock(&mu_);
    stack_ = std::move(stack);
    blocked_at_ = std::move(blocked_at);
    stack_phase_ = phase;
    stack_step_ = finished_step;
  }

  LivenessInfo Info() const {
    LivenessInfo info;
    info.finished_step = finished_step_.load(std::memory_order_acquire);
    info.in_step_ms = clock_->NowMs() - last_end_ms_.load(std::memory_order_relaxed);
    info.step_ms_median = Median(intervals_);
    info.lead_ms_median = Median(leads_);
    info.window_steps = static_cast<int64_t>(
        std::min<uint64_t>(intervals_seen_.load(std::memory_order_relaxed), kWindow));
    return info;
  }

  void Fill(v1::Heartbeat* h) const {
    const LivenessInfo info = Info();
    h->set_finished_step(info.finished_step);
    h->set_in_step_ms(info.in_step_ms);
    h->set_step_ms_median(info.step_ms_median);
    h->set_lead_ms_median(info.lead_ms_median);
    h->set_window_steps(info.window_steps);
    h->set_from_log(from_log_.load(std::memory_order_relaxed));
    if (ended_.load(std::memory_order_relaxed)) h->set_closing(true);
    // The agent's reduction; else a checkpoint or an evaluation the trainer
    // set; else the phase read from the stack in this same step (the
    // trainer's phase may be stale within the step); else the trainer's.
    const Phase set = phase_.load(std::memory_order_relaxed);
    Phase phase = in_reduction_.load(std::memory_order_relaxed) ? Phase::kCollective : set;
    absl::MutexLock lock(&mu_);
    if (stack_step_ == info.finished_step) {
      h->set_stack(stack_);
      h->set_blocked_at(blocked_at_);
      if (phase != Phase::kCollective && phase != Phase::kCheckpoint && phase != Phase::kEval &&
          stack_phase_ != Phase::kUnspecified) {
        phase = stack_phase_;
      }
    }
    h->set_phase(static_cast<v1::Phase>(phase));
  }

 private:
  static constexpr size_t kWindow = 32;
  using Window = std::array<std::atomic<int64_t>, kWindow>;

  // The first wait on the other ranks in this step (the first only).
  void Arrive() {
    if (arrived_ms_.load(std::memory_order_relaxed) == 0) {
      arrived_ms_.store(clock_->NowMs(), std::memory_order_relaxed);
    }
  }

  int64_t Median(const Window& window) const {
    const uint64_t seen = intervals_seen_.load(std::memory_order_relaxed);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(seen, kWindow));
    if (n == 0) return 0;
    std::array<int64_t, kWindow> v;
    for (size_t i = 0; i < n; ++i) v[i] = window[i].load(std::memory_order_relaxed);
    std::nth_element(v.begin(), v.begin() + n / 2, v.begin() + n);
    return v[n / 2];
  }

  core::Clock* const clock_;
  std::atomic<int64_t> last_end_ms_;
  std::atomic<int64_t> finished_step_{-1};
  std::atomic<Phase> phase_{Phase::kUnspecified};
  std::atomic<bool> in_reduction_{false};
  std::atomic<int64_t> arrived_ms_{0};  // 0: not yet in this step
  Window intervals_{};
  Window leads_{};
  std::atomic<uint64_t> intervals_seen_{0};
  std::atomic<bool> from_log_{false};   // LogStep() was called
  std::atomic<bool> caught_up_{false};  // the next LogStep() starts a write
  std::atomic<bool> ended_{false};      // the log's writer is gone
  mutable absl::Mutex mu_;
  std::string stack_ ABSL_GUARDED_BY(mu_);
  std::string blocked_at_ ABSL_GUARDED_BY(mu_);
  Phase stack_phase_ ABSL_GUARDED_BY(mu_) = Phase::kUnspecified;
  int64_t stack_step_ ABSL_GUARDED_BY(mu_) = -2;
};

}  // namespace trainwatch::agent::internal

#endif  // TRAINWATCH_AGENT_LIVENESS_H_
