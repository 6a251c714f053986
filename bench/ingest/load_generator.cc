#include "load_generator.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "proc_status.h"
#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::bench {
namespace {

using trainwatch::v1::AgentMessage;
using trainwatch::v1::AgentService;
using trainwatch::v1::ServerMessage;

constexpr char kAgentVersion[] = "tw-ingest-load/0.1.0";
constexpr int kMaxStreams = 10000;
constexpr int64_t kMaxSteps = 100'000'000;
constexpr uint64_t kMaxRecords = 1'000'000'000;
constexpr int kMaxChannels = 256;
// After the load ends, how long streams get to close on their own before
// they are cancelled, and how long a cancellation may take.
constexpr absl::Duration kCloseGrace = absl::Seconds(5);
// Most consecutive writes that may sit in gRPC's buffer (see
// AgentStream::BufferHintLocked).
constexpr int64_t kMaxBuffered = 16;

int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SetNow(google::protobuf::Timestamp* ts) {
  const int64_t ns = absl::ToUnixNanos(absl::Now());
  ts->set_seconds(ns / 1'000'000'000);
  ts->set_nanos(static_cast<int32_t>(ns % 1'000'000'000));
}

// What every stream reports into. Thread-safe: counters are atomics, the
// rest is behind mu.
struct Shared {
  LatencyHistogram latency;
  std::atomic<uint64_t> records_sent{0};
  std::atomic<uint64_t> records_acked{0};
  std::atomic<uint64_t> heartbeats_sent{0};
  std::atomic<uint64_t> ack_messages{0};
  std::atomic<uint64_t> acks_ahead_of_sends{0};
  std::atomic<int64_t> last_ack_ns{0};
  std::atomic<int64_t> max_schedule_lag_ns{0};

  absl::Mutex mu;
  // Sending streams whose every record is acknowledged.
  int complete_streams ABSL_GUARDED_BY(mu) = 0;
  // Sending streams that ended before that.
  int failed_sending_streams ABSL_GUARDED_BY(mu) = 0;
  // Streams whose OnDone has run.
  int done_streams ABSL_GUARDED_BY(mu) = 0;
  int stream_errors ABSL_GUARDED_BY(mu) = 0;
  std::string first_error ABSL_GUARDED_BY(mu);
};

void AtomicMax(std::atomic<int64_t>* target, int64_t value) {
  int64_t seen = target->load(std::memory_order_relaxed);
  while (value > seen && !target->compare_exchange_weak(
                             seen, value, std::memory_order_relaxed)) {
  }
}

struct StreamPlan {
  std::string run_id;
  int run_index = 0;
  int rank = 0;
  int world_size = 1;
  // Zero for a stream that only heartbeats.
  int64_t steps = 0;
  trainwatch::v1::ReportScope scope = trainwatch::v1::REPORT_SCOPE_GLOBAL;
  // The key of durable_step that covers this stream's records.
  int32_t ack_key = 0;
  // Schedule: step s is due at first_due_ns + (s - 1) * interval_ns;
  // interval_ns == 0 means unpaced.
  int64_t first_due_ns = 0;
  int64_t interval_ns = 0;
  int64_t heartbeat_interval_ns = 0;
  int window = 1;
};

// One agent stream.
//
// Thread-safety: reactions run on gRPC's threads and Drive() also runs on
// the pacing and main threads; the stream's state is behind mu_. At most one
// write is in flight; the message it writes (out_) belongs to the writer
// until OnWriteDone. A hold keeps the call alive while threads other than
// reactions may still start operations; it is removed exactly once, when
// the stream will start nothing more (WritesDone started, or the stream is
// dead), so no operation is ever started after OnDone.
//
// The object outlives the call: the generator destroys it only after OnDone
// and after the pacing thread has stopped.
class AgentStream final
    : public grpc::ClientBidiReactor<AgentMessage, ServerMessage> {
 public:
  AgentStream(StreamPlan plan, Shared* shared)
      : plan_(std::move(plan)),
        shared_(shared),
        sent_at_ns_(plan_.steps > 0 ? static_cast<size_t>(std::min<int64_t>(
                                          plan_.window, plan_.steps))
                                    : 0) {}

  bool sends_records() const { return plan_.steps > 0; }

  // Opens the call and sends the Hello. Called once, before Drive().
  void Start(AgentService::Stub* stub, const std::string& token) {
    if (!token.empty()) {
      context_.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    }
    stub->async()->Stream(&context_, this);
    {
      absl::MutexLock lock(&mu_);
      auto* hello = out_.mutable_hello();
      hello->set_run_id(plan_.run_id);
      hello->set_rank(plan_.rank);
      hello->set_world_size(plan_.world_size);
      hello->set_agent_version(kAgentVersion);
      hello->set_host_name("127.0.0.1");
      hello->set_next_step(1);
      SetNow(hello->mutable_process_start_time());
      write_in_flight_ = true;
      next_heartbeat_ns_ = MonotonicNanos() + plan_.heartbeat_interval_ns;
    }
    AddHold();
    StartWrite(&out_);
    StartRead(&in_);
    StartCall();
  }

  // Starts the next write if one is due and the stream is free. Safe from
  // any thread, any number of times, also after the call has ended.
  void Drive(int64_t now_ns) {
    Op op;
    bool release_hold = false;
    bool buffer_hint = false;
    {
      absl::MutexLock lock(&mu_);
      op = NextOpLocked(now_ns, &release_hold, &buffer_hint);
    }
    if (op == Op::kWrite) {
      StartWrite(&out_, buffer_hint ? grpc::WriteOptions().set_buffer_hint()
                                    : grpc::WriteOptions());
    }
    if (op == Op::kWritesDone) StartWritesDone();
    // Last: once the hold is gone, OnDone may run at any moment.
    if (release_hold) RemoveHold();
  }

  // Asks the stream to half-close once its write in flight is done.
  void RequestClose() {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    Drive(MonotonicNanos());
  }

  // Ends the call at once; OnDone follows promptly.
  void Cancel() {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
    }
    context_.TryCancel();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (!ok) dead_ = true;
    }
    Drive(MonotonicNanos());
  }

  void OnReadDone(bool ok) override {
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

  void OnDone(const grpc::Status& status) override {
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
    if (!status.ok() &&
        !(cancelled && status.error_code() == grpc::StatusCode::CANCELLED)) {
      error = absl::StrFormat("%s rank %d: %s: %s", plan_.run_id, plan_.rank,
                              StatusCodeName(status.error_code()),
                              status.error_message());
    } else if (sends_records() && !complete && !closing && !cancelled) {
      // Closed by the server, not by the generator giving up (a timeout is
      // reported as such, not once per stream).
      error = absl::StrFormat(
          "%s rank %d: stream ended before all records were acknowledged",
          plan_.run_id, plan_.rank);
    }
    absl::MutexLock lock(&shared_->mu);
    if (sends_records() && !complete) ++shared_->failed_sending_streams;
    if (!error.empty()) {
      if (shared_->stream_errors++ == 0) shared_->first_error = error;
    }
    ++shared_->done_streams;
  }

 private:
  enum class Op { kNone, kWrite, kWritesDone };

  static const char* StatusCodeName(grpc::StatusCode code) {
    switch (code) {
      case grpc::StatusCode::OK:
        return "OK";
      case grpc::StatusCode::CANCELLED:
        return "CANCELLED";
      case grpc::StatusCode::UNKNOWN:
        return "UNKNOWN";
      case grpc::StatusCode::INVALID_ARGUMENT:
        return "INVALID_ARGUMENT";
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return "DEADLINE_EXCEEDED";
      case grpc::StatusCode::NOT_FOUND:
        return "NOT_FOUND";
      case grpc::StatusCode::ALREADY_EXISTS:
        return "ALREADY_EXISTS";
      case grpc::StatusCode::PERMISSION_DENIED:
        return "PERMISSION_DENIED";
      case grpc::StatusCode::UNAUTHENTICATED:
        return "UNAUTHENTICATED";
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
        return "RESOURCE_EXHAUSTED";
      case grpc::StatusCode::FAILED_PRECONDITION:
        return "FAILED_PRECONDITION";
      case grpc::StatusCode::ABORTED:
        return "ABORTED";
      case grpc::StatusCode::OUT_OF_RANGE:
        return "OUT_OF_RANGE";
      case grpc::StatusCode::UNIMPLEMENTED:
        return "UNIMPLEMENTED";
      case grpc::StatusCode::INTERNAL:
        return "INTERNAL";
      case grpc::StatusCode::UNAVAILABLE:
        return "UNAVAILABLE";
      case grpc::StatusCode::DATA_LOSS:
        return "DATA_LOSS";
      default:
        return "UNKNOWN_CODE";
    }
  }

  // Decides the next operation and, for a write, fills out_ and says whether
  // it may be buffered.
  Op NextOpLocked(int64_t now_ns, bool* release_hold, bool* buffer_hint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
      FillHeartbeatLocked();
      shared_->heartbeats_sent.fetch_add(1, std::memory_order_relaxed);
      write_in_flight_ = true;
      return Op::kWrite;
    }
    if (next_step_ <= plan_.steps &&
        next_step_ - acked_step_ <= static_cast<int64_t>(sent_at_ns_.size())) {
      const int64_t due_ns =
          plan_.first_due_ns + (next_step_ - 1) * plan_.interval_ns;
      if (now_ns < due_ns) return Op::kNone;
      if (plan_.interval_ns > 0) {
        AtomicMax(&shared_->max_schedule_lag_ns, now_ns - due_ns);
      }
      FillStepReportLocked(next_step_);
      sent_at_ns_[next_step_ % sent_at_ns_.size()] = now_ns;
      last_sent_ = next_step_;
      ++next_step_;
      shared_->records_sent.fetch_add(1, std::memory_order_relaxed);
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
  bool BufferHintLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (plan_.interval_ns != 0 || last_sent_ % kMaxBuffered == 0) return false;
    return next_step_ <= plan_.steps &&
           next_step_ - acked_step_ <= static_cast<int64_t>(sent_at_ns_.size());
  }

  void FillHeartbeatLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    out_.Clear();
    auto* hb = out_.mutable_heartbeat();
    hb->set_run_id(plan_.run_id);
    hb->set_rank(plan_.rank);
    SetNow(hb->mutable_time());
    hb->set_agent_version(kAgentVersion);
    hb->set_queue_depth(static_cast<uint32_t>(last_sent_ - acked_step_));
    hb->set_queue_capacity(static_cast<uint32_t>(sent_at_ns_.size()));
    hb->set_last_step(last_sent_);
  }

  // A healthy, slowly converging run: nothing here should fire a rule.
  void FillStepReportLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    out_.Clear();
    auto* r = out_.mutable_step_report();
    r->set_run_id(plan_.run_id);
    r->set_rank(plan_.scope == trainwatch::v1::REPORT_SCOPE_RANK ? plan_.rank
                                                                 : 0);
    r->set_world_size(plan_.world_size);
    r->set_step(step);
    r->set_scope(plan_.scope);
    const double x = static_cast<double>(step);
    const double phase = 0.37 * (plan_.run_index + plan_.rank);
    auto* m = r->mutable_metrics();
    m->set_loss(2.5 + std::exp(-x / 20000.0) +
                0.01 * std::sin(0.37 * x + phase));
    m->set_grad_norm(1.0 + 0.05 * std::sin(0.11 * x + phase));
    m->set_log_z(4.0 + 0.02 * std::sin(0.05 * x + phase));
    m->set_nan_frac(0.0);
    r->set_nonfinite_count(0);
    r->set_element_count(1'000'000'000);
    r->add_shard_ids(static_cast<uint64_t>(2 * step));
    r->add_shard_ids(static_cast<uint64_t>(2 * step + 1));
    r->set_verdict(trainwatch::v1::VERDICT_CONTINUE);
    SetNow(r->mutable_time());
  }

  void HandleAck(const trainwatch::v1::DurabilityAck& ack, int64_t now_ns) {
    shared_->ack_messages.fetch_add(1, std::memory_order_relaxed);
    if (!sends_records()) return;
    if (!ack.run_id().empty() && ack.run_id() != plan_.run_id) return;
    auto it = ack.durable_step().find(plan_.ack_key);
    if (it == ack.durable_step().end()) return;
    const int64_t durable = it->second;
    bool now_complete = false;
    {
      absl::MutexLock lock(&mu_);
      if (durable > last_sent_) {
        shared_->acks_ahead_of_sends.fetch_add(1, std::memory_order_relaxed);
      }
      const int64_t covered = std::min(durable, last_sent_);
      if (covered <= acked_step_) return;
      const size_t ring = sent_at_ns_.size();
      for (int64_t s = acked_step_ + 1; s <= covered; ++s) {
        shared_->latency.Record(now_ns - sent_at_ns_[s % ring]);
      }
      shared_->records_acked.fetch_add(
          static_cast<uint64_t>(covered - acked_step_),
          std::memory_order_relaxed);
      acked_step_ = covered;
      if (acked_step_ == plan_.steps && !complete_) {
        complete_ = true;
        now_complete = true;
      }
    }
    AtomicMax(&shared_->last_ack_ns, now_ns);
    if (now_complete) {
      absl::MutexLock lock(&shared_->mu);
      ++shared_->complete_streams;
    }
  }

  const StreamPlan plan_;
  Shared* const shared_;
  grpc::ClientContext context_;
  // Owned by the read in flight (one at a time, serialised by gRPC).
  ServerMessage in_;

  absl::Mutex mu_;
  AgentMessage out_ ABSL_GUARDED_BY(mu_);
  // Send times of the in-flight records, indexed by step % size.
  std::vector<int64_t> sent_at_ns_ ABSL_GUARDED_BY(mu_);
  int64_t next_step_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t last_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t acked_step_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_heartbeat_ns_ ABSL_GUARDED_BY(mu_) = 0;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
};

int ChooseChannels(const LoadConfig& config, int streams) {
  int channels = config.channels;
  if (channels <= 0) channels = std::max(8, (streams + 49) / 50);
  return std::clamp(channels, 1, std::max(1, streams));
}

std::string DefaultRunPrefix() {
  return absl::StrFormat("ingest-bench-%d-%d", absl::ToUnixSeconds(absl::Now()),
                         getpid());
}

}  // namespace

absl::StatusOr<int> ParseLoopbackTarget(absl::string_view target) {
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("target '", target, "' is not HOST:PORT"));
  }
  const absl::string_view host = target.substr(0, colon);
  if (host != "127.0.0.1") {
    return absl::InvalidArgumentError(
        absl::StrCat("target host '", host,
                     "' refused: only 127.0.0.1 may be loaded by this tool"));
  }
  int port = 0;
  if (!absl::SimpleAtoi(target.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("target '", target, "' has no valid port"));
  }
  return port;
}

