// The rule for a run id, in one place for both ends of the wire: trainwatchd
// refuses a message whose id breaks it (server/admission/agent_message_checks.h),
// and the agent checks the id it was given or derived before it streams, so
// that a bad id is an error at start-up instead of a stream refused forever.
//
// A run id is 1 to kMaxRunIdBytes bytes of [A-Za-z0-9._:-]: safe in a file
// name (the agent's spill file), a Prometheus label and a URL path.

#ifndef TRAINWATCH_WIRE_RUN_ID_H_
#define TRAINWATCH_WIRE_RUN_ID_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainwatch::wire {

inline constexpr size_t kMaxRunIdBytes = 128;

// True for a byte a run id may hold.
bool IsRunIdChar(char c);

// OK for a run id that follows the rule above; otherwise INVALID_ARGUMENT
// naming it (and the offending byte in hex: the id may not be printable).
absl::Status CheckRunId(absl::string_view run_id);

}  // namespace trainwatch::wire

#endif  // TRAINWATCH_WIRE_RUN_ID_H_
