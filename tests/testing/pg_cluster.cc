#include "testing/pg_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainwatch::testing {

namespace {

using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr char kDefaultBin[] = "/usr/lib/postgresql/15/bin";
constexpr char kOsUser[] = "postgres";
// How long the slowest steps may take on a loaded 2-core machine: far
// beyond their usual second or two, short of a hung test.
constexpr seconds kToolTimeout{90};
constexpr seconds kWaitTimeout{60};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string LastLines(const std::string& text, int lines) {
  size_t pos = text.size();
  if (pos > 0 && text[pos - 1] == '\n') --pos;
  for (int n = 0; n < lines && pos > 0; ++n) {
    const size_t nl = text.rfind('\n', pos - 1);
    if (nl == std::string::npos) return text;
    pos = nl;
  }
  return text.substr(pos == 0 ? 0 : pos + 1);
}

absl::Status AppendFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::app);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot append to ", path));
  return absl::OkStatus();
}

// A TCP port nothing listens on now. The servers never open TCP, but the
// port names their socket file, and a free one keeps that name unique even
// if someone later turns TCP on.
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  if (port == 0) return absl::InternalError("no free port");
  return port;
}

// A process's state letter from /proc ('R', 'S', 'T' stopped, 'Z' zombie),
// and its parent; '\0' when it is gone.
char ProcState(pid_t pid, pid_t* parent = nullptr) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');  // the name may hold spaces
  if (paren == std::string::npos || paren + 2 >= stat.size()) return '\0';
  std::istringstream rest(stat.substr(paren + 2));
  char state = '\0';
  pid_t ppid = 0;
  rest >> state >> ppid;
  if (parent != nullptr) *parent = ppid;
  return state;
}

bool Alive(pid_t pid) {
  const char s = ProcState(pid);
  return s != '\0' && s != 'Z' && s != 'X';
}

std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    pid_t ppid = 0;
    if (ProcState(pid, &ppid) != '\0' && ppid == parent) out.push_back(pid);
  }
  return out;
}

// A postgres server process, not some later process that reused its pid.
bool IsPostgres(pid_t pid) {
  const std::string cmd = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  return absl::StartsWith(cmd, "postgres") || absl::StrContains(cmd, "/postgres");
}

template <typename Predicate>
bool WaitFor(Predicate predicate, Clock::duration timeout,
             Clock::duration interval = std::chrono::milliseconds(20)) {
  const auto end = Clock::now() + timeout;
  while (!predicate()) {
    if (Clock::now() >= end) return false;
    std::this_thread::sleep_for(interval);
  }
  return true;
}

// One statement on a fresh connection; the first cell of its result ("" when
// none). *warned is set when the server raised a WARNING.
absl::StatusOr<std::string> QueryOnce(const std::string& conninfo, const std::string& sql,
                                      bool* warned = nullptr) {
  PGconn* conn = PQconnectdb(conninfo.c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    absl::Status s = absl::UnavailableError(absl::StrCat("connect: ", PQerrorMessage(conn)));
    PQfinish(conn);
    return s;
  }
  bool warning = false;
  PQsetNoticeReceiver(
      conn,
      [](void* arg, const PGresult* r) {
        const char* severity = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
        if (severity != nullptr && std::string(severity) == "WARNING")
          *static_cast<bool*>(arg) = true;
      },
      &warning);
  PGresult* r = PQexec(conn, sql.c_str());
  absl::StatusOr<std::string> out;
  const ExecStatusType st = PQresultStatus(r);
  if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
    out = PQntuples(r) > 0 && PQnfields(r) > 0 ? std::string(PQgetvalue(r, 0, 0)) : "";
  } else {
    out = absl::FailedPreconditionError(absl::StrCat(sql, ": ", PQerrorMessage(conn)));
  }
  PQclear(r);
  PQfinish(conn);
  if (warned != nullptr) *warned = warning;
  return out;
}

}  // namespace

PgCluster::PgCluster() : dir_("trainwatch_pg_") {
  const char* bin = std::getenv("TRAINWATCH_PG_BIN");
  bin_ = bin != nullptr && *bin != '\0' ? bin : kDefaultBin;
}

