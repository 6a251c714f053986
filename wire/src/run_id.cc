#include "trainwatch/wire/run_id.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace trainwatch::wire {

bool IsRunIdChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
         c == '-';
}

absl::Status CheckRunId(absl::string_view run_id) {
  constexpr char kRule[] = "a run id is 1 to 128 characters of [A-Za-z0-9._:-]";
  static_assert(kMaxRunIdBytes == 128, "kRule names the limit");
  if (run_id.empty()) return absl::InvalidArgumentError(absl::StrCat("run_id is empty: ", kRule));
  if (run_id.size() > kMaxRunIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("run_id is ", run_id.size(), " bytes long: ", kRule));
  }
  for (char c : run_id) {
    if (!IsRunIdChar(c)) {
      return absl::InvalidArgumentError(
          absl::StrCat("run_id has the byte 0x",
                       absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2), ": ", kRule));
    }
  }
  return absl::OkStatus();
}

}  // namespace trainwatch::wire
