// CheckServerOptions: every trainwatchd option's range and form, checked
// before anything starts, with messages that name the flag, so that a typo
// stops the server instead of starting it somewhere unexpected (a port
// taken modulo 65536, a temporary database that a restart forgets).

#include <sys/stat.h>

#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/server.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server {

namespace {

bool AllOf(absl::string_view s, bool (*ok)(char)) {
  for (char c : s) {
    if (!ok(c)) return false;
  }
  return true;
}

bool HostNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.';
}
bool Ipv6Char(char c) {
  return absl::ascii_isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
}

}  // namespace

absl::StatusOr<std::vector<RunRules>> ParseRunRulesJson(absl::string_view json,
                                                         absl::string_view source) {
  using core::JsonValue;
  absl::StatusOr<JsonValue> doc = core::ParseJson(json, source);
  if (!doc.ok()) return doc.status();
  if (doc->type != JsonValue::Type::kObject) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": --run_rules must be a JSON object of {\"run-id pattern\": {rules}}"));
  }
  std::vector<RunRules> out;
  for (const auto& [pattern, value] : doc->object) {
    const std::string where = absl::StrCat(source, ":", value.line, ":", value.column,
                                           ": pattern \"", pattern, "\"");
    if (pattern.empty()) return absl::InvalidArgumentError(absl::StrCat(where, " is empty"));
    if (value.type != JsonValue::Type::kObject) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": its rules must be a JSON object of RuleConfig fields"));
    }
    // The rules' own text for their parser, which names what is wrong: the
    // fields are numbers (as written) and booleans; anything else is its
    // error too, said here with the position.
    std::string text = "{";
    for (const auto& [key, v] : value.object) {
      if (v.type != JsonValue::Type::kNumber && v.type != JsonValue::Type::kBool) {
        if (v.type == JsonValue::Type::kObject) continue;  // "bounds", as printed
        return absl::InvalidArgumentError(absl::StrCat(source, ":", v.line, ":", v.column, ": ",
                                                       key, " must be a number or a boolean"));
      }
      if (text.size() > 1) text += ",";
      core::AppendJsonString(&text, key);
      absl::StrAppend(&text, ":", v.type == JsonValue::Type::kNumber ? v.string
                                  : v.boolean                        ? "true"
                                                                     : "false");
    }
    text += "}";
    absl::StatusOr<core::RuleConfig> rules = core::ParseRuleConfigJson(text, where);
    if (!rules.ok()) return rules.status();
    out.push_back({pattern, *std::move(rules)});
  }
  return out;
}

absl::Status CheckFlagRange(absl::string_view flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, " must be in [", lo, ", ", hi, "], not ", value));
}

absl::Status CheckListenAddress(const std::string& address, bool allow_unix) {
  if (allow_unix && (absl::StartsWith(address, "unix:") ||
                     absl::StartsWith(address, "unix-abstract:"))) {
    if (address.substr(address.find(':') + 1).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("'", address, "' names no socket"));
    }
    return absl::OkStatus();
  }
  const std::string form = allow_unix ? "host:port or unix:PATH" : "host:port";
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' has no port: expected ", form));
  }
  const absl::string_view host = absl::string_view(address).substr(0, colon);
  const absl::string_view port_text = absl::string_view(address).substr(colon + 1);
  int port = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      !AllOf(port_text, [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); }) ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", address, "': the port must be a number in [0, 65535] (0: pick a free one)"));
  }
  const bool bracketed = host.size() > 2 && host.front() == '[' && host.back() == ']' &&
                         AllOf(host.substr(1, host.size() - 2), Ipv6Char);
  const bool named = !host.empty() && host.front() != '-' && host.front() != '.' &&
                     AllOf(host, HostNameChar);
  if (!bracketed && !named) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", address, "': the host must be an IPv4 address, [IPv6 address] or host name; ",
        "expected ", form));
  }
  return absl::OkStatus();
}

