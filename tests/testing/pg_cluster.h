// Real PostgreSQL 15 clusters for tests: a primary and, on request, one
// synchronous standby, made from Debian's postgresql-15 binaries in a fresh
// temporary folder and stopped with everything in it when the object goes,
// also when a test fails half way.
//
// What holds while a PgCluster lives:
//   - Each node listens only on a Unix socket in the cluster's folder (no
//     TCP), on a port number of its own; nothing outside the test reaches it
//     and nothing running on the machine is used.
//   - Run as root (initdb refuses root), every server tool runs as the
//     postgres user through runuser, on a folder owned by that user.
//   - With a standby, the primary's synchronous_standby_names is
//     'ANY 1 (standby1)' and Start() returns only once pg_stat_replication
//     shows the standby as synchronous: a commit that returns is flushed on
//     both. The standby inherits that setting, as a real one would;
//     Promote() clears it on the promoted node, or its commits would wait
//     forever for a standby it does not have.
//   - Every wait has a timeout, and a failure's status carries the node's
//     server log tail.
// Not thread-safe: used from the test's thread.

#ifndef TRAINWATCH_TESTS_TESTING_PG_CLUSTER_H_
#define TRAINWATCH_TESTS_TESTING_PG_CLUSTER_H_

#include <sys/types.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "testing/temp_dir.h"

namespace trainwatch::testing {

class PgCluster {
 public:
  // The nodes by their roles at start (after Promote(kStandby), kStandby is
  // the primary).
  enum class Node { kPrimary = 0, kStandby = 1 };

  // The standby's application_name, as synchronous_standby_names lists it.
  static constexpr char kStandbyName[] = "standby1";

  // initdb and start a primary; with `with_standby`, also a streaming
  // standby that the primary waits for on commit. The binaries are in
  // $TRAINWATCH_PG_BIN, else /usr/lib/postgresql/15/bin.
  static absl::StatusOr<std::unique_ptr<PgCluster>> Start(bool with_standby);
  // Stops every node with `pg_ctl -m immediate stop` (resuming paused
  // ones first) and removes the folder.
  ~PgCluster();
  PgCluster(const PgCluster&) = delete;
  PgCluster& operator=(const PgCluster&) = delete;

  // Keyword conninfo of one node (superuser postgres, database postgres).
  std::string Conninfo(Node node) const;
  // The same as a postgresql:// URI.
  std::string Uri(Node node) const;
  // Both nodes with target_session_attrs=read-write: connects to whichever
  // is the primary. REQUIRES: a standby.
  std::string MultiHostConninfo() const;

  // kill -9 of the node's postmaster, as a crash: its other processes are
  // left to notice and exit (those still alive are killed at destruction).
  // Returns once the postmaster is gone.
  absl::Status Kill(Node node);
  // SIGSTOP of the postmaster and every process it started (a standby's
  // walreceiver among them), as a node that hangs; Resume() sends SIGCONT.
  absl::Status Pause(Node node);
  absl::Status Resume(Node node);
  // pg_ctl promote, then clears synchronous_standby_names on the node, and
  // returns once a commit there no longer waits for a standby.
  absl::Status Promote(Node node);

  // The last `lines` lines of the node's server log.
  std::string LogTail(Node node, int lines = 30) const;

 private:
  struct NodeState {
    std::string name;  // "primary" or kStandbyName
    std::string data;  // its data directory
    std::string log;   // its server log
    int port = 0;
    pid_t postmaster = 0;
    bool running = false;
    std::vector<pid_t> paused;   // what Pause() stopped
    std::vector<pid_t> orphans;  // what Kill() left to exit by itself
  };

  PgCluster();
  NodeState& state(Node node) { return nodes_[static_cast<int>(node)]; }
  const NodeState& state(Node node) const { return nodes_[static_cast<int>(node)]; }
  // Runs a server tool from the bin folder (as postgres when root), in the
  // cluster's folder, killed after `timeout`; an error names `step` and
  // carries the tool's output.
  absl::Status RunTool(const std::vector<std::string>& args, std::chrono::seconds timeout,
                       const std::string& step);
  // pg_ctl start, then reads the postmaster's pid.
  absl::Status StartNode(Node node);
  absl::Status WaitForSyncStandby(std::chrono::seconds timeout);
  // `status` with the node's log tail appended.
  absl::Status WithLog(Node node, const absl::Status& status) const;

  ScopedTempDir dir_;
  std::string bin_;
  bool with_standby_ = false;
  std::array<NodeState, 2> nodes_;
};

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_TESTING_PG_CLUSTER_H_
