// The v1 API's values as twctl's text shows them, shared by the tables and
// the report page.

#ifndef TRAINWATCH_CLI_SRC_PROTO_TEXT_H_
#define TRAINWATCH_CLI_SRC_PROTO_TEXT_H_

#include <cstdint>
#include <string>

#include "trainwatch/v1/common.pb.h"

namespace trainwatch::cli {

// 1, 2 or 3; 0 for anything else (early warnings).
int TierNumber(trainwatch::v1::Tier tier);
// "awaiting_decision", "resolved", ...
std::string StateName(trainwatch::v1::IncidentState state);
// "2026-11-30 07:41:09Z"; empty for 0 (unset).
std::string UtcTime(int64_t unix_seconds);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_PROTO_TEXT_H_
