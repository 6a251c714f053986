#include "proc_status.h"

#include <fstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace trainwatch::bench {

absl::StatusOr<int64_t> ReadPeakRssBytes(const std::string& status_path) {
  std::ifstream in(status_path);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot read ", status_path));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmHWM:")) continue;
    // "VmHWM:\t   12345 kB"
    std::vector<absl::string_view> parts =
        absl::StrSplit(rest, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    int64_t kib = 0;
    if (parts.size() != 2 || parts[1] != "kB" ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[0]), &kib)) {
      return absl::DataLossError(
          absl::StrCat("unexpected VmHWM line in ", status_path, ": ", line));
    }
    return kib * 1024;
  }
  return absl::NotFoundError(absl::StrCat("no VmHWM in ", status_path));
}

absl::StatusOr<int64_t> ReadPeakRssBytesOf(pid_t pid) {
  return ReadPeakRssBytes(absl::StrCat("/proc/", pid, "/status"));
}

}  // namespace trainwatch::bench
