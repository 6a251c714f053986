// tw-ingest-sink: a no-op AgentService that stores nothing; the baseline the
// real server is compared to. --ack record acknowledges every step report at
// once; --ack batch acknowledges as trainwatchd does, per writer batch (see
// sink_service.h), and is the fair baseline.
//
//   tw-ingest-sink --listen 127.0.0.1:0 [--ack record|batch]
//
// Prints "listening on HOST:PORT" on stdout once it accepts calls, and
// shuts down cleanly on SIGTERM or SIGINT.

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "flag_names.h"
#include "sink_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "HOST:PORT to listen on; port 0 picks a free port");
ABSL_FLAG(std::string, token, "",
          "when set, calls must carry 'authorization: Bearer <token>'");
ABSL_FLAG(std::string, ack, "record",
          "how step reports are acknowledged: 'record' (each at once, on its "
          "stream's thread) or 'batch' (as trainwatchd: one writer thread "
          "takes what is queued and acks each stream once per batch)");
ABSL_FLAG(int64_t, max_batch_items, 50000,
          "--ack batch: most messages in one batch (trainwatchd's default); "
          "at least 1");
ABSL_FLAG(int64_t, commit_interval_ms, 5,
          "--ack batch: a batch of fewer than 1,000 messages waits for more until this long "
          "after the previous batch began (trainwatchd's default); in [0, 1000]");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(2),
          "on SIGTERM/SIGINT, time given to open streams before they are "
          "cancelled");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "No-op AgentService sink: acknowledges step reports as durable (each "
      "at once, or per batch as trainwatchd) and stores nothing.");
  std::vector<std::string> args =
      trainwatch::bench::NormalizeFlagNames(argc, argv);
  std::vector<char*> normalized = trainwatch::bench::ArgvOf(args);
  absl::ParseCommandLine(static_cast<int>(args.size()), normalized.data());
  // The lock-order graph costs a hash lookup on every lock; this tool takes
  // a lock per message and has no lock-order problem to find.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // Blocked before gRPC starts its threads, so that only sigwait() below
  // receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  trainwatch::bench::SinkOptions options;
  options.token = absl::GetFlag(FLAGS_token);
  const std::string ack = absl::GetFlag(FLAGS_ack);
  if (ack == "batch") {
    options.ack = trainwatch::bench::AckMode::kBatch;
  } else if (ack != "record") {
    std::fprintf(stderr,
                 "tw-ingest-sink: --ack must be 'record' or 'batch', not '%s'\n",
                 ack.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_batch_items) < 1) {
    std::fprintf(stderr, "tw-ingest-sink: --max_batch_items must be >= 1\n");
    return 2;
  }
  options.max_batch_items =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_batch_items));
  options.commit_interval_ms = absl::GetFlag(FLAGS_commit_interval_ms);
  if (options.commit_interval_ms < 0 || options.commit_interval_ms > 1000) {
    std::fprintf(stderr, "tw-ingest-sink: --commit_interval_ms must be in [0, 1000]\n");
    return 2;
  }
  const std::string listen = absl::GetFlag(FLAGS_listen);
  trainwatch::bench::SinkService service(options);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "tw-ingest-sink: cannot listen on %s\n",
                 listen.c_str());
    return 1;
  }
  const std::string host = listen.substr(0, listen.rfind(':'));
  std::printf("listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);

  server->Shutdown(std::chrono::system_clock::now() +
                   absl::ToChronoSeconds(absl::GetFlag(FLAGS_shutdown_grace)));
  server->Wait();
  const auto& c = service.counters();
  std::fprintf(stderr,
               "tw-ingest-sink: stopped on signal %d; %lu streams (%lu "
               "refused), %lu step reports, %lu heartbeats, %lu acks, %lu batches\n",
               signal_number,
               static_cast<unsigned long>(c.streams_opened.load()),
               static_cast<unsigned long>(c.streams_rejected.load()),
               static_cast<unsigned long>(c.step_reports.load()),
               static_cast<unsigned long>(c.heartbeats.load()),
               static_cast<unsigned long>(c.acks_sent.load()),
               static_cast<unsigned long>(c.batches.load()));
  return 0;
}
