#include "stack.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "testing/wait.h"
#include "trainwatch/core/json.h"

namespace trainwatch::testing {

namespace {

bool WaitReady(int port, const std::string& path, const std::string& want, int seconds) {
  return WaitUntil([&] { return HttpGet(port, path).find(want) != std::string::npos; },
                   std::chrono::seconds(seconds), std::chrono::milliseconds(50));
}

// Checks `config` with `checker` (promtool, amtool), starts `argv` with its
// output in `log`, and waits until GET `ready_path` answers `ready_text`.
std::unique_ptr<Child> StartChecked(const std::string& checker, const std::string& config,
                                    const std::vector<std::string>& argv, const std::string& log,
                                    int port, const std::string& ready_path,
                                    const std::string& ready_text) {
  std::string out;
  const int rc = RunCommand(checker + " " + config, "", &out);
  INFO(out);
  REQUIRE(rc == 0);
  auto child = std::make_unique<Child>(argv, log);
  const bool ready = WaitReady(port, ready_path, ready_text, 30);
  INFO(ReadFile(log));
  REQUIRE(ready);
  return child;
}

}  // namespace

Child::Child(const std::vector<std::string>& argv, const std::string& log,
             const std::map<std::string, std::string>& env) {
  REQUIRE(!argv.empty());
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Emptied here, not only in the child: a reader of the log right after
  // this constructor must never see an earlier process's lines.
  close(open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  pid_ = fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    setpgid(0, 0);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s\n", args[0]);
    _exit(127);
  }
  setpgid(pid_, pid_);
  pgid_ = pid_;
}

Child::~Child() { Stop(); }

int Child::Wait(int seconds) {
  if (pid_ <= 0) return status_;
  auto exited = [this] {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) != pid_) return false;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    pid_ = -1;
    return true;
  };
  // With no time (seconds == 0) the process is checked once.
  return WaitUntil(exited, std::chrono::seconds(seconds), std::chrono::milliseconds(100))
             ? status_
             : -1;
}

bool Child::running() { return Wait(0) == -1 && pid_ > 0; }

