// Bearer-token authentication by role, from a file the operator controls:
//
//   {"tokens": [
//     {"name": "trainer-a", "token": "...", "role": "agent", "runs": ["run-a"]},
//     {"name": "ci",        "token": "...", "role": "agent"},          // all runs
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
// Thread-safe after construction (read-only).

#ifndef TRAINWATCH_SERVER_AUTH_H_
#define TRAINWATCH_SERVER_AUTH_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/core/file_system.h"

namespace trainwatch::server {

enum class Role { kAgent, kReader, kOperator };

// What a method needs.
enum class Access { kAgentStream, kRead, kDecide };

struct Principal {
  std::string name;  // "anonymous" when authentication is off
  Role role = Role::kOperator;
  std::vector<std::string> runs;  // empty: every run (agents)

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

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_AUTH_H_