absl::Status ValidateConfig(const LoadConfig& c) {
  if (auto port = ParseLoopbackTarget(c.target); !port.ok()) {
    return port.status();
  }
  if (c.runs < 1 || c.ranks_per_run < 1) {
    return absl::InvalidArgumentError(
        "--runs and --ranks-per-run must be >= 1");
  }
  if (static_cast<int64_t>(c.runs) * c.ranks_per_run > kMaxStreams) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "at most %d streams (runs x ranks-per-run)", kMaxStreams));
  }
  if (c.steps < 1 || c.steps > kMaxSteps) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--steps must be in [1, %d]", kMaxSteps));
  }
  const uint64_t sending =
      static_cast<uint64_t>(c.runs) *
      static_cast<uint64_t>(c.per_rank ? c.ranks_per_run : 1);
  if (sending * static_cast<uint64_t>(c.steps) > kMaxRecords) {
    return absl::InvalidArgumentError(
        absl::StrFormat("at most %d records in one load", kMaxRecords));
  }
  if (!(c.rate >= 0) || std::isinf(c.rate)) {
    return absl::InvalidArgumentError("--rate must be >= 0");
  }
  if (c.duration_limit <= absl::ZeroDuration() ||
      c.duration_limit > absl::Hours(1)) {
    return absl::InvalidArgumentError(
        "--duration-limit must be in (0, 3600] seconds");
  }
  if (c.heartbeat_interval < absl::Milliseconds(10)) {
    return absl::InvalidArgumentError("heartbeat interval must be >= 10 ms");
  }
  if (c.window < 1 || c.window > (1 << 20)) {
    return absl::InvalidArgumentError("--window must be in [1, 1048576]");
  }
  if (c.channels < 0 || c.channels > kMaxChannels) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--channels must be in [0, %d]", kMaxChannels));
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadResult> RunLoad(const LoadConfig& config,
                                   const std::function<bool()>& should_abort) {
  if (absl::Status s = ValidateConfig(config); !s.ok()) return s;

  const int streams = config.runs * config.ranks_per_run;
  const int channels = ChooseChannels(config, streams);
  const std::string prefix =
      config.run_prefix.empty() ? DefaultRunPrefix() : config.run_prefix;

  // Each channel gets its own subchannel pool, hence its own connection.
  std::vector<std::unique_ptr<AgentService::Stub>> stubs;
  const gpr_timespec connect_deadline = gpr_time_add(
      gpr_now(GPR_CLOCK_MONOTONIC),
      gpr_time_from_millis(absl::ToInt64Milliseconds(config.connect_timeout),
                           GPR_TIMESPAN));
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel =
        grpc::CreateCustomChannel(absl::StrCat("ipv4:", config.target),
                                  grpc::InsecureChannelCredentials(), args);
    if (!channel->WaitForConnected(connect_deadline)) {
      return absl::UnavailableError(
          absl::StrFormat("no connection to %s within %s", config.target,
                          absl::FormatDuration(config.connect_timeout)));
    }
    stubs.push_back(AgentService::NewStub(channel));
  }

  // Owned here, but released together with the reactors in the one case
  // where a call refuses to end (see below).
  auto shared_owner = std::make_unique<Shared>();
  Shared& shared = *shared_owner;
  std::vector<std::unique_ptr<AgentStream>> agents;
  agents.reserve(streams);
  const int sending_streams = config.per_rank ? streams : config.runs;
  const int64_t interval_ns =
      config.rate > 0 ? static_cast<int64_t>(
                            std::llround(1e9 * sending_streams / config.rate))
                      : 0;
  const int64_t start_ns = MonotonicNanos();
  int sending_index = 0;
  for (int run = 0; run < config.runs; ++run) {
    for (int rank = 0; rank < config.ranks_per_run; ++rank) {
      StreamPlan plan;
      plan.run_id = absl::StrCat(prefix, "-", run);
      plan.run_index = run;
      plan.rank = rank;
      plan.world_size = config.ranks_per_run;
      plan.window = config.window;
      plan.heartbeat_interval_ns =
          absl::ToInt64Nanoseconds(config.heartbeat_interval);
      if (config.per_rank || rank == 0) {
        plan.steps = config.steps;
        plan.scope = config.per_rank ? trainwatch::v1::REPORT_SCOPE_RANK
                                     : trainwatch::v1::REPORT_SCOPE_GLOBAL;
        plan.ack_key = config.per_rank ? rank : 0;
        plan.interval_ns = interval_ns;
        // Stagger the streams evenly over one interval.
        plan.first_due_ns =
            interval_ns > 0
                ? start_ns + interval_ns * sending_index / sending_streams
                : 0;
        ++sending_index;
      }
      agents.push_back(std::make_unique<AgentStream>(std::move(plan), &shared));
    }
  }
  for (size_t i = 0; i < agents.size(); ++i) {
    agents[i]->Start(stubs[i % stubs.size()].get(), config.token);
  }

  // The pacing thread: due records and heartbeats. Unpaced records are
  // driven by the reactions themselves; the thread only catches what is due
  // by the clock.
  std::atomic<bool> stop_pacing{false};
  // A tick shorter than a stream's interval buys nothing: a stream that fell
  // behind sends its overdue records back to back from OnWriteDone. Send
  // times are taken when a record really goes out, so the tick does not
  // distort latencies.
  const absl::Duration tick =
      interval_ns > 0
          ? std::clamp(absl::Nanoseconds(interval_ns), absl::Microseconds(500),
                       absl::Milliseconds(5))
          : absl::Milliseconds(10);
  std::thread pacer([&] {
    while (!stop_pacing.load(std::memory_order_relaxed)) {
      const int64_t now_ns = MonotonicNanos();
      for (auto& agent : agents) agent->Drive(now_ns);
      absl::SleepFor(tick);
    }
  });

  LoadResult result;
  const absl::Time deadline = absl::Now() + config.duration_limit;
  auto finished = [&shared,
                   sending_streams]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(shared.mu) {
    return shared.complete_streams + shared.failed_sending_streams >=
           sending_streams;
  };
  while (true) {
    absl::MutexLock lock(&shared.mu);
    if (shared.mu.AwaitWithTimeout(absl::Condition(&finished),
                                   absl::Milliseconds(5))) {
      break;
    }
    if (absl::Now() >= deadline) {
      result.timed_out = true;
      break;
    }
    if (should_abort && should_abort()) {
      result.aborted = true;
      break;
    }
  }
  const int64_t stop_ns = MonotonicNanos();

  stop_pacing.store(true);
  pacer.join();
  for (auto& agent : agents) agent->RequestClose();

  auto all_done = [&shared, streams]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                      shared.mu) { return shared.done_streams >= streams; };
  bool done;
  {
    absl::MutexLock lock(&shared.mu);
    done = shared.mu.AwaitWithTimeout(absl::Condition(&all_done), kCloseGrace);
  }
  if (!done) {
    for (auto& agent : agents) agent->Cancel();
    absl::MutexLock lock(&shared.mu);
    done = shared.mu.AwaitWithTimeout(absl::Condition(&all_done), kCloseGrace);
  }

  result.target = config.target;
  result.streams = streams;
  result.sending_streams = sending_streams;
  result.channels = channels;
  result.records_planned = static_cast<uint64_t>(sending_streams) *
                           static_cast<uint64_t>(config.steps);
  result.records_sent = shared.records_sent.load();
  result.records_acked = shared.records_acked.load();
  result.heartbeats_sent = shared.heartbeats_sent.load();
  result.ack_messages = shared.ack_messages.load();
  result.acks_ahead_of_sends = shared.acks_ahead_of_sends.load();
  result.complete = result.records_acked == result.records_planned;
  const int64_t end_ns = result.complete ? shared.last_ack_ns.load() : stop_ns;
  result.wall_seconds = std::max(1e-9, (end_ns - start_ns) / 1e9);
  result.records_per_second = result.records_acked / result.wall_seconds;
  result.latency = shared.latency.Summarize();
  result.max_schedule_lag_ns = shared.max_schedule_lag_ns.load();
  {
    absl::MutexLock lock(&shared.mu);
    result.stream_errors = shared.stream_errors;
    result.first_error = shared.first_error;
    if (!done) {
      ++result.stream_errors;
      if (result.first_error.empty()) {
        result.first_error = "some streams did not end after cancellation";
      }
    }
  }
  if (auto rss = ReadPeakRssBytes("/proc/self/status"); rss.ok()) {
    result.generator_peak_rss_bytes = *rss;
  }
  if (!done) {
    // A call that never ends would turn destruction into a use after free;
    // leaking the reactors and what they report into is the only safe
    // choice this late.
    for (auto& agent : agents) (void)agent.release();
    (void)shared_owner.release();
  }
  return result;
}

}  // namespace trainwatch::bench