absl::Status CheckServerOptions(const ServerOptions& o) {
  if (absl::Status s = CheckListenAddress(o.listen, /*allow_unix=*/true); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--listen ", s.message()));
  }
  if (!o.metrics_listen.empty()) {
    if (absl::Status s = CheckListenAddress(o.metrics_listen, /*allow_unix=*/false); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_listen ", s.message(), " (empty: no metrics)"));
    }
  }
  // A PostgreSQL conninfo is checked by libpq when the store connects; the
  // checks below are of a SQLite file's name.
  const bool postgres = Store::IsPostgres(o.db_path);
  if (postgres && o.store.max_bytes != 0) {
    return absl::InvalidArgumentError(
        "--db_max_bytes is a quota on a SQLite file: with PostgreSQL, set quotas on its server");
  }
  if (postgres && o.store.synchronous != StoreOptions::Synchronous::kFull) {
    return absl::InvalidArgumentError(
        "--db_synchronous normal is SQLite's: with PostgreSQL, what a commit waits for is the "
        "server's synchronous_commit");
  }
  // SQLite takes "" and ":memory:" as databases that vanish with the
  // process: every acknowledged record would be lost at a restart.
  if (postgres) {
    // Nothing of a file to check.
  } else if (o.db_path.empty() || o.db_path == ":memory:") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--db must name a database file, not '", o.db_path, "' (a database gone at exit)"));
  }
  if (!o.replica.empty()) {
    if (!postgres) {
      return absl::InvalidArgumentError(
          "--replica needs a PostgreSQL --db that every replica shares (a SQLite file is one "
          "machine's)");
    }
    if (o.replica.size() > 64 ||
        o.replica.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                    "0123456789._-") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--replica '", o.replica, "': 1 to 64 characters of [A-Za-z0-9._-]"));
    }
  }
  if (absl::Status s = CheckFlagRange("lease_ms", o.lease_ms, kMinLeaseMs, kMaxLeaseMs); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFlagRange("shards", o.shards, 1, kMaxShards); !s.ok()) return s;
  if (absl::Status s = CheckFlagRange("standby_refresh_ms", o.standby_refresh_ms,
                                      kMinStandbyRefreshMs, kMaxLeaseMs);
      !s.ok()) {
    return s;
  }
  struct stat st;
  if (!postgres && stat(o.db_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--db ", o.db_path, " is a directory: name a database file"));
  }
  if (absl::Status s =
          CheckFlagRange("max_message_bytes", o.max_message_bytes, kMinMessageBytes, kMaxMessageBytes);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFlagRange("aggregation_timeout_ms", o.ingest.aggregation_timeout_ms, 1,
                             kMaxAggregationTimeoutMs);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFlagRange("max_world_size", o.max_world_size, 1, kMaxWorldSizeLimit);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckFlagRange("max_runs_per_token", o.max_runs_per_token, 1, kMaxRunsPerTokenLimit);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFlagRange("db_max_bytes", o.store.max_bytes, 0,
                                     std::numeric_limits<int64_t>::max());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFlagRange("max_step_jump", o.ingest.max_step_jump, 1,
                                     std::numeric_limits<int64_t>::max());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFlagRange("engine_snapshot_steps", o.ingest.engine_snapshot_steps, 0,
                                     std::numeric_limits<int64_t>::max());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFlagRange("commit_interval_ms", o.ingest.commit_interval_ms, 0, 1000);
      !s.ok()) {
    return s;
  }
  const LivenessOptions& live = o.ingest.liveness;
  for (absl::Status s :
       {CheckFlagRange("stall_floor_seconds", live.stall_floor_ms / 1000, 1, 86'400),
        CheckFlagRange("stall_startup_seconds", live.stall_startup_ms / 1000,
                       live.stall_floor_ms / 1000, 86'400 * 7),
        CheckFlagRange("stall_long_phase_seconds", live.long_phase_ms / 1000, 1, 86'400 * 7),
        CheckFlagRange("straggler_steps", live.straggler_steps, 1,
                       std::numeric_limits<int64_t>::max())}) {
    if (!s.ok()) return s;
  }
  if (!(live.straggler_ratio >= 1.05 && live.straggler_ratio <= 100)) {
    return absl::InvalidArgumentError(absl::StrCat("--straggler_ratio ", live.straggler_ratio,
                                                   " is outside [1.05, 100]"));
  }
  if (!(live.stall_step_multiple >= 2 && live.stall_step_multiple <= 1000)) {
    return absl::InvalidArgumentError(absl::StrCat("--stall_step_multiple ",
                                                   live.stall_step_multiple,
                                                   " is outside [2, 1000]"));
  }
  if (absl::Status s = CheckFlagRange("max_runs_in_memory",
                                     static_cast<int64_t>(o.ingest.max_runs_in_memory), 1,
                                     kMaxRunsLimit);
      !s.ok()) {
    return s;
  }
  // Not flags: the library's callers (tests) set them.
  if (o.keepalive_time_ms <= 0 || o.keepalive_timeout_ms <= 0) {
    return absl::InvalidArgumentError("keepalive_time_ms and keepalive_timeout_ms must be > 0");
  }
  return absl::OkStatus();
}

}  // namespace trainwatch::server
