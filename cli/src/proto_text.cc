#include "proto_text.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/time/time.h"
#include "trainwatch/wire/enums.h"

namespace trainwatch::cli {

int TierNumber(trainwatch::v1::Tier tier) {
  // Unspecified and unknown tiers are shown with the early warnings.
  return std::max(0, wire::TierFromProto(tier));
}

std::string StateName(trainwatch::v1::IncidentState state) {
  const std::string prefix = "INCIDENT_STATE_";
  std::string n = trainwatch::v1::IncidentState_Name(state);
  if (n.rfind(prefix, 0) == 0) n = n.substr(prefix.size());
  return absl::AsciiStrToLower(n);
}

std::string UtcTime(int64_t unix_seconds) {
  if (unix_seconds == 0) return "";
  return absl::FormatTime("%Y-%m-%d %H:%M:%SZ", absl::FromUnixSeconds(unix_seconds),
                          absl::UTCTimeZone());
}

}  // namespace trainwatch::cli
