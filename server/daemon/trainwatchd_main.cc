// trainwatchd: flags in, Server::Start, wait for SIGTERM/SIGINT, Shutdown.
//
// Exit status: 0 after a signal; 2 for a bad flag (a value out of range or
// of the wrong form, checked by CheckServerOptions before anything starts,
// or a file a flag names that cannot be used); 1 when the server cannot
// start (a port in use, the database cannot be opened) or fails; 3 when a
// replica lost its lease (--replica: fenced; restarted, it stands by). absl
// itself exits 1 for a flag it cannot parse at all (--max_message_bytes=x).

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/file_system.h"
#include "trainwatch/core/version.h"
#include "common/log.h"
#include "daemon/lease_keeper.h"
#include "daemon/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "gRPC address: host:port (port 0 to 65535; 0: pick a free one) or unix:PATH");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics address, host:port; empty disables it");
ABSL_FLAG(std::string, db, "trainwatch.db",
          "the store: a SQLite database file (the default; not empty, not :memory:, not a "
          "directory), or a PostgreSQL database as a postgresql:// (postgres://) URI or libpq "
          "keywords ('host=... dbname=...'; several hosts with target_session_attrs=read-write "
          "reach whichever is the primary). --db_max_bytes and --db_synchronous normal are "
          "SQLite's only");
