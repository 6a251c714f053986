#include "load_generator.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
#include "agent_stream.h"
#include "proc_status.h"
#include "stream_plan.h"
#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::bench {
namespace {

using trainwatch::v1::AgentService;

constexpr int kMaxStreams = 10000;
constexpr int64_t kMaxSteps = 100'000'000;
constexpr uint64_t kMaxRecords = 1'000'000'000;
constexpr int kMaxChannels = 256;
// After the load ends, how long streams get to close on their own before
// they are cancelled, and how long a cancellation may take.
constexpr absl::Duration kCloseGrace = absl::Seconds(5);

int ChooseChannels(const LoadConfig& config, int streams) {
  int channels = config.channels;
  if (channels <= 0) channels = std::max(8, (streams + 49) / 50);
  return std::clamp(channels, 1, std::max(1, streams));
}

// Each channel gets its own subchannel pool, hence its own connection, as
// separate trainer processes would have.
absl::StatusOr<std::vector<std::unique_ptr<AgentService::Stub>>> OpenChannels(
    const LoadConfig& config, int channels) {
  std::vector<std::unique_ptr<AgentService::Stub>> stubs;
  const gpr_timespec connect_deadline = gpr_time_add(
      gpr_now(GPR_CLOCK_MONOTONIC),
      gpr_time_from_millis(absl::ToInt64Milliseconds(config.connect_timeout), GPR_TIMESPAN));
  for (int i = 0; i < channels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto channel = grpc::CreateCustomChannel(absl::StrCat("ipv4:", config.target),
                                             grpc::InsecureChannelCredentials(), args);
    if (!channel->WaitForConnected(connect_deadline)) {
      return absl::UnavailableError(absl::StrFormat("no connection to %s within %s", config.target,
                                                    absl::FormatDuration(config.connect_timeout)));
    }
    stubs.push_back(AgentService::NewStub(channel));
  }
  return stubs;
}

std::string DefaultRunPrefix() {
  return absl::StrFormat("ingest-bench-%d-%d", absl::ToUnixSeconds(absl::Now()), getpid());
}

}  // namespace

absl::StatusOr<int> ParseLoopbackTarget(absl::string_view target) {
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("target '", target, "' is not HOST:PORT"));
  }
  const absl::string_view host = target.substr(0, colon);
  if (host != "127.0.0.1") {
    return absl::InvalidArgumentError(absl::StrCat(
        "target host '", host, "' refused: only 127.0.0.1 may be loaded by this tool"));
  }
  int port = 0;
  if (!absl::SimpleAtoi(target.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("target '", target, "' has no valid port"));
  }
  return port;
}

absl::Status ValidateConfig(const LoadConfig& c) {
  if (auto port = ParseLoopbackTarget(c.target); !port.ok()) {
    return port.status();
  }
  if (c.runs < 1 || c.ranks_per_run < 1) {
    return absl::InvalidArgumentError("--runs and --ranks-per-run must be >= 1");
  }
  if (static_cast<int64_t>(c.runs) * c.ranks_per_run > kMaxStreams) {
    return absl::InvalidArgumentError(
        absl::StrFormat("at most %d streams (runs x ranks-per-run)", kMaxStreams));
  }
  if (c.steps < 1 || c.steps > kMaxSteps) {
    return absl::InvalidArgumentError(absl::StrFormat("--steps must be in [1, %d]", kMaxSteps));
  }
  const auto sending = static_cast<uint64_t>(SendingStreams(c));
  if (sending * static_cast<uint64_t>(c.steps) > kMaxRecords) {
    return absl::InvalidArgumentError(
        absl::StrFormat("at most %d records in one load", kMaxRecords));
  }
  if (!(c.rate >= 0) || std::isinf(c.rate)) {
    return absl::InvalidArgumentError("--rate must be >= 0");
  }
  if (c.duration_limit <= absl::ZeroDuration() || c.duration_limit > absl::Hours(1)) {
    return absl::InvalidArgumentError("--duration-limit must be in (0, 3600] seconds");
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
  const std::string prefix = config.run_prefix.empty() ? DefaultRunPrefix() : config.run_prefix;

  auto stubs = OpenChannels(config, channels);
  if (!stubs.ok()) return stubs.status();

  // Owned here, but released together with the reactors in the one case
  // where a call refuses to end (see below).
  auto counters_owner = std::make_unique<LoadCounters>();
  LoadCounters& counters = *counters_owner;
  const int sending_streams = SendingStreams(config);
  const int64_t interval_ns = PacingIntervalNs(config);
  const int64_t start_ns = MonotonicNanos();
  std::vector<std::unique_ptr<AgentStream>> agents;
  agents.reserve(streams);
  for (StreamPlan& plan : PlanStreams(config, prefix, start_ns)) {
    agents.push_back(std::make_unique<AgentStream>(std::move(plan), &counters));
  }
  for (size_t i = 0; i < agents.size(); ++i) {
    agents[i]->Start((*stubs)[i % stubs->size()].get(), config.token);
  }

  // The pacing thread: due records and heartbeats. Unpaced records are
  // driven by the reactions themselves; the thread only catches what is due
  // by the clock.
  std::atomic<bool> stop_pacing{false};
  // A tick shorter than a stream's interval buys nothing: a stream that fell
  // behind sends its overdue records back to back from OnWriteDone. Send
  // times are taken when a record really goes out, so the tick does not
  // distort latencies.
  const absl::Duration tick = interval_ns > 0
                                  ? std::clamp(absl::Nanoseconds(interval_ns),
                                               absl::Microseconds(500), absl::Milliseconds(5))
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
  auto finished = [&counters, sending_streams]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(counters.mu) {
    return counters.complete_streams + counters.failed_sending_streams >= sending_streams;
  };
  while (true) {
    absl::MutexLock lock(&counters.mu);
    if (counters.mu.AwaitWithTimeout(absl::Condition(&finished), absl::Milliseconds(5))) {
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

  auto all_done = [&counters, streams]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(counters.mu) {
    return counters.done_streams >= streams;
  };
  bool done;
  {
    absl::MutexLock lock(&counters.mu);
    done = counters.mu.AwaitWithTimeout(absl::Condition(&all_done), kCloseGrace);
  }
  if (!done) {
    for (auto& agent : agents) agent->Cancel();
    absl::MutexLock lock(&counters.mu);
    done = counters.mu.AwaitWithTimeout(absl::Condition(&all_done), kCloseGrace);
  }

  result.target = config.target;
  result.streams = streams;
  result.sending_streams = sending_streams;
  result.channels = channels;
  result.records_planned =
      static_cast<uint64_t>(sending_streams) * static_cast<uint64_t>(config.steps);
  result.records_sent = counters.records_sent.load();
  result.records_acked = counters.records_acked.load();
  result.heartbeats_sent = counters.heartbeats_sent.load();
  result.ack_messages = counters.ack_messages.load();
  result.acks_ahead_of_sends = counters.acks_ahead_of_sends.load();
  result.complete = result.records_acked == result.records_planned;
  const int64_t end_ns = result.complete ? counters.last_ack_ns.load() : stop_ns;
  result.wall_seconds = std::max(1e-9, (end_ns - start_ns) / 1e9);
  result.records_per_second = result.records_acked / result.wall_seconds;
  result.latency = counters.latency.Summarize();
  result.max_schedule_lag_ns = counters.max_schedule_lag_ns.load();
  {
    absl::MutexLock lock(&counters.mu);
    result.stream_errors = counters.stream_errors;
    result.first_error = counters.first_error;
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
    (void)counters_owner.release();
  }
  return result;
}

}  // namespace trainwatch::bench
