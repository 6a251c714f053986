// trainwatchd as a library: the gRPC services (agent stream, operator API,
// health, reflection), the ingest writer, the store and the Prometheus
// exporter, wired together. main() parses flags into ServerOptions, calls
// Start(), waits for a signal and calls Shutdown().

#ifndef TRAINWATCH_SERVER_SERVER_H_
#define TRAINWATCH_SERVER_SERVER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "trainwatch/core/clock.h"
#include "exporter.h"
#include "ingest.h"

namespace trainwatch::server {

struct ServerOptions {
  // gRPC listen address; port 0 picks a free one (see Server::port()).
  std::string listen = "127.0.0.1:7070";
  // Prometheus /metrics listen address; empty disables the exporter.
  std::string metrics_listen = "127.0.0.1:9464";
  std::string db_path = "trainwatch.db";
  std::string tokens_file;  // empty: authentication off
  // TLS (PEM files); mutual TLS when client_ca_file is set.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  int max_message_bytes = 4 << 20;
  int keepalive_time_ms = 30'000;
  int keepalive_timeout_ms = 10'000;
  // Base URL of the Grafana dashboard, for links in summaries.
  std::string grafana_url;
  // Pager receivers (JSON, see pager.h); empty: no pages.
  std::string pager_config_file;
  StoreOptions store;  // the database quota, the busy timeout
  IngestOptions ingest;
  // What /metrics exports (stale runs, how many runs at most).
  ExporterOptions metrics;
};

// True for addresses that stay on this machine (127.0.0.0/8, [::1],
// localhost, unix sockets).
bool IsLoopback(const std::string& address);

class Server {
 public:
  // Opens the store, rebuilds every run's state, starts the writer, the
  // exporter and the gRPC server. Fails with a clear status on a bad option
  // (unreadable tokens or certificates, a port in use).
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       core::Clock* clock = core::SystemClock());
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  int metrics_port() const;
  // Stops taking calls, lets streams drain until `deadline`, writes what was
  // received, and closes the store.
  void Shutdown(std::chrono::milliseconds deadline = std::chrono::seconds(5));

  Ingestor* ingestor();
  Store* store();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_SERVER_H_
