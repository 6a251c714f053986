#include "proto_text.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "trainwatch/wire/enums.h"

namespace trainwatch::cli {

int TierNumber(trainwatch::v1::Tier tier) {
  // Unspecified and unknown tiers are shown with the early warnings.
  return std::max(0, wire::TierFromProto(tier));
}

std::string AttemptText(const trainwatch::v1::AttemptInfo& a) {
  std::string out;
  switch (a.start()) {
    case trainwatch::v1::ATTEMPT_START_FIRST:
      out = "first launch";
      break;
    case trainwatch::v1::ATTEMPT_START_ROLLBACK:
      out = a.incident_id().empty() ? std::string("rollback")
                                    : absl::StrCat("rollback of ", a.incident_id());
      if (a.from_step() >= 0) absl::StrAppend(&out, " to step ", a.from_step());
      break;
    case trainwatch::v1::ATTEMPT_START_RESUME:
      out = absl::StrCat("resume by incarnation ", a.incarnation_id(), " after step ",
                         a.from_step());
      break;
    default:
      out = "unknown start";
  }
  if (a.first_step() >= 0) {
    absl::StrAppend(&out, ", steps ", a.first_step(), "..", a.last_step());
  } else {
    out += ", no steps yet";
  }
  return out;
}

std::string StateName(trainwatch::v1::IncidentState state) {
  const std::string prefix = "INCIDENT_STATE_";
  std::string n = trainwatch::v1::IncidentState_Name(state);
  if (n.rfind(prefix, 0) == 0) n = n.substr(prefix.size());
  return absl::AsciiStrToLower(n);
}

std::string IncidentTitle(const trainwatch::v1::Incident& incident) {
  if (!incident.observed()) return incident.title();
  return absl::StrCat(incident.title(), " [", kObservedText, "]");
}

std::string UtcTime(int64_t unix_seconds) {
  if (unix_seconds == 0) return "";
  return absl::FormatTime("%Y-%m-%d %H:%M:%SZ", absl::FromUnixSeconds(unix_seconds),
                          absl::UTCTimeZone());
}

}  // namespace trainwatch::cli