void Child::Stop() {
  if (pid_ > 0) {
    kill(-pgid_, SIGTERM);
    if (Wait(10) == -1) {
      kill(-pgid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  // Whatever the child left behind in its group goes too.
  if (pgid_ > 0) kill(-pgid_, SIGKILL);
  pgid_ = -1;
}

void Child::Kill() {
  if (pgid_ > 0) kill(-pgid_, SIGKILL);
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
  pid_ = pgid_ = -1;
}

std::vector<core::JsonValue> FiringAlerts(HttpReceiver& hook, const std::string& incident) {
  std::vector<core::JsonValue> out;
  for (const auto& r : hook.requests()) {
    auto v = core::ParseJson(r.body, "webhook");
    if (!v.ok()) continue;
    for (const core::JsonValue& a : v->Find("alerts")->array) {
      if (a.Find("labels")->Find("incident")->string == incident &&
          a.Find("status")->string == "firing") {
        out.push_back(a);
      }
    }
  }
  return out;
}

bool PagedFiring(HttpReceiver& hook, const std::string& incident) {
  return !FiringAlerts(hook, incident).empty();
}

int64_t QueryInt(const std::string& db, const std::string& sql) {
  sqlite3* h = nullptr;
  REQUIRE(sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_busy_timeout(h, 5000);
  sqlite3_stmt* st = nullptr;
  INFO(sql);
  REQUIRE(sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) == SQLITE_OK);
  int64_t n = -1;
  if (sqlite3_step(st) == SQLITE_ROW) n = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(h);
  return n;
}

Trainwatchd::Trainwatchd(const TempDir& dir, const std::string& rules, const std::string& pager,
                         const std::vector<std::string>& flags)
    : db_(dir.File("trainwatch.db")) {
  std::vector<std::string> argv = {
      TRAINWATCHD_PATH, "--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0", "--db", db_};
  if (!rules.empty()) argv.insert(argv.end(), {"--rules", rules});
  if (!pager.empty()) argv.insert(argv.end(), {"--pager_config", pager});
  argv.insert(argv.end(), flags.begin(), flags.end());
  const std::string log = dir.File("trainwatchd.log");
  child_ = std::make_unique<Child>(argv, log);
  // The ports it chose, from its log.
  WaitUntil(
      [&] {
        std::istringstream lines(ReadFile(log));
        for (std::string line; std::getline(lines, line);) {
          std::sscanf(line.c_str(), "metrics on 127.0.0.1:%d", &metrics_port_);
          std::sscanf(line.c_str(), "listening on 127.0.0.1:%d", &port_);
        }
        return port_ > 0;
      },
      std::chrono::seconds(10), std::chrono::milliseconds(50));
  INFO(ReadFile(log));
  REQUIRE(port_ > 0);
  REQUIRE(metrics_port_ > 0);
}

Alertmanager::Alertmanager(const TempDir& dir, int webhook_port, int gossip_port,
                           const std::vector<int>& peers)
    : port_(FreePort()) {
  const std::string config = dir.File("alertmanager.yml");
  std::ofstream(config) << "route:\n"
                           "  receiver: hook\n"
                           "  group_by: ['incident']\n"
                           "  group_wait: 1s\n"
                           "  group_interval: 1s\n"
                           "  repeat_interval: 1h\n"
                           "receivers:\n"
                           "  - name: hook\n"
                           "    webhook_configs:\n"
                           "      - url: http://127.0.0.1:"
                        << webhook_port << "/am-webhook\n        send_resolved: true\n";
  std::vector<std::string> argv = {"/usr/bin/prometheus-alertmanager", "--config.file=" + config,
                                   "--storage.path=" + dir.File("am-data"),
                                   "--web.listen-address=127.0.0.1:" + std::to_string(port_)};
  if (gossip_port <= 0) {
    argv.push_back("--cluster.listen-address=");
  } else {
    // On loopback memberlist finds no private address to advertise, so it is
    // named. A peer waits its position times peer-timeout before notifying
    // (the default 15 s): 4 s keeps a test short and still lets the first
    // instance's notification gossip to the others first on a loaded machine.
    const std::string self = "127.0.0.1:" + std::to_string(gossip_port);
    argv.push_back("--cluster.listen-address=" + self);
    argv.push_back("--cluster.advertise-address=" + self);
    argv.push_back("--cluster.peer-timeout=4s");
    for (int peer : peers) argv.push_back("--cluster.peer=127.0.0.1:" + std::to_string(peer));
  }
  child_ = StartChecked("amtool check-config", config, argv, dir.File("alertmanager.log"), port_,
                        "/-/ready", "OK");
}

std::string Alertmanager::WritePagerConfig(const TempDir& dir,
                                           const std::string& grafana_url) const {
  return WritePagerConfig(dir, grafana_url, {this});
}

std::string Alertmanager::WritePagerConfig(const TempDir& dir, const std::string& grafana_url,
                                           const std::vector<const Alertmanager*>& cluster) {
  const std::string path = dir.File("pager.json");
  std::ofstream out(path);
  out << "{\"grafana_url\": \"" << grafana_url << "\", \"receivers\": [";
  for (size_t i = 0; i < cluster.size(); ++i) {
    out << (i > 0 ? ", " : "") << "{\"name\": \"am" << (i > 0 ? std::to_string(i) : "")
        << "\", \"type\": \"alertmanager\", \"url\": \"http://127.0.0.1:" << cluster[i]->port()
        << "\"}";
  }
  out << "]}";
  return path;
}

int Alertmanager::ClusterSize() const {
  const std::string body = HttpGet(port_, "/api/v2/status");
  auto json = core::ParseJson(body, "alertmanager status");
  if (!json.ok()) return -1;
  const core::JsonValue* cluster = json->Find("cluster");
  const core::JsonValue* peers = cluster != nullptr ? cluster->Find("peers") : nullptr;
  return peers != nullptr ? static_cast<int>(peers->array.size()) : -1;
}

Prometheus::Prometheus(const TempDir& dir, int metrics_port, const std::string& rule_file)
    : port_(FreePort()) {
  const std::string config = dir.File("prometheus.yml");
  std::ofstream(config) << "global:\n"
                           "  scrape_interval: 1s\n"
                           "  evaluation_interval: 1s\n"
                           "rule_files: ['"
                        << rule_file
                        << "']\n"
                           "scrape_configs:\n"
                           "  - job_name: trainwatchd\n"
                           "    static_configs:\n"
                           "      - targets: ['127.0.0.1:"
                        << metrics_port << "']\n";
  child_ = StartChecked("promtool check config", config,
                        {"/usr/bin/prometheus", "--config.file=" + config,
                         "--storage.tsdb.path=" + dir.File("prom-data"),
                         "--web.listen-address=127.0.0.1:" + std::to_string(port_)},
                        dir.File("prometheus.log"), port_, "/-/ready", "Ready");
}

std::string Prometheus::Query(const std::string& expr) const {
  std::string enc;
  for (unsigned char c : expr) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      enc += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      enc += buf;
    }
  }
  return HttpGet(port_, "/api/v1/query?query=" + enc);
}

}  // namespace trainwatch::testing