absl::StatusOr<std::unique_ptr<PgCluster>> PgCluster::Start(bool with_standby) {
  std::unique_ptr<PgCluster> c(new PgCluster());
  c->with_standby_ = with_standby;
  const std::string& dir = c->dir_.path();
  if (dir.empty()) return absl::InternalError("pg cluster: cannot make a temporary folder");
  if (!std::filesystem::exists(c->bin_ + "/initdb")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pg cluster: no ", c->bin_, "/initdb: install postgresql-15 (scripts/install-deps.sh)"));
  }
  if (geteuid() == 0) {
    const passwd* pw = getpwnam(kOsUser);
    if (pw == nullptr) {
      return absl::FailedPreconditionError(
          "pg cluster: running as root needs the postgres user (Debian's postgresql-15 makes it)");
    }
    if (chown(dir.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
      return absl::InternalError(absl::StrCat("pg cluster: cannot chown ", dir, " to postgres"));
    }
  }

  for (Node node : {Node::kPrimary, Node::kStandby}) {
    NodeState& n = c->state(node);
    n.name = node == Node::kPrimary ? "primary" : kStandbyName;
    n.data = absl::StrCat(dir, "/", n.name);
    n.log = absl::StrCat(dir, "/", n.name, ".log");
    absl::StatusOr<int> port = FreePort();
    if (!port.ok()) return port.status();
    n.port = *port;
  }
  if (c->state(Node::kStandby).port == c->state(Node::kPrimary).port) {
    absl::StatusOr<int> port = FreePort();
    if (!port.ok() || *port == c->state(Node::kPrimary).port) {
      return absl::InternalError("pg cluster: no second free port");
    }
    c->state(Node::kStandby).port = *port;
  }

  NodeState& primary = c->state(Node::kPrimary);
  // --no-sync: a test's cluster need not survive a power loss, and syncing
  // its thousand new files costs seconds. The servers keep fsync on.
  absl::Status s = c->RunTool(
      {"initdb", "-D", primary.data, "-U", "postgres", "--auth=trust", "--no-sync", "--locale=C",
       "--encoding=UTF8"},
      kToolTimeout, absl::StrCat("initdb (the postgres user must be able to reach ", dir, ")"));
  if (!s.ok()) return s;
  std::string conf = absl::StrCat("\n# trainwatch tests (tests/testing/pg_cluster.cc)\n",
                                  "listen_addresses = ''\n", "unix_socket_directories = '", dir,
                                  "'\n", "port = ", primary.port, "\n", "shared_buffers = 16MB\n",
                                  "max_connections = 40\n", "lc_messages = 'C'\n");
  if (with_standby) {
    absl::StrAppend(&conf, "synchronous_standby_names = 'ANY 1 (", kStandbyName, ")'\n");
  }
  if (s = AppendFile(primary.data + "/postgresql.conf", conf); !s.ok()) return s;
  if (s = c->StartNode(Node::kPrimary); !s.ok()) return s;
  if (!with_standby) return c;

  NodeState& standby = c->state(Node::kStandby);
  s = c->RunTool({"pg_basebackup", "-D", standby.data, "-R", "-X", "stream", "-c", "fast",
                  "--no-sync", "-h", dir, "-p", absl::StrCat(primary.port), "-U", "postgres"},
                 kToolTimeout, "pg_basebackup");
  if (!s.ok()) return c->WithLog(Node::kPrimary, s);
  // The copied postgresql.conf is the primary's: the standby needs its own
  // port, and a primary_conninfo (later lines win over -R's) naming it as
  // synchronous_standby_names does.
  if (s = AppendFile(standby.data + "/postgresql.conf",
                     absl::StrCat("port = ", standby.port, "\n"));
      !s.ok()) {
    return s;
  }
  s = AppendFile(standby.data + "/postgresql.auto.conf",
                 absl::StrCat("primary_conninfo = 'host=", dir, " port=", primary.port,
                              " user=postgres application_name=", kStandbyName, "'\n"));
  if (!s.ok()) return s;
  if (s = c->StartNode(Node::kStandby); !s.ok()) return s;
  if (s = c->WaitForSyncStandby(kWaitTimeout); !s.ok()) return s;
  return c;
}

PgCluster::~PgCluster() {
  for (Node node : {Node::kStandby, Node::kPrimary}) {
    NodeState& n = state(node);
    Resume(node).IgnoreError();
    if (n.running) {
      absl::Status s =
          RunTool({"pg_ctl", "stop", "-m", "immediate", "-w", "-t", "30", "-D", n.data},
                  seconds(45), "pg_ctl stop");
      if (!s.ok() && n.postmaster > 0 && IsPostgres(n.postmaster)) kill(n.postmaster, SIGKILL);
      n.running = false;
    }
    for (pid_t pid : n.orphans) {
      if (Alive(pid) && IsPostgres(pid)) kill(pid, SIGKILL);
    }
  }
}

std::string PgCluster::Conninfo(Node node) const {
  return absl::StrCat("host=", dir_.path(), " port=", state(node).port,
                      " user=postgres dbname=postgres connect_timeout=10");
}

std::string PgCluster::Uri(Node node) const {
  return absl::StrCat("postgresql://postgres@/postgres?host=", dir_.path(),
                      "&port=", state(node).port, "&connect_timeout=10");
}

std::string PgCluster::MultiHostConninfo() const {
  return absl::StrCat("host=", dir_.path(), ",", dir_.path(), " port=", state(Node::kPrimary).port,
                      ",", state(Node::kStandby).port,
                      " user=postgres dbname=postgres connect_timeout=10"
                      " target_session_attrs=read-write");
}

absl::Status PgCluster::Kill(Node node) {
  NodeState& n = state(node);
  if (!n.running) return absl::FailedPreconditionError(absl::StrCat(n.name, " is not running"));
  n.orphans = ChildrenOf(n.postmaster);
  if (kill(n.postmaster, SIGKILL) != 0) {
    return absl::InternalError(absl::StrCat("kill -9 of ", n.name, " failed"));
  }
  n.running = false;
  if (!WaitFor([&] { return !Alive(n.postmaster); }, seconds(10))) {
    return absl::DeadlineExceededError(absl::StrCat(n.name, "'s postmaster outlived kill -9"));
  }
  return absl::OkStatus();
}

absl::Status PgCluster::Pause(Node node) {
  NodeState& n = state(node);
  if (!n.running) return absl::FailedPreconditionError(absl::StrCat(n.name, " is not running"));
  if (!n.paused.empty()) return absl::FailedPreconditionError(absl::StrCat(n.name, " is paused"));
  // The postmaster first, so that it starts nothing while its children stop.
  if (kill(n.postmaster, SIGSTOP) != 0) return absl::InternalError("SIGSTOP failed");
  n.paused.push_back(n.postmaster);
  for (pid_t child : ChildrenOf(n.postmaster)) {
    if (kill(child, SIGSTOP) == 0) n.paused.push_back(child);
  }
  const bool stopped = WaitFor(
      [&] {
        return std::all_of(n.paused.begin(), n.paused.end(), [](pid_t pid) {
          const char s = ProcState(pid);
          return s == 'T' || s == '\0' || s == 'Z';
        });
      },
      seconds(10));
  if (!stopped) return absl::DeadlineExceededError(absl::StrCat(n.name, " did not stop"));
  return absl::OkStatus();
}

absl::Status PgCluster::Resume(Node node) {
  NodeState& n = state(node);
  // Children first: the postmaster, resumed, must find them running.
  for (auto it = n.paused.rbegin(); it != n.paused.rend(); ++it) kill(*it, SIGCONT);
  n.paused.clear();
  return absl::OkStatus();
}

absl::Status PgCluster::Promote(Node node) {
  NodeState& n = state(node);
  absl::Status s = RunTool({"pg_ctl", "promote", "-w", "-t", "60", "-D", n.data}, kToolTimeout,
                           "pg_ctl promote");
  if (!s.ok()) return WithLog(node, s);
  for (const char* sql :
       {"ALTER SYSTEM SET synchronous_standby_names = ''", "SELECT pg_reload_conf()"}) {
    if (absl::StatusOr<std::string> r = QueryOnce(Conninfo(node), sql); !r.ok()) {
      return WithLog(node, r.status());
    }
  }
  // The reload reaches the checkpointer, which tells waiting commits, a
  // little later than it reaches new sessions: probe with a commit whose
  // wait a statement_timeout would cancel (the WARNING says it waited).
  const std::string probe = Conninfo(node) + " options='-c statement_timeout=2000'";
  absl::Status last;
  const bool ok = WaitFor(
      [&] {
        bool warned = false;
        absl::StatusOr<std::string> r =
            QueryOnce(probe, "CREATE TEMP TABLE pg_cluster_probe (i int)", &warned);
        last = r.ok() ? (warned ? absl::UnavailableError("the probe commit waited for a standby")
                                : absl::OkStatus())
                      : r.status();
        return last.ok();
      },
      kWaitTimeout, std::chrono::milliseconds(100));
  if (!ok) {
    return WithLog(node, absl::DeadlineExceededError(absl::StrCat(
                             n.name, ": commits still wait after promotion: ", last.message())));
  }
  return absl::OkStatus();
}

std::string PgCluster::LogTail(Node node, int lines) const {
  return LastLines(ReadFile(state(node).log), lines);
}

absl::Status PgCluster::RunTool(const std::vector<std::string>& args, seconds timeout,
                                const std::string& step) {
  std::vector<std::string> argv;
  if (geteuid() == 0) {
    const char* runuser =
        access("/usr/sbin/runuser", X_OK) == 0 ? "/usr/sbin/runuser" : "/sbin/runuser";
    argv = {runuser, "-u", kOsUser, "--"};
  }
  argv.push_back(absl::StrCat(bin_, "/", args[0]));
  argv.insert(argv.end(), args.begin() + 1, args.end());
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);

  // Everything the child needs is made before fork(): the test may have
  // other threads, so the child only calls async-signal-safe functions.
  const std::string out_path = dir_.path() + "/tool.out";
  const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (out < 0 || in < 0) {
    if (out >= 0) close(out);
    if (in >= 0) close(in);
    return absl::InternalError(absl::StrCat(step, ": cannot open ", out_path));
  }
  const char* cwd = dir_.path().c_str();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);  // its own group, so that a timeout kills all of it
    if (chdir(cwd) != 0) _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    dup2(out, 2);
    // The test's own descriptors (sockets, files) must not leak into a
    // postmaster that may outlive it.
    syscall(SYS_close_range, 3U, ~0U, 0U);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(out);
  close(in);
  if (pid < 0) return absl::InternalError(absl::StrCat(step, ": fork failed"));

  int status = 0;
  const auto end = Clock::now() + timeout;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return absl::InternalError(absl::StrCat(step, ": waitpid failed"));
    if (Clock::now() >= end) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return absl::DeadlineExceededError(absl::StrCat(step, ": no answer in ", timeout.count(),
                                                      " s; its output:\n",
                                                      LastLines(ReadFile(out_path), 20)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  const std::string how = WIFEXITED(status) ? absl::StrCat("exit ", WEXITSTATUS(status))
                                            : absl::StrCat("signal ", WTERMSIG(status));
  return absl::InternalError(absl::StrCat(step, " failed (", how, ": ", absl::StrJoin(argv, " "),
                                          "); its output:\n", LastLines(ReadFile(out_path), 20)));
}

absl::Status PgCluster::StartNode(Node node) {
  NodeState& n = state(node);
  absl::Status s = RunTool({"pg_ctl", "start", "-w", "-t", "60", "-D", n.data, "-l", n.log},
                           kToolTimeout, absl::StrCat("pg_ctl start of ", n.name));
  if (!s.ok()) return WithLog(node, s);
  // postmaster.pid's first line is the postmaster's pid.
  std::istringstream pidfile(ReadFile(n.data + "/postmaster.pid"));
  pidfile >> n.postmaster;
  if (n.postmaster <= 0) {
    return WithLog(node, absl::InternalError(absl::StrCat(n.name, ": no postmaster.pid")));
  }
  n.running = true;
  return absl::OkStatus();
}

absl::Status PgCluster::WaitForSyncStandby(seconds timeout) {
  const std::string sql = absl::StrCat(
      "SELECT sync_state FROM pg_stat_replication WHERE application_name = '", kStandbyName, "'");
  std::string last = "no row";
  const bool ok = WaitFor(
      [&] {
        absl::StatusOr<std::string> r = QueryOnce(Conninfo(Node::kPrimary), sql);
        last = r.ok() ? (r->empty() ? "no row" : *r) : std::string(r.status().message());
        // 'quorum' for ANY n, 'sync' for FIRST n.
        return r.ok() && (*r == "sync" || *r == "quorum");
      },
      timeout, std::chrono::milliseconds(50));
  if (ok) return absl::OkStatus();
  return WithLog(Node::kStandby, absl::DeadlineExceededError(absl::StrCat(
                                     "the standby was not synchronous within ", timeout.count(),
                                     " s (pg_stat_replication.sync_state: ", last, ")")));
}

absl::Status PgCluster::WithLog(Node node, const absl::Status& status) const {
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), "\n--- ", state(node).name, " server log (",
                                   state(node).log, ") ---\n", LogTail(node)));
}

}  // namespace trainwatch::testing
