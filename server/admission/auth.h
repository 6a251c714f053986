// Bearer-token authentication by role, from a file the operator controls:
//
//   {"tokens": [
//     {"name": "trainer-a", "token": "...", "role": "agent", "runs": ["run-a"]},
//     {"name": "ci",        "token": "...", "role": "agent", "runs": ["*"]},  // all runs
//     {"name": "oncall",    "token": "...", "role": "operator"},
//     {"name": "grafana",   "token": "...", "role": "reader"}]}
//
// Agents stream records (scoped to their runs); readers list and watch;
// operators also approve and reject rollbacks. A call without a valid token
// is UNAUTHENTICATED; a valid token on a method its role does not allow is
// PERMISSION_DENIED. Without a tokens file authentication is off (the
// default, loopback-only bind). Tokens are compared in constant time and
// never logged.
//
// An agent's "runs" lists the runs it may report for; ["*"] is every run.
// An empty list is an error (it used to mean every run, the opposite of
// what it reads as). Leaving "runs" out still means every run, as before.
// Server reflection takes any valid token when authentication is on.
//
// Thread-safe after construction (read-only); RunCreationLimit is
// thread-safe.

#ifndef TRAINWATCH_SERVER_AUTH_H_
#define TRAINWATCH_SERVER_AUTH_H_

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "trainwatch/core/file_system.h"

namespace trainwatch::server {

enum class Role { kAgent, kReader, kOperator };

// What a method needs; kAny: any valid token (server reflection).
enum class Access { kAgentStream, kRead, kApprove, kAny };

struct Principal {
  std::string name;  // "anonymous" when authentication is off
  Role role = Role::kOperator;
  bool all_runs = true;           // agents: every run ("runs": ["*"] or no "runs")
  std::vector<std::string> runs;  // agents, when !all_runs: these runs only
  // Position in the tokens file; -1 when authentication is off.
  int token_index = -1;

  // True when an agent principal may report for `run_id`.
  bool MayReport(absl::string_view run_id) const;
};

class Authenticator {
 public:
  // Authentication off: every call is an anonymous operator.
  Authenticator() = default;
  static absl::StatusOr<Authenticator> FromJson(absl::string_view json, absl::string_view source);
  static absl::StatusOr<Authenticator> FromFile(
      const std::string& path, const core::FileSystem& fs = core::LocalFileSystem());

  bool enabled() const { return enabled_; }
  // `authorization` is the metadata value ("Bearer <token>"), empty if absent.
  absl::StatusOr<Principal> Check(absl::string_view authorization, Access access) const;

 private:
  struct Entry {
    Principal principal;
    std::string token;
  };
  bool enabled_ = false;
  std::vector<Entry> entries_;
};

// Bounds the distinct runs one agent token may create, so that a leaked or
// buggy agent token cannot fill the server with runs (--max_runs_per_token,
// default 1,000). Counted per token, in memory, over the server's life: a
// run the token said Hello to first while it did not exist. Without
// authentication there is no token to count for and nothing is bounded.
class RunCreationLimit {
 public:
  explicit RunCreationLimit(int max_runs_per_token) : max_(max_runs_per_token) {}
  // OK when `p` may say Hello for `run_id`: an existing run (`run_exists`,
  // called only when needed), one it created before, or a new one within
  // its quota; RESOURCE_EXHAUSTED naming the flag otherwise.
  absl::Status Admit(const Principal& p, const std::string& run_id,
                     const std::function<bool()>& run_exists);

 private:
  const int max_;
  absl::Mutex mu_;
  std::map<int, std::set<std::string>> created_ ABSL_GUARDED_BY(mu_);  // by token_index
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_AUTH_H_
