// tw-ingest-load: drives AgentService.Stream with runs x ranks agents and
// measures acknowledged throughput and send-to-durable-ack latency.
//
//   tw-ingest-load --target 127.0.0.1:PORT --runs 8 --steps 50000
//   tw-ingest-load --spawn 'bin/tw-ingest-sink' --runs 10 --ranks-per-run 100
//                  --per-rank --steps 200 --json
//
// Exit status: 0 when every record was acknowledged within the duration
// limit with no stream errors, 1 when not, 2 on bad flags or when the load
// could not start.

#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "flag_names.h"
#include "load_generator.h"
#include "report.h"
#include "spawned_server.h"

ABSL_FLAG(std::string, target, "", "server to load, 127.0.0.1:PORT only");
ABSL_FLAG(std::string, spawn, "",
          "start this server command instead of --target (run as "
          "'sh -c \"exec COMMAND\"'), learn its port from its 'listening on "
          "HOST:PORT' stdout line, stop it with SIGTERM at the end");
ABSL_FLAG(double, spawn_ready_timeout, 20,
          "seconds a spawned server has to print its listening line");
ABSL_FLAG(int, runs, 1, "training runs to simulate");
ABSL_FLAG(int, ranks_per_run, 1, "ranks per run; each rank is one stream");
ABSL_FLAG(int64_t, steps, 1000, "steps per sending stream");
ABSL_FLAG(bool, per_rank, false,
          "every rank sends REPORT_SCOPE_RANK records (default: only rank 0 "
          "sends the run's REPORT_SCOPE_GLOBAL records)");
ABSL_FLAG(double, rate, 0,
          "records per second over all streams; 0 sends as fast as possible");
ABSL_FLAG(std::string, token, "", "bearer token for the authorization header");
ABSL_FLAG(double, duration_limit, 60,
          "seconds allowed from the first record to the last acknowledgement");
ABSL_FLAG(double, heartbeat_interval, 1, "seconds between heartbeats");
ABSL_FLAG(int, window, 8192, "most records a stream may have unacknowledged");
ABSL_FLAG(int, channels, 0,
          "connections to spread the streams over; 0 = one per 50 streams, "
          "at least 8");
ABSL_FLAG(std::string, run_prefix, "",
          "run ids are PREFIX-N; default unique to this invocation");
ABSL_FLAG(bool, json, false, "print the result as one JSON object");

namespace {

// Polled by the load: a pending SIGINT/SIGTERM (blocked in every thread)
// ends it early, and the result is still reported and the server stopped.
bool StopRequested() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  const timespec zero{0, 0};
  return sigtimedwait(&stop_signals, nullptr, &zero) > 0;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "tw-ingest-load: %s\n", status.ToString().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Load generator for the trainwatch agent ingest (AgentService.Stream).");
  std::vector<std::string> args =
      trainwatch::bench::NormalizeFlagNames(argc, argv);
  std::vector<char*> normalized = trainwatch::bench::ArgvOf(args);
  absl::ParseCommandLine(static_cast<int>(args.size()), normalized.data());
  // The lock-order graph costs a hash lookup on every lock; this tool takes
  // a lock per message and has no lock-order problem to find.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  using trainwatch::bench::LoadConfig;
  LoadConfig config;
  config.runs = absl::GetFlag(FLAGS_runs);
  config.ranks_per_run = absl::GetFlag(FLAGS_ranks_per_run);
  config.steps = absl::GetFlag(FLAGS_steps);
  config.per_rank = absl::GetFlag(FLAGS_per_rank);
  config.rate = absl::GetFlag(FLAGS_rate);
  config.token = absl::GetFlag(FLAGS_token);
  config.duration_limit = absl::Seconds(absl::GetFlag(FLAGS_duration_limit));
  config.heartbeat_interval =
      absl::Seconds(absl::GetFlag(FLAGS_heartbeat_interval));
  config.window = absl::GetFlag(FLAGS_window);
  config.channels = absl::GetFlag(FLAGS_channels);
  config.run_prefix = absl::GetFlag(FLAGS_run_prefix);

  const std::string target = absl::GetFlag(FLAGS_target);
  const std::string spawn = absl::GetFlag(FLAGS_spawn);
  if (target.empty() == spawn.empty()) {
    return Fail(absl::InvalidArgumentError(
        "give exactly one of --target HOST:PORT and --spawn COMMAND"));
  }
  // Checked before a server is started for nothing.
  config.target = spawn.empty() ? target : "127.0.0.1:1";
  if (absl::Status s = trainwatch::bench::ValidateConfig(config); !s.ok()) {
    return Fail(s);
  }

  trainwatch::bench::ServerReport server_report;
  std::unique_ptr<trainwatch::bench::SpawnedServer> server;
  if (!spawn.empty()) {
    auto started = trainwatch::bench::SpawnedServer::Start(
        spawn, absl::Seconds(absl::GetFlag(FLAGS_spawn_ready_timeout)));
    if (!started.ok()) return Fail(started.status());
    server = std::move(*started);
    server_report.spawned = true;
    server_report.command = spawn;
    config.target = server->address();
  } else {
    config.target = target;
  }

  // The server's writes before the load (its start, the schema) are not
  // the load's.
  absl::StatusOr<int64_t> written_before =
      server != nullptr ? server->WrittenBytes() : absl::StatusOr<int64_t>(-1);
  auto result = trainwatch::bench::RunLoad(config, StopRequested);
  if (server != nullptr) {
    if (auto rss = server->PeakRssBytes(); rss.ok()) {
      server_report.peak_rss_bytes = *rss;
    }
    if (auto written = server->WrittenBytes(); written.ok() && written_before.ok()) {
      server_report.written_bytes = *written - *written_before;
    }
    if (absl::Status s = server->Stop(absl::Seconds(5)); !s.ok()) {
      server_report.stop_error = std::string(s.message());
    }
  }
  if (!result.ok()) return Fail(result.status());

  const std::string text =
      absl::GetFlag(FLAGS_json)
          ? absl::StrCat(
                trainwatch::bench::FormatJson(config, *result, server_report),
                "\n")
          : trainwatch::bench::FormatText(config, *result, server_report);
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  return trainwatch::bench::LoadPassed(*result, server_report) ? 0 : 1;
}
