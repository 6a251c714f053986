// trainwatchd as a library: the gRPC services (agent stream, operator API,
// health, reflection), the ingest writer, the store and the Prometheus
// exporter, wired together. main() parses flags into ServerOptions, calls
// Start() (a replica not owning the shards starts as a standby, and main
// calls TakeOver() once it owns them), waits for a signal and calls
// Shutdown().

#ifndef TRAINWATCH_SERVER_SERVER_H_
#define TRAINWATCH_SERVER_SERVER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/core/clock.h"
#include "exporter/exporter.h"
#include "ingest/ingest.h"

namespace trainwatch::server {

class LeaseKeeper;  // daemon/lease_keeper.h

// Each field is the trainwatchd flag of the same name; CheckServerOptions
// says which values are accepted.
struct ServerOptions {
  // gRPC listen address, host:port (an IPv4 address, [IPv6] or a host name;
  // port 0 to 65535, 0 picks a free one, see Server::port()), or unix:PATH.
  std::string listen = "127.0.0.1:7070";
  // Prometheus /metrics listen address, host:port; empty disables the exporter.
  std::string metrics_listen = "127.0.0.1:9464";
  // The store (Store::Open): a SQLite file, not empty, not ":memory:" and
  // not a directory (an acknowledged record must survive a restart); or a
  // PostgreSQL conninfo, a postgresql:// URI or libpq keywords.
  std::string db_path = "trainwatch.db";
  std::string tokens_file;  // empty: authentication off
  // TLS (PEM files); mutual TLS when client_ca_file is set.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // Largest gRPC message either way, in [kMinMessageBytes, kMaxMessageBytes].
  int max_message_bytes = 4 << 20;
  // Both > 0.
  int keepalive_time_ms = 30'000;
  int keepalive_timeout_ms = 10'000;
  // Server reflection (grpc.reflection.v1alpha); with authentication on it
  // takes any valid token.
  bool reflection = true;
  // Largest world_size an agent may claim, in [1, kMaxWorldSizeLimit].
  int max_world_size = 65'536;
  // Distinct runs one agent token may create (see RunCreationLimit in
  // auth.h), in [1, kMaxRunsPerTokenLimit].
  int max_runs_per_token = 1'000;
  // Base URL of the Grafana dashboard, for links in summaries.
  std::string grafana_url;
  // Pager receivers (JSON, see pager.h); empty: no pages.
  std::string pager_config_file;
  // Replicas on one PostgreSQL database (daemon/lease_keeper.h): this
  // replica's name in the lease table, 1 to 64 of [A-Za-z0-9._-]; empty: a
  // single trainwatchd, no leases. See Server::Start and TakeOver.
  std::string replica;
  int64_t lease_ms = 10'000;  // in [kMinLeaseMs, kMaxLeaseMs]
  int shards = 64;            // in [1, kMaxShards]; the same on every replica
  // How often a standby reads the store for its operator API (api/
  // standby_reads.h), in [kMinStandbyRefreshMs, kMaxLeaseMs].
  int64_t standby_refresh_ms = 2'000;
  StoreOptions store;  // the database quota, the busy timeout
  IngestOptions ingest;
  // What /metrics exports (stale runs, how many runs at most).
  ExporterOptions metrics;
};

inline constexpr int kMinMessageBytes = 1024;
inline constexpr int kMaxMessageBytes = 1 << 30;
inline constexpr int kMaxWorldSizeLimit = 1'000'000;
inline constexpr int kMaxRunsPerTokenLimit = 1'000'000;
inline constexpr int64_t kMinLeaseMs = 1'000;
inline constexpr int64_t kMaxLeaseMs = 600'000;
inline constexpr int kMaxShards = 4'096;
inline constexpr int64_t kMinStandbyRefreshMs = 100;
// --aggregation_timeout_ms: 1 ms to a day.
inline constexpr int64_t kMaxAggregationTimeoutMs = 86'400'000;
// --max_runs_in_memory and --metrics_max_runs.
inline constexpr int64_t kMaxRunsLimit = 1'000'000;
// --metrics_stale_run_s: a century, so that the milliseconds fit.
inline constexpr int64_t kMaxStaleRunSeconds = int64_t{100} * 365 * 86400;

// OK when `lo <= value <= hi`; otherwise an error naming --flag and the range.
absl::Status CheckFlagRange(absl::string_view flag, int64_t value, int64_t lo, int64_t hi);

// OK for a listen address of the form above (`allow_unix`: unix:PATH too);
// INVALID_ARGUMENT saying what is wrong otherwise.
absl::Status CheckListenAddress(const std::string& address, bool allow_unix);

// trainwatchd --run_rules: a JSON object mapping a run-id pattern (a glob,
// as fnmatch(3): "nightly-*") to an object of RuleConfig fields, the rules
// of the runs it matches whose agents announce none (ingest.h, "The run's
// rules"). Patterns are tried in file order and the first match wins, so
// list exact ids before broad globs. INVALID_ARGUMENT naming `source`, the
// pattern and what is wrong otherwise.
absl::StatusOr<std::vector<RunRules>> ParseRunRulesJson(absl::string_view json,
                                                         absl::string_view source);

// Every option's range and form, checked before anything starts; the
// message names the flag and what it accepts, on one line.
absl::Status CheckServerOptions(const ServerOptions& options);

// True for addresses that stay on this machine (127.0.0.0/8, [::1],
// localhost, unix sockets).
bool IsLoopback(const std::string& address);

class Server {
 public:
  // Checks the options (CheckServerOptions), opens the store, rebuilds every
  // run's state, starts the writer, the exporter and the gRPC server. Fails
  // with a clear status on a bad option (INVALID_ARGUMENT; unreadable tokens
  // or certificates: the file system's code) or when it cannot start
  // (UNAVAILABLE: a port in use, the database cannot be opened).
  //
  // With `leases` (options.replica set) that do not own every shard yet, it
  // starts as a standby: the operator API serves reads from the store
  // (api/standby_reads.h), decisions and agent streams are refused with
  // ABORTED naming the owner, grpc.health.v1 says NOT_SERVING for
  // trainwatch.v1.AgentService, and /metrics has the leases alone. TakeOver
  // then makes it the owner. An owner's every write is fenced by the
  // leases, pages are sent only while they hold, and they are renewed; when
  // they are lost the process exits with status 3 at once, acknowledging
  // nothing more. REQUIRES: `leases` outlives the server.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       core::Clock* clock = core::SystemClock(),
                                                       LeaseKeeper* leases = nullptr);
  // A standby whose leases now own every shard becomes the owner, as a
  // restarted trainwatchd starts: every run from the store (engines from
  // their newest snapshots plus the tail, in the background), the pager's
  // outbox resumed, and only then agent streams taken and the ingest
  // service SERVING. REQUIRES: started as a standby, called once.
  absl::Status TakeOver();
  bool standby() const;
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  int metrics_port() const;
  // Stops taking calls, lets streams drain until `deadline`, writes what was
  // received, and closes the store.
  void Shutdown(std::chrono::milliseconds deadline = std::chrono::seconds(5));

  Ingestor* ingestor();  // null on a standby
  Store* store();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_SERVER_H_
