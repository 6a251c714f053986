#include "trainwatch/agent/server_addresses.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainwatch::agent {

namespace {

// gRPC's own schemes whose address follows the colon without a slash
// ("unix:relative/path", "ipv4:127.0.0.1:7070"); told apart from host:port,
// which has the same shape.
constexpr absl::string_view kSchemes[] = {"unix:", "unix-abstract:", "ipv4:", "ipv6:",
                                          "vsock:", "dns:"};

// "scheme:/..." (RFC 3986 scheme characters, then a slash): a URI for some
// resolver gRPC may have, never a host:port.
bool IsUri(absl::string_view entry) {
  const size_t colon = entry.find(':');
  if (colon == 0 || colon == absl::string_view::npos || colon + 1 >= entry.size() ||
      entry[colon + 1] != '/' || !absl::ascii_isalpha(entry[0])) {
    return false;
  }
  for (char c : entry.substr(0, colon)) {
    if (!absl::ascii_isalnum(c) && c != '+' && c != '-' && c != '.') return false;
  }
  return true;
}

bool IsHostChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_'; }

// Empty when `entry` is one gRPC target; else what is wrong with it.
std::string Malformation(absl::string_view entry) {
  for (char c : entry) {
    if (absl::ascii_isspace(c) || absl::ascii_iscntrl(c)) return "it has a blank inside";
  }
  for (absl::string_view scheme : kSchemes) {
    if (absl::StartsWith(entry, scheme)) {
      return entry.size() > scheme.size() ? "" : absl::StrCat("nothing follows ", scheme);
    }
  }
  if (IsUri(entry)) return "";
  absl::string_view host = entry, port;
  if (absl::StartsWith(entry, "[")) {
    const size_t close = entry.find(']');
    if (close == absl::string_view::npos) return "its '[' is not closed";
    host = entry.substr(1, close - 1);
    const absl::string_view rest = entry.substr(close + 1);
    if (!rest.empty() && !absl::StartsWith(rest, ":")) return "something other than :port follows ']'";
    if (!rest.empty()) port = rest.substr(1);
    if (host.empty()) return "the host between [ ] is empty";
    if (!rest.empty() && port.empty()) return "the port after ':' is empty";
  } else {
    const size_t colon = entry.find(':');
    if (colon != absl::string_view::npos) {
      host = entry.substr(0, colon);
      port = entry.substr(colon + 1);
      if (absl::StrContains(port, ':')) {
        return "it has several ':' (an IPv6 address goes in brackets: [::1]:7070)";
      }
      if (port.empty()) return "the port after ':' is empty";
    }
    if (host.empty()) return "the host is empty";
    for (char c : host) {
      if (!IsHostChar(c)) return absl::StrCat("'", std::string(1, c), "' cannot be in a host name");
    }
  }
  if (!port.empty()) {
    uint32_t n = 0;
    if (!absl::SimpleAtoi(port, &n) || n == 0 || n > 65535 || !absl::ascii_isdigit(port[0])) {
      return absl::StrCat("the port '", port, "' is not a number in 1..65535");
    }
  }
  return "";
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseServerAddresses(absl::string_view list) {
  const std::string quoted = absl::StrCat("server address list \"", list, "\"");
  if (absl::StripAsciiWhitespace(list).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(quoted, " is empty"));
  }
  std::vector<std::string> out;
  int position = 0;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    ++position;
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          quoted, ": entry ", position,
          " is empty (addresses are separated by single commas, host:port,host:port)"));
    }
    const std::string wrong = Malformation(entry);
    if (!wrong.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          quoted, ": entry ", position, " (\"", entry, "\") is malformed: ", wrong,
          "; expected host:port, [v6-address]:port or a gRPC URI such as unix:/path"));
    }
    out.emplace_back(entry);
  }
  return out;
}

}  // namespace trainwatch::agent
