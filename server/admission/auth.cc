#include "admission/auth.h"

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server {

namespace {

// Compares without an early exit, so timing does not reveal a prefix.
bool SameToken(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

absl::string_view RoleName(Role r) {
  switch (r) {
    case Role::kAgent: return "agent";
    case Role::kReader: return "reader";
    case Role::kOperator: return "operator";
  }
  return "?";
}

}  // namespace

bool Principal::MayReport(absl::string_view run_id) const {
  if (role != Role::kAgent) return false;
  if (all_runs) return true;
  for (const std::string& r : runs) {
    if (r == run_id) return true;
  }
  return false;
}

absl::StatusOr<Authenticator> Authenticator::FromJson(absl::string_view json,
                                                      absl::string_view source) {
  absl::StatusOr<core::JsonValue> doc = core::ParseJson(json, source);
  if (!doc.ok()) return doc.status();
  const core::JsonValue* tokens = doc->Find("tokens");
  if (doc->type != core::JsonValue::Type::kObject || tokens == nullptr ||
      tokens->type != core::JsonValue::Type::kArray) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected {\"tokens\": [{\"name\", \"token\", \"role\"}, ...]}"));
  }
  Authenticator a;
  a.enabled_ = true;
  for (const core::JsonValue& t : tokens->array) {
    auto where = [&] { return absl::StrFormat("%s:%d:%d: ", source, t.line, t.column); };
    const core::JsonValue* name = t.Find("name");
    const core::JsonValue* token = t.Find("token");
    const core::JsonValue* role = t.Find("role");
    if (t.type != core::JsonValue::Type::kObject || token == nullptr ||
        token->type != core::JsonValue::Type::kString || role == nullptr ||
        role->type != core::JsonValue::Type::kString) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "each token needs a string \"token\" and \"role\""));
    }
    if (token->string.size() < 16) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "a token must be at least 16 characters"));
    }
    Entry e;
    e.token = token->string;
    e.principal.name = name && name->type == core::JsonValue::Type::kString ? name->string
                                                                            : "unnamed";
    if (role->string == "agent") {
      e.principal.role = Role::kAgent;
    } else if (role->string == "reader") {
      e.principal.role = Role::kReader;
    } else if (role->string == "operator") {
      e.principal.role = Role::kOperator;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), "role must be agent, reader or operator, not \"", role->string, "\""));
    }
    e.principal.token_index = static_cast<int>(a.entries_.size());
    if (const core::JsonValue* runs = t.Find("runs")) {
      if (runs->type != core::JsonValue::Type::kArray) {
        return absl::InvalidArgumentError(absl::StrCat(where(), "runs must be a list"));
      }
      if (runs->array.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "runs is empty: list the runs, or write [\"*\"] for every run"));
      }
      for (const core::JsonValue& r : runs->array) {
        if (r.type != core::JsonValue::Type::kString) {
          return absl::InvalidArgumentError(absl::StrCat(where(), "runs must be strings"));
        }
        e.principal.runs.push_back(r.string);
      }
      const bool star = absl::c_linear_search(e.principal.runs, "*");
      if (star && e.principal.runs.size() > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "runs: \"*\" (every run) goes alone"));
      }
      e.principal.all_runs = star;
    }
    for (const Entry& other : a.entries_) {
      if (other.token == e.token) {
        return absl::InvalidArgumentError(absl::StrCat(where(), "the same token twice"));
      }
    }
    a.entries_.push_back(std::move(e));
  }
  return a;
}

absl::StatusOr<Authenticator> Authenticator::FromFile(const std::string& path,
                                                      const core::FileSystem& fs) {
  absl::StatusOr<std::string> text = fs.ReadFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("tokens file: ", text.status().message()));
  }
  return FromJson(*text, path);
}

absl::StatusOr<Principal> Authenticator::Check(absl::string_view authorization,
                                               Access access) const {
  if (!enabled_) {
    Principal p;
    p.name = "anonymous";
    p.role = access == Access::kAgentStream ? Role::kAgent : Role::kOperator;
    return p;
  }
  if (!absl::StartsWithIgnoreCase(authorization, "bearer ")) {
    return absl::UnauthenticatedError(
        "missing bearer token: send metadata 'authorization: Bearer <token>'");
  }
  const absl::string_view token = authorization.substr(7);
  const Entry* found = nullptr;
  for (const Entry& e : entries_) {
    if (SameToken(token, e.token)) found = &e;
  }
  if (found == nullptr) return absl::UnauthenticatedError("unknown bearer token");
  const Role role = found->principal.role;
  const bool allowed = access == Access::kAny           ? true
                       : access == Access::kAgentStream ? role == Role::kAgent
                       : access == Access::kRead      ? role != Role::kAgent
                                                      : role == Role::kOperator;
  if (!allowed) {
    return absl::PermissionDeniedError(absl::StrCat(
        "token '", found->principal.name, "' has role ", RoleName(role), ", which may not ",
        access == Access::kAgentStream ? "stream agent records"
        : access == Access::kRead      ? "read incidents and runs"
                                       : "approve or reject rollbacks"));
  }
  return found->principal;
}

absl::Status RunCreationLimit::Admit(const Principal& p, const std::string& run_id,
                                     const std::function<bool()>& run_exists) {
  if (p.token_index < 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  std::set<std::string>& mine = created_[p.token_index];
  if (mine.count(run_id) > 0) return absl::OkStatus();
  if (static_cast<int>(mine.size()) < max_) {
    if (!run_exists()) mine.insert(run_id);
    return absl::OkStatus();
  }
  if (run_exists()) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("token '", p.name, "' has created ", mine.size(),
                   " runs, the most one agent token may (--max_runs_per_token); run '", run_id,
                   "' would be one more"));
}

}  // namespace trainwatch::server
