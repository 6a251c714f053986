#include "sink_service.h"

#include <algorithm>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace trainwatch::bench {
namespace {

using trainwatch::v1::AgentMessage;
using trainwatch::v1::ServerMessage;

// One agent stream. Reactions (OnReadDone, OnWriteDone, OnCancel) may run
// concurrently on gRPC's threads; the state they share is behind mu_. The
// object deletes itself in OnDone, which gRPC calls once, last.
//
// Invariants: at most one write in flight (write_in_flight_); Finish() is
// called once (finished_), and only when no write is in flight, so the
// message being written (out_) is never touched by two parties.
class SinkStream final
    : public grpc::ServerBidiReactor<AgentMessage, ServerMessage> {
 public:
  SinkStream(grpc::CallbackServerContext* context,
             const std::string& expected_authorization, SinkCounters* counters)
      : counters_(counters) {
    counters_->streams_opened.fetch_add(1, std::memory_order_relaxed);
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
    bool write = false;
    {
      absl::MutexLock lock(&mu_);
      if (!saw_hello_) {
        if (!in_.has_hello()) {
          finish_error_ = true;
        } else {
          saw_hello_ = true;
          run_id_ = in_.hello().run_id();
          hello_ack_pending_ = true;
          quarantine_pending_ = true;
        }
      } else if (in_.has_step_report()) {
        const auto& report = in_.step_report();
        counters_->step_reports.fetch_add(1, std::memory_order_relaxed);
        const int32_t key = report.scope() == trainwatch::v1::REPORT_SCOPE_RANK
                                ? report.rank()
                                : 0;
        auto [it, inserted] = durable_.try_emplace(key, report.step());
        if (!inserted) it->second = std::max(it->second, report.step());
        // A duplicate or older report is acknowledged again; that is
        // harmless and keeps the sink free of per-step state.
        ack_pending_ = true;
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

  void OnDone() override { delete this; }

 private:
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
  // Read only by reactions that gRPC serialises (one read at a time).
  AgentMessage in_;
  bool finish_error_ = false;

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

}  // namespace

SinkService::SinkService(std::string token)
    : expected_authorization_(token.empty() ? std::string()
                                            : absl::StrCat("Bearer ", token)) {}

grpc::ServerBidiReactor<AgentMessage, ServerMessage>* SinkService::Stream(
    grpc::CallbackServerContext* context) {
  return new SinkStream(context, expected_authorization_, &counters_);
}

}  // namespace trainwatch::bench
