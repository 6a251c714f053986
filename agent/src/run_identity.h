// Private to the agent: which run a job's records belong to when the trainer
// names none. Launchers already name the job, so the agent takes that name
// instead of a shared made-up one ("default" used to make every unnamed job
// the same run, and the second job's records for steps already stored were
// dropped as duplicates).
//
// The order, first found wins:
//   1. TORCHELASTIC_RUN_ID (torchrun's --rdzv-id; torchrun sets it to "none"
//      when none was given, which names nothing);
//   2. SLURM_ARRAY_JOB_ID with SLURM_ARRAY_TASK_ID, as "slurm-<job>_<task>",
//      so the tasks of one array are separate runs;
//   3. SLURM_JOB_ID, as "slurm-<job>".
// The argument and TRAINWATCH_RUN_ID come before all of these (agent.cc).
// A byte outside the run id rule (trainwatch/wire/run_id.h) is replaced by
// '_', and the note says so; an id longer than the rule allows is an error
// naming the variable, since cutting it could merge two jobs.

#ifndef TRAINWATCH_AGENT_SRC_RUN_IDENTITY_H_
#define TRAINWATCH_AGENT_SRC_RUN_IDENTITY_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace trainwatch::agent::internal {

struct LauncherRunId {
  std::string id;
  // One line for stderr: the id, the variables it came from and any bytes
  // replaced.
  std::string note;
};

// Reads a variable; nullptr when unset. Tests pass a map, the agent getenv.
using EnvLookup = std::function<const char*(const char* name)>;

// The run id the launcher's variables give, or nullopt when none names one.
absl::StatusOr<std::optional<LauncherRunId>> RunIdFromLauncher(const EnvLookup& env);

// The one message an agent with a server but no run id prints: what to set.
std::string NoRunIdMessage(const std::string& server_address);

}  // namespace trainwatch::agent::internal

#endif  // TRAINWATCH_AGENT_SRC_RUN_IDENTITY_H_
