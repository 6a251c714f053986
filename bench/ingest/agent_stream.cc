#include "agent_stream.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "stream_messages.h"

namespace trainwatch::bench {
namespace {

// Most consecutive writes that may sit in gRPC's buffer (see
// AgentStream::BufferHintLocked).
constexpr int64_t kMaxBuffered = 16;

void AtomicMax(std::atomic<int64_t>* target, int64_t value) {
  int64_t seen = target->load(std::memory_order_relaxed);
  while (value > seen && !target->compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// gRPC's codes are absl's, number for number.
std::string StatusCodeName(grpc::StatusCode code) {
  const std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? "UNKNOWN_CODE" : name;
}

}  // namespace

int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

AgentStream::AgentStream(StreamPlan plan, LoadCounters* counters)
    : plan_(std::move(plan)),
      counters_(counters),
      sent_at_ns_(
          plan_.steps > 0 ? static_cast<size_t>(std::min<int64_t>(plan_.window, plan_.steps)) : 0) {
}

void AgentStream::Start(trainwatch::v1::AgentService::Stub* stub, const std::string& token) {
  if (!token.empty()) {
    context_.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  }
  stub->async()->Stream(&context_, this);
  {
    absl::MutexLock lock(&mu_);
    FillHello(plan_, &out_);
    write_in_flight_ = true;
    next_heartbeat_ns_ = MonotonicNanos() + plan_.heartbeat_interval_ns;
  }
  AddHold();
  StartWrite(&out_);
  StartRead(&in_);
  StartCall();
}

void AgentStream::Drive(int64_t now_ns) {
  Op op;
  bool release_hold = false;
  bool buffer_hint = false;
  {
    absl::MutexLock lock(&mu_);
    op = NextOpLocked(now_ns, &release_hold, &buffer_hint);
  }
  if (op == Op::kWrite) {
    StartWrite(&out_, buffer_hint ? grpc::WriteOptions().set_buffer_hint() : grpc::WriteOptions());
  }
  if (op == Op::kWritesDone) StartWritesDone();
  // Last: once the hold is gone, OnDone may run at any moment.
  if (release_hold) RemoveHold();
}

void AgentStream::RequestClose() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  Drive(MonotonicNanos());
}

void AgentStream::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  context_.TryCancel();
}

void AgentStream::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    if (!ok) dead_ = true;
  }
  Drive(MonotonicNanos());
}

void AgentStream::OnReadDone(bool ok) {
  const int64_t now_ns = MonotonicNanos();
  if (!ok) {
    {
      absl::MutexLock lock(&mu_);
      dead_ = true;
    }
    Drive(now_ns);
    return;
  }
  if (in_.has_durability_ack()) HandleAck(in_.durability_ack(), now_ns);
  StartRead(&in_);
  Drive(now_ns);
}

void AgentStream::OnDone(const grpc::Status& status) {
  bool complete;
  bool cancelled;
  bool closing;
  {
    absl::MutexLock lock(&mu_);
    complete = complete_;
    cancelled = cancelled_;
    closing = closing_;
  }
  std::string error;
  if (!status.ok() && !(cancelled && status.error_code() == grpc::StatusCode::CANCELLED)) {
    error = absl::StrFormat("%s rank %d: %s: %s", plan_.run_id, plan_.rank,
                            StatusCodeName(status.error_code()), status.error_message());
  } else if (sends_records() && !complete && !closing && !cancelled) {
    // Closed by the server, not by the generator giving up (a timeout is
    // reported as such, not once per stream).
    error = absl::StrFormat("%s rank %d: stream ended before all records were acknowledged",
                            plan_.run_id, plan_.rank);
  }
  absl::MutexLock lock(&counters_->mu);
  if (sends_records() && !complete) ++counters_->failed_sending_streams;
  if (!error.empty()) {
    if (counters_->stream_errors++ == 0) counters_->first_error = error;
  }
  ++counters_->done_streams;
}

