#include "spawned_server.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proc_status.h"

namespace trainwatch::bench {
namespace {

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status))
    return absl::StrCat("exit status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return absl::StrCat("wait status ", status);
}

void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

std::string ListeningAddressIn(absl::string_view line) {
  constexpr absl::string_view kMarker = "listening on ";
  const size_t at = line.find(kMarker);
  if (at == absl::string_view::npos) return "";
  if (absl::StrContains(absl::AsciiStrToLower(line), "metric")) return "";
  absl::string_view rest = line.substr(at + kMarker.size());
  const size_t end = rest.find_first_of(" \t\r\n");
  if (end != absl::string_view::npos) rest = rest.substr(0, end);
  return std::string(rest);
}

absl::StatusOr<std::unique_ptr<SpawnedServer>> SpawnedServer::Start(
    const std::string& command, absl::Duration ready_timeout) {
  if (command.empty())
    return absl::InvalidArgumentError("empty --spawn command");
  // Everything the child needs is built before fork(): after it, only
  // async-signal-safe calls are allowed.
  const std::string script = absl::StrCat("exec ", command);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", strerror(err)));
  }
  if (pid == 0) {
    // The parent may have blocked SIGINT/SIGTERM to wait for them; the
    // server must see them.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(fds[1], STDOUT_FILENO);
    execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::unique_ptr<SpawnedServer> server(new SpawnedServer(pid, fds[0]));
  if (absl::Status s = server->AwaitReady(absl::Now() + ready_timeout);
      !s.ok()) {
    // The destructor stops the process.
    return absl::Status(s.code(), absl::StrCat("spawned server '", command,
                                               "': ", s.message()));
  }
  server->drain_ = std::thread([raw = server.get()] { raw->Drain(); });
  return server;
}

absl::Status SpawnedServer::AwaitReady(absl::Time deadline) {
  std::string buffer;
  char chunk[4096];
  while (true) {
    size_t newline;
    while ((newline = buffer.find('\n')) != std::string::npos) {
      const std::string line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      WriteAll(STDERR_FILENO, absl::StrCat("[server] ", line, "\n"));
      std::string address = ListeningAddressIn(line);
      if (!address.empty()) {
        address_ = std::move(address);
        pending_ = std::move(buffer);
        return absl::OkStatus();
      }
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          "no 'listening on HOST:PORT' line on its stdout in time");
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    const int ready = poll(&p, 1,
                           static_cast<int>(std::max<int64_t>(
                               1, absl::ToInt64Milliseconds(left))));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int status = 0;
      const pid_t reaped = waitpid(pid_, &status, WNOHANG);
      return absl::FailedPreconditionError(absl::StrCat(
          "closed its stdout before printing 'listening on HOST:PORT'",
          reaped == pid_ ? absl::StrCat(" (", DescribeWaitStatus(status), ")")
                         : ""));
    }
    buffer.append(chunk, static_cast<size_t>(n));
  }
}

void SpawnedServer::Drain() {
  // The server's output after readiness goes to stderr, line by line with
  // the same prefix, until EOF.
  std::string buffer = std::move(pending_);
  char chunk[4096];
  bool eof = false;
  while (!eof) {
    pollfd p{stdout_fd_, POLLIN, 0};
    const int ready = poll(&p, 1, 100);
    // Once the server is reaped, what it wrote is already in the pipe; an
    // idle pipe then means a descendant holds it open, and waiting on it
    // would never end.
    if (ready == 0 && stop_drain_.load()) break;
    if (ready > 0) {
      const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        eof = true;
      } else {
        buffer.append(chunk, static_cast<size_t>(n));
      }
    }
    size_t newline;
    while ((newline = buffer.find('\n')) != std::string::npos) {
      WriteAll(STDERR_FILENO,
               absl::StrCat("[server] ", buffer.substr(0, newline + 1)));
      buffer.erase(0, newline + 1);
    }
  }
  if (!buffer.empty()) {
    WriteAll(STDERR_FILENO, absl::StrCat("[server] ", buffer, "\n"));
  }
}

absl::StatusOr<int64_t> SpawnedServer::PeakRssBytes() const {
  return ReadPeakRssBytesOf(pid_);
}

absl::StatusOr<int64_t> SpawnedServer::WrittenBytes() const { return ReadWrittenBytesOf(pid_); }

absl::Status SpawnedServer::Stop(absl::Duration grace) {
  if (stopped_) return absl::OkStatus();
  stopped_ = true;
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  int status = 0;
  bool reaped = false;
  while (absl::Now() < deadline) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      reaped = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::Status result = absl::OkStatus();
  if (!reaped) {
    kill(pid_, SIGKILL);
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    result = absl::DeadlineExceededError(
        absl::StrCat("server did not exit within ", absl::FormatDuration(grace),
                     " of SIGTERM; killed"));
  } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) &&
             !(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM)) {
    result = absl::InternalError(
        absl::StrCat("server ended with ", DescribeWaitStatus(status)));
  }
  stop_drain_.store(true);
  if (drain_.joinable()) drain_.join();
  close(stdout_fd_);
  return result;
}

SpawnedServer::~SpawnedServer() {
  if (!stopped_) (void)Stop(absl::Seconds(5));
  if (drain_.joinable()) {
    stop_drain_.store(true);
    drain_.join();
  }
}

}  // namespace trainwatch::bench
