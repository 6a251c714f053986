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

absl::StatusOr<int64_t> ReadWrittenBytes(const std::string& io_path) {
  std::ifstream in(io_path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", io_path));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "wchar:")) continue;
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &bytes) || bytes < 0) {
      return absl::DataLossError(absl::StrCat("unexpected wchar line in ", io_path, ": ", line));
    }
    return bytes;
  }
  return absl::NotFoundError(absl::StrCat("no wchar in ", io_path));
}

absl::StatusOr<int64_t> ReadWrittenBytesOf(pid_t pid) {
  return ReadWrittenBytes(absl::StrCat("/proc/", pid, "/io"));
}

}  // namespace trainwatch::bench