ABSL_FLAG(std::string, tokens, "", "bearer tokens file (JSON); empty: authentication off");
ABSL_FLAG(std::string, tls_cert, "", "server certificate (PEM)");
ABSL_FLAG(std::string, tls_key, "", "server private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca, "", "CA for client certificates: mutual TLS");
ABSL_FLAG(std::string, rules, "",
          "rule thresholds (a JSON file, as `twctl replay --print-config`) for runs whose "
          "agents announce none; empty: the defaults. An agent's own rules (its constructor or "
          "TRAINWATCH_RULES) take precedence for its run");
ABSL_FLAG(std::string, run_rules, "",
          "per-run rule thresholds: a JSON file {\"run-id glob\": {rules...}}, tried in file "
          "order (first match wins) before --rules, for runs whose agents announce none; "
          "empty: none");
ABSL_FLAG(int, max_message_bytes, 4 << 20,
          "largest message accepted or sent, in [1024, 1073741824]");
ABSL_FLAG(int, aggregation_timeout_ms, 30000,
          "per-rank records: complete a step without the missing ranks after this long, in "
          "[1, 86400000]");
ABSL_FLAG(int, max_world_size, 65536,
          "largest world_size an agent may claim, in [1, 1000000]; more is INVALID_ARGUMENT");
ABSL_FLAG(int, max_runs_per_token, 1000,
          "distinct runs one agent token may create while the server runs, in [1, 1000000]; "
          "more is RESOURCE_EXHAUSTED (authentication on only)");
ABSL_FLAG(bool, reflection, true,
          "serve gRPC server reflection; with --tokens it takes any valid token");
ABSL_FLAG(int64_t, db_max_bytes, 0,
          "quota on the database file in bytes, in whole pages (8 KiB in a database "
          "trainwatchd creates; SQLite max_page_count); past it writes fail "
          "as on a full disk: nothing is acknowledged, agents keep their records and re-send "
          "them once space is freed or the quota raised. 0: no quota");
ABSL_FLAG(std::string, db_synchronous, "full",
          "what a commit waits for before records are acknowledged: 'full' (fsync: an "
          "acknowledged record survives a crash of trainwatchd, of the kernel and a power "
          "loss) or 'normal' (the OS has it; fsync at each WAL checkpoint: it survives a crash "
          "of trainwatchd, while a power loss or kernel crash may lose the last seconds of "
          "acknowledged records)");
ABSL_FLAG(std::string, replica, "",
          "this replica's name (1 to 64 of [A-Za-z0-9._-], unique among the replicas) when "
          "several trainwatchd share one PostgreSQL --db: one replica owns every shard and takes "
          "agent streams and decisions; the others stand by, serve the operator's reads from "
          "the store, answer streams and decisions with ABORTED naming the owner, and take "
          "over when its lease runs out. A replica that loses its lease exits with status 3; "
          "restarted, it is a standby. Empty: a single trainwatchd, no leases");
ABSL_FLAG(int64_t, lease_ms, 10000,
          "with --replica: how long an owner's lease lasts without renewal (renewed every "
          "third of it), in [1000, 600000]; a standby takes over within about this long of the "
          "owner's death, and the owner stops acknowledging a tenth of it before");
ABSL_FLAG(int, shards, 64,
          "with --replica: the shards runs hash to, in [1, 4096]; fixed when the database's "
          "lease table is made, the same on every replica");
ABSL_FLAG(int64_t, standby_refresh_ms, 2000,
          "with --replica: how often a standby reads the store to answer the operator API "
          "(its answers lag the owner's by about this much), in [100, 600000]");
ABSL_FLAG(int64_t, max_runs_in_memory, 256,
          "runs whose rule-engine state (about 0.3 MB each with the default rules) stays in "
          "memory; the least recently used beyond it is evicted and rebuilt from the database "
          "when it streams again, and at startup only this many (the most recently seen) are "
          "rebuilt. At least 1");
ABSL_FLAG(int64_t, max_step_jump, 1000,
          "a step report more than this many steps past its run's last step is stored but not "
          "evaluated (counted in trainwatch_ingest_far_steps_total) unless the next record "
          "follows it within the bound, so one bad record (step 2^63-1) cannot blind detection; "
          "a real jump costs one step's evaluation. At least 1");
ABSL_FLAG(int64_t, commit_interval_ms, 5,
          "group commit, in [0, 1000]: a batch of fewer than 1,000 records waits for more until "
          "this long after the previous commit began; fewer commits write fewer whole pages "
          "(at 10,000 records/s, 5 ms wrote 28% less than 0, for 2.6 ms more to the median "
          "ack). 0: commit as soon as anything is queued");
ABSL_FLAG(int64_t, engine_snapshot_steps, 10000,
          "every this many evaluated steps of a run (and at its eviction and a clean "
          "shutdown when a tenth of them passed since the last) its rule-engine state is "
          "snapshotted into the database (~0.3 MB with the default rules); a restart, an "
          "evicted run's rebuild, a resume or a rollback loads the newest snapshot at or before "
          "its step and replays only the steps after it. A snapshot that does not decode or was "
          "built under other rules is logged and the whole history replayed. 0: no snapshots, "
          "every rebuild replays the whole history");
ABSL_FLAG(int64_t, stall_floor_seconds, 120,
          "a run whose agents are alive but that made no step for stall_step_multiple times its "
          "median step time, and at least this long, is stalled: a tier 2 incident, paged, "
          "naming the ranks behind, their host and line (docs/hangs.md). 1 to 86400");
ABSL_FLAG(double, stall_step_multiple, 10.0,
          "the stall bound in the run's median step times (see stall_floor_seconds), 2 to 1000");
ABSL_FLAG(int64_t, stall_startup_seconds, 1800,
          "the stall bound before a run made 8 steps (compilation, the data pipeline's warm-up), "
          "at least stall_floor_seconds");
ABSL_FLAG(int64_t, stall_long_phase_seconds, 1800,
          "the least stall bound while a rank reports a checkpoint or an evaluation in progress");
ABSL_FLAG(double, straggler_ratio, 1.2,
          "a rank whose own time per step is at least this many times the median rank's, for "
          "straggler_steps steps, is a straggler: a warning page naming its host "
          "(docs/hangs.md). 1.05 to 100");
ABSL_FLAG(int64_t, straggler_steps, 100,
          "steps a rank must stay past straggler_ratio before it is paged as a straggler, "
          "at least 1");
ABSL_FLAG(int64_t, engine_snapshots_kept, 3,
          "engine snapshots kept per run attempt, the newest; older ones serve a resume or "
          "rollback to an earlier step. At least 1");
ABSL_FLAG(int64_t, metrics_stale_run_s, 3600,
          "a run not seen for this many seconds leaves /metrics (its data stays in the "
          "database); 0: never");
ABSL_FLAG(int64_t, metrics_max_runs, 1000,
          "/metrics exports at most this many runs, the most recently seen, 18 series each. "
          "At least 1");
ABSL_FLAG(std::string, grafana_url, "", "Grafana dashboard URL, for links in pages");
ABSL_FLAG(std::string, pager_config, "",
          "pager receivers (JSON: alertmanager, pagerduty, slack, webhook); empty: no pages");

namespace {

int Run(int argc, char** argv) {
  // absl prints "<program>: <message>" and groups flags under the path the
  // defining file was compiled from (a build machine's folder); name the
  // program once, and group our flags under it.
  absl::FlagsUsageConfig usage;
  usage.version_string = [] { return std::string("trainwatchd ") + trainwatch::kVersion + "\n"; };
  usage.normalize_filename = [](absl::string_view file) {
    return absl::EndsWith(file, "trainwatchd_main.cc") ? std::string("trainwatchd.cc")
                                                      : std::string(file);
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "the training-health server. Agents stream step records to it; it runs\n"
      "the tiered rule engine, keeps every record in SQLite, serves the operator API and\n"
      "Prometheus metrics. Defaults work with no configuration (loopback, ./trainwatch.db).");
  absl::ParseCommandLine(argc, argv);
  // Deadlock detection (on in the system Abseil) costs a lock-graph lookup
  // on every lock, several per record on the ingest path; the tests keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  trainwatch::server::ServerOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.db_path = absl::GetFlag(FLAGS_db);
  o.replica = absl::GetFlag(FLAGS_replica);
  o.lease_ms = absl::GetFlag(FLAGS_lease_ms);
  o.shards = absl::GetFlag(FLAGS_shards);
  o.standby_refresh_ms = absl::GetFlag(FLAGS_standby_refresh_ms);
  o.tokens_file = absl::GetFlag(FLAGS_tokens);
  o.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.grafana_url = absl::GetFlag(FLAGS_grafana_url);
  o.pager_config_file = absl::GetFlag(FLAGS_pager_config);
  o.store.max_bytes = absl::GetFlag(FLAGS_db_max_bytes);
  if (const std::string sync = absl::GetFlag(FLAGS_db_synchronous); sync == "normal") {
    o.store.synchronous = trainwatch::server::StoreOptions::Synchronous::kNormal;
  } else if (sync != "full") {
    std::fprintf(stderr, "trainwatchd: --db_synchronous must be 'full' or 'normal', not '%s'\n",
                 sync.c_str());
    return 2;
  }
  o.ingest.aggregation_timeout_ms = absl::GetFlag(FLAGS_aggregation_timeout_ms);
  o.max_world_size = absl::GetFlag(FLAGS_max_world_size);
  o.max_runs_per_token = absl::GetFlag(FLAGS_max_runs_per_token);
  o.reflection = absl::GetFlag(FLAGS_reflection);
  o.ingest.max_step_jump = absl::GetFlag(FLAGS_max_step_jump);
  o.ingest.engine_snapshot_steps = absl::GetFlag(FLAGS_engine_snapshot_steps);
  o.ingest.commit_interval_ms = absl::GetFlag(FLAGS_commit_interval_ms);
  o.ingest.liveness.stall_floor_ms = absl::GetFlag(FLAGS_stall_floor_seconds) * 1000;
  o.ingest.liveness.stall_step_multiple = absl::GetFlag(FLAGS_stall_step_multiple);
  o.ingest.liveness.stall_startup_ms = absl::GetFlag(FLAGS_stall_startup_seconds) * 1000;
  o.ingest.liveness.long_phase_ms = absl::GetFlag(FLAGS_stall_long_phase_seconds) * 1000;
  o.ingest.liveness.straggler_ratio = absl::GetFlag(FLAGS_straggler_ratio);
  o.ingest.liveness.straggler_steps = absl::GetFlag(FLAGS_straggler_steps);
  // These three change type or unit on the way into the options, so they are
  // checked as given.
  const int64_t max_runs = absl::GetFlag(FLAGS_max_runs_in_memory);
  const int64_t stale_s = absl::GetFlag(FLAGS_metrics_stale_run_s);
  const int64_t metrics_runs = absl::GetFlag(FLAGS_metrics_max_runs);
  const int64_t snapshots_kept = absl::GetFlag(FLAGS_engine_snapshots_kept);
  for (absl::Status s :
       {trainwatch::server::CheckFlagRange("max_runs_in_memory", max_runs, 1,
                                           trainwatch::server::kMaxRunsLimit),
        trainwatch::server::CheckFlagRange("metrics_stale_run_s", stale_s, 0,
                                           trainwatch::server::kMaxStaleRunSeconds),
        trainwatch::server::CheckFlagRange("metrics_max_runs", metrics_runs, 1,
                                           trainwatch::server::kMaxRunsLimit),
        trainwatch::server::CheckFlagRange("engine_snapshots_kept", snapshots_kept, 1, 1000)}) {
    if (!s.ok()) {
      std::fprintf(stderr, "trainwatchd: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  o.ingest.max_runs_in_memory = static_cast<size_t>(max_runs);
  o.metrics.stale_run_ms = stale_s * 1000;
  o.metrics.max_runs = static_cast<size_t>(metrics_runs);
  o.store.engine_snapshots_kept = static_cast<int>(snapshots_kept);
  if (absl::Status s = trainwatch::server::CheckServerOptions(o); !s.ok()) {
    std::fprintf(stderr, "trainwatchd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (const std::string rules = absl::GetFlag(FLAGS_rules); !rules.empty()) {
    absl::StatusOr<std::string> text = trainwatch::core::LocalFileSystem().ReadFile(rules);
    if (!text.ok()) {
      std::fprintf(stderr, "trainwatchd: %s\n", std::string(text.status().message()).c_str());
      return 2;
    }
    auto cfg = trainwatch::core::ParseRuleConfigJson(*text, rules);
    if (!cfg.ok()) {
      std::fprintf(stderr, "trainwatchd: %s\n", std::string(cfg.status().message()).c_str());
      return 2;
    }
    o.ingest.rules = *cfg;
    o.ingest.rules_source = "server --rules";
  }
  if (const std::string file = absl::GetFlag(FLAGS_run_rules); !file.empty()) {
    absl::StatusOr<std::string> text = trainwatch::core::LocalFileSystem().ReadFile(file);
    absl::StatusOr<std::vector<trainwatch::server::RunRules>> run_rules =
        text.ok() ? trainwatch::server::ParseRunRulesJson(*text, file)
                  : absl::StatusOr<std::vector<trainwatch::server::RunRules>>(text.status());
    if (!run_rules.ok()) {
      std::fprintf(stderr, "trainwatchd: --run_rules: %s\n",
                   std::string(run_rules.status().message()).c_str());
      return 2;
    }
    o.ingest.run_rules = *std::move(run_rules);
  }

  // SIGTERM and SIGINT stay blocked in every thread (the server's threads
  // inherit the mask) and main takes them with sigwait: no code runs in a
  // signal handler, where almost nothing is safe.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // One thread takes the signals, whether they come while a standby waits
  // or while the server runs.
  std::atomic<bool> stop{false};
  std::mutex stop_mu;
  std::condition_variable stopped;
  std::thread([&] {
    int received = 0;
    sigwait(&stop_signals, &received);
    {
      std::lock_guard<std::mutex> lock(stop_mu);
      stop = true;
    }
    stopped.notify_all();
  }).detach();

  std::unique_ptr<trainwatch::server::LeaseKeeper> leases;
  if (!o.replica.empty()) {
    // Checked first: a standby with a bad flag would only say so at takeover.
    if (absl::Status s = trainwatch::server::CheckServerOptions(o); !s.ok()) {
      std::fprintf(stderr, "trainwatchd: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    trainwatch::server::ShardLeaseOptions lo;
    lo.holder = o.replica;
    lo.shards = o.shards;
    lo.lease_ms = o.lease_ms;
    lo.margin_ms = o.lease_ms / 10;
    auto keeper = trainwatch::server::LeaseKeeper::Open(o.db_path, lo);
    if (!keeper.ok()) {
      std::fprintf(stderr, "trainwatchd: --replica: %s\n",
                   std::string(keeper.status().message()).c_str());
      return keeper.status().code() == absl::StatusCode::kUnavailable ? 1 : 2;
    }
    leases = std::move(*keeper);
    // The first replica up owns the shards at once; the others stand by.
    leases->TryOwnership();
  }

  auto server = trainwatch::server::Server::Start(o, trainwatch::core::SystemClock(), leases.get());
  if (!server.ok()) {
    std::fprintf(stderr, "trainwatchd: %s\n", std::string(server.status().message()).c_str());
    // UNAVAILABLE: could not bind or open; anything else: a flag's file.
    return server.status().code() == absl::StatusCode::kUnavailable ? 1 : 2;
  }
  // Machine-readable, for scripts and tests that ask for port 0.
  std::printf("metrics on 127.0.0.1:%d\nlistening on 127.0.0.1:%d\n", (*server)->metrics_port(),
              (*server)->port());
  std::fflush(stdout);
  if ((*server)->standby()) {
    // Serving the operator's reads meanwhile.
    if (!leases->AwaitOwnership(stop)) {
      (*server)->Shutdown();
      return 0;  // a signal while standing by
    }
    if (absl::Status s = (*server)->TakeOver(); !s.ok()) {
      std::fprintf(stderr, "trainwatchd: taking over: %s\n", std::string(s.message()).c_str());
      (*server)->Shutdown();
      // Given back, so that another standby need not wait out the lease.
      leases->Release().IgnoreError();
      return 1;
    }
    LOG(INFO) << "trainwatchd: replica " << o.replica << " owns all " << o.shards
              << " shards; taking agent streams";
  }
  // Machine-readable too: from here on records are taken.
  std::printf("serving agents on 127.0.0.1:%d\n", (*server)->port());
  std::fflush(stdout);
  {
    std::unique_lock<std::mutex> lock(stop_mu);
    stopped.wait(lock, [&] { return stop.load(); });
  }
  std::fprintf(stderr, "trainwatchd: signal received, draining\n");
  (*server)->Shutdown();
  // Given back, so that a standby takes over without waiting out the lease.
  if (leases != nullptr) leases->Release().IgnoreError();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Nothing below should throw; if a library does, say so in one line
  // rather than abort with a core dump.
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainwatchd: unexpected error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "trainwatchd: unexpected error\n");
  }
  return 1;
}