AgentStream::Op AgentStream::NextOpLocked(int64_t now_ns, bool* release_hold, bool* buffer_hint) {
  if (hold_released_ || write_in_flight_) return Op::kNone;
  if (dead_ || cancelled_) {
    hold_released_ = true;
    *release_hold = true;
    return Op::kNone;
  }
  if (closing_) {
    hold_released_ = true;
    *release_hold = true;
    return Op::kWritesDone;
  }
  if (now_ns >= next_heartbeat_ns_) {
    next_heartbeat_ns_ = now_ns + plan_.heartbeat_interval_ns;
    FillHeartbeat(plan_, last_sent_, acked_step_, static_cast<uint32_t>(sent_at_ns_.size()), &out_);
    counters_->heartbeats_sent.fetch_add(1, std::memory_order_relaxed);
    write_in_flight_ = true;
    return Op::kWrite;
  }
  if (next_step_ <= plan_.steps &&
      next_step_ - acked_step_ <= static_cast<int64_t>(sent_at_ns_.size())) {
    const int64_t due_ns = plan_.first_due_ns + (next_step_ - 1) * plan_.interval_ns;
    if (now_ns < due_ns) return Op::kNone;
    if (plan_.interval_ns > 0) {
      AtomicMax(&counters_->max_schedule_lag_ns, now_ns - due_ns);
    }
    FillStepReport(plan_, next_step_, &out_);
    sent_at_ns_[next_step_ % sent_at_ns_.size()] = now_ns;
    last_sent_ = next_step_;
    ++next_step_;
    counters_->records_sent.fetch_add(1, std::memory_order_relaxed);
    write_in_flight_ = true;
    *buffer_hint = BufferHintLocked();
    return Op::kWrite;
  }
  return Op::kNone;
}

// Whether the write being started may wait in gRPC's buffer for the next
// one. Only when that next write is certain to follow at once from
// OnWriteDone (an unpaced record that the window already allows; a close
// flushes too), so nothing is ever left unsent, and never for more than
// kMaxBuffered writes in a row, so the server sees a steady stream rather
// than window-sized bursts.
bool AgentStream::BufferHintLocked() {
  if (plan_.interval_ns != 0 || last_sent_ % kMaxBuffered == 0) return false;
  return next_step_ <= plan_.steps &&
         next_step_ - acked_step_ <= static_cast<int64_t>(sent_at_ns_.size());
}

void AgentStream::HandleAck(const trainwatch::v1::DurabilityAck& ack, int64_t now_ns) {
  counters_->ack_messages.fetch_add(1, std::memory_order_relaxed);
  if (!sends_records()) return;
  if (!ack.run_id().empty() && ack.run_id() != plan_.run_id) return;
  auto it = ack.durable_step().find(plan_.ack_key);
  if (it == ack.durable_step().end()) return;
  const int64_t durable = it->second;
  bool now_complete = false;
  {
    absl::MutexLock lock(&mu_);
    if (durable > last_sent_) {
      counters_->acks_ahead_of_sends.fetch_add(1, std::memory_order_relaxed);
    }
    const int64_t covered = std::min(durable, last_sent_);
    if (covered <= acked_step_) return;
    const size_t ring = sent_at_ns_.size();
    for (int64_t s = acked_step_ + 1; s <= covered; ++s) {
      counters_->latency.Record(now_ns - sent_at_ns_[s % ring]);
    }
    counters_->records_acked.fetch_add(static_cast<uint64_t>(covered - acked_step_),
                                       std::memory_order_relaxed);
    acked_step_ = covered;
    if (acked_step_ == plan_.steps && !complete_) {
      complete_ = true;
      now_complete = true;
    }
  }
  AtomicMax(&counters_->last_ack_ns, now_ns);
  if (now_complete) {
    absl::MutexLock lock(&counters_->mu);
    ++counters_->complete_streams;
  }
}

}  // namespace trainwatch::bench
