// A server process started by the load generator: it learns the server's
// address from the server's own stdout, so the server can bind port 0, and
// it stops the server (SIGTERM, then SIGKILL) when done or on failure.

#ifndef TRAINWATCH_BENCH_INGEST_SPAWNED_SERVER_H_
#define TRAINWATCH_BENCH_INGEST_SPAWNED_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trainwatch::bench {

// The address in a readiness line: the text after "listening on " up to the
// next blank. Lines that mention metrics are not readiness lines (a server
// may announce its Prometheus endpoint the same way). Returns an empty
// string for any other line.
std::string ListeningAddressIn(absl::string_view line);

// Not thread-safe; one owner drives it. A background thread copies the
// server's stdout to this process's stderr after the readiness line, so the
// server never blocks on a full pipe.
class SpawnedServer {
 public:
  // Runs `command` as `/bin/sh -c "exec <command>"` (so the process whose
  // memory is measured is the server, not a shell), with stdin from
  // /dev/null, stdout piped here and stderr inherited, and waits up to
  // `ready_timeout` for its readiness line. The child also receives SIGTERM
  // if this process dies first.
  static absl::StatusOr<std::unique_ptr<SpawnedServer>> Start(
      const std::string& command, absl::Duration ready_timeout);

  // Stops the server if Stop() was not called.
  ~SpawnedServer();

  SpawnedServer(const SpawnedServer&) = delete;
  SpawnedServer& operator=(const SpawnedServer&) = delete;

  // As printed by the server, e.g. "127.0.0.1:40123".
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }

  // The server's peak RSS so far; call before Stop().
  absl::StatusOr<int64_t> PeakRssBytes() const;
  // Its bytes handed to write calls so far (ReadWrittenBytes).
  absl::StatusOr<int64_t> WrittenBytes() const;

  // Sends SIGTERM and waits up to `grace` for the process to exit, then
  // kills it. OK when it exited with status 0 or on the SIGTERM itself.
  absl::Status Stop(absl::Duration grace);

 private:
  SpawnedServer(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {}

  // Reads stdout lines until the readiness line, EOF or the deadline.
  absl::Status AwaitReady(absl::Time deadline);
  void Drain();

  const pid_t pid_;
  const int stdout_fd_;
  std::string address_;
  // Bytes read past the readiness line, handed to the drain thread.
  std::string pending_;
  bool stopped_ = false;
  std::atomic<bool> stop_drain_{false};
  std::thread drain_;
};

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_SPAWNED_SERVER_H_
