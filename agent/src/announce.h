// The lines the agent writes into the trainer's own output (rank 0's
// stderr): what a person watching the job should see without opening a
// dashboard. Rare by design, off the common path: the warm-up at the first
// step and at its end, and each skip, warm-up record and page as it happens.

#ifndef TRAINWATCH_AGENT_SRC_ANNOUNCE_H_
#define TRAINWATCH_AGENT_SRC_ANNOUNCE_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/rule_engine.h"

namespace trainwatch::agent::internal {

// At the run's first step, and when the rules change: the rules in force
// (`source` says whose), and the warm-up: the step it lasts until and what is
// off until then, or (`warming_up` false: a resumed run, warmup_steps 0) that
// it is over.
std::string WarmUpLine(const core::RuleConfig& rules, absl::string_view source,
                       int64_t first_step, bool warming_up);
// At the first step out of warm-up.
std::string WarmUpOverLine(int64_t step);
// What this step's outcome says a person should see, one line each ("" when
// nothing): the skip with its rule's reason, a bad batch recorded in
// warm-up, a page. `observed`: the job only recommends (twctl follow,
// --observe-only).
std::string OutcomeLines(int64_t step, const core::StepOutcome& outcome, bool observed);

}  // namespace trainwatch::agent::internal

#endif  // TRAINWATCH_AGENT_SRC_ANNOUNCE_H_
