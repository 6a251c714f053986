// Real processes for integration tests: trainwatchd, Debian's Prometheus and
// Alertmanager, and any other child. Each listens on 127.0.0.1 on a free port
// and is stopped (its whole process group) when its object is destroyed, so a
// failing REQUIRE leaves nothing running.

#ifndef TRAINWATCH_TESTS_INTEGRATION_STACK_H_
#define TRAINWATCH_TESTS_INTEGRATION_STACK_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "test_util.h"
#include "trainwatch/core/json.h"

namespace trainwatch::testing {

// A child process in its own process group, its output to `log`. On
// destruction the group gets SIGTERM (SIGKILL after 10 s) if the child still
// runs, and SIGKILL in any case, so nothing it started outlives the test.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log,
        const std::map<std::string, std::string>& env = {});
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to `seconds` for the child to exit; its exit code, 128+signal,
  // or -1 if it is still running. The rest of its group is left alone.
  int Wait(int seconds);
  bool running();
  void Stop();
  // SIGKILL to the whole group, no grace: a crash.
  void Kill();

 private:
  pid_t pid_ = -1;
  pid_t pgid_ = -1;
  int status_ = -1;
};

// The first column of the first row of `sql` on the database at `db`, read
// on a connection of its own (-1 when no row).
int64_t QueryInt(const std::string& db, const std::string& sql);

// The alerts of `incident` that Alertmanager delivered to `hook` as firing
// (each as the webhook's JSON has it: labels, annotations, ...).
std::vector<core::JsonValue> FiringAlerts(HttpReceiver& hook, const std::string& incident);

// Whether Alertmanager delivered to `hook` (its webhook receiver) the page
// of `incident` as firing.
bool PagedFiring(HttpReceiver& hook, const std::string& incident);

// trainwatchd with its database in `dir` (a restart in the same folder finds
// it again), optional rules and pager config, and any further `flags` (a
// later flag wins: "--listen" fixes the port); the ports it chose are read
// from its first lines of output.
class Trainwatchd {
 public:
  Trainwatchd(const TempDir& dir, const std::string& rules, const std::string& pager,
              const std::vector<std::string>& flags = {});
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string db() const { return db_; }
  std::shared_ptr<grpc::Channel> channel() const {
    return grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  }
  void Kill() { child_->Kill(); }

 private:
  std::string db_;
  int port_ = 0;
  int metrics_port_ = 0;
  std::unique_ptr<Child> child_;
};

// Debian's prometheus-alertmanager routing everything to a webhook. Alone,
// or one of a gossip cluster (Alertmanager's HA): `gossip_port` > 0 is this
// instance's cluster port, `peers` the other instances' (127.0.0.1 each).
// Instances of one cluster need folders of their own.
class Alertmanager {
 public:
  Alertmanager(const TempDir& dir, int webhook_port, int gossip_port = 0,
               const std::vector<int>& peers = {});
  int port() const { return port_; }
  // Writes a trainwatchd --pager_config that pages this Alertmanager;
  // returns its path.
  std::string WritePagerConfig(const TempDir& dir, const std::string& grafana_url) const;
  // The same for every instance of a cluster: a client sends each alert to
  // every instance, and the cluster notifies once (their gossip).
  static std::string WritePagerConfig(const TempDir& dir, const std::string& grafana_url,
                                      const std::vector<const Alertmanager*>& cluster);
  // Members of the cluster this instance sees, itself included (its
  // /api/v2/status); -1 when it does not answer.
  int ClusterSize() const;

 private:
  int port_;
  std::unique_ptr<Child> child_;
};

// Debian's prometheus scraping `metrics_port` every second as job
// "trainwatchd", with `rule_file` loaded.
class Prometheus {
 public:
  Prometheus(const TempDir& dir, int metrics_port, const std::string& rule_file);
  int port() const { return port_; }
  // The body of /api/v1/query for `expr` (URL-encoded here).
  std::string Query(const std::string& expr) const;

 private:
  int port_;
  std::unique_ptr<Child> child_;
};

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_INTEGRATION_STACK_H_
