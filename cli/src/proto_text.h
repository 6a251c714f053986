// The v1 API's values as twctl's text shows them, shared by the tables and
// the report page.

#ifndef TRAINWATCH_CLI_SRC_PROTO_TEXT_H_
#define TRAINWATCH_CLI_SRC_PROTO_TEXT_H_

#include <cstdint>
#include <string>

#include "trainwatch/v1/common.pb.h"
#include "trainwatch/v1/operator.pb.h"

namespace trainwatch::cli {

// 1, 2 or 3; 0 for anything else (early warnings).
int TierNumber(trainwatch::v1::Tier tier);
// "awaiting_decision", "resolved", ...
std::string StateName(trainwatch::v1::IncidentState state);
// How an attempt began and what it holds: "first launch, steps 0..99",
// "resume by incarnation 3f2a... after step 49, steps 0..149", "rollback of
// I-4 to step 1200, steps 0..1300".
std::string AttemptText(const trainwatch::v1::AttemptInfo& a);
// What twctl says of a followed run (`twctl follow`; RunInfo.observed,
// Incident.observed): its records are observed, not enforced.
inline constexpr char kObservedText[] = "observed, not enforced";
// An incident's title, with " [observed, not enforced]" for a followed run's.
std::string IncidentTitle(const trainwatch::v1::Incident& incident);
// "2026-11-30 07:41:09Z"; empty for 0 (unset).
std::string UtcTime(int64_t unix_seconds);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_PROTO_TEXT_H_
