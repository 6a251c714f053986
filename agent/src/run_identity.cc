#include "run_identity.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainwatch/wire/run_id.h"

namespace trainwatch::agent::internal {

namespace {

// A variable's value; unset and empty are the same: neither names anything.
std::optional<std::string> Get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// `raw` made into a run id, or an error naming `from` when it cannot be one.
absl::StatusOr<LauncherRunId> Derive(std::string raw, const std::string& from) {
  LauncherRunId r;
  r.id = std::move(raw);
  if (r.id.size() > wire::kMaxRunIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the run id from ", from, " is ", r.id.size(),
                                                   " bytes long, over the ", wire::kMaxRunIdBytes,
                                                   " a run id may have: set TRAINWATCH_RUN_ID"));
  }
  int replaced = 0;
  for (char& c : r.id) {
    if (!wire::IsRunIdChar(c)) {
      c = '_';
      ++replaced;
    }
  }
  r.note = absl::StrCat("trainwatch agent: run id \"", r.id, "\" from ", from);
  if (replaced > 0) {
    absl::StrAppend(&r.note, " (", replaced, " byte(s) outside [A-Za-z0-9._:-] replaced by '_')");
  }
  absl::StrAppend(&r.note, "; set TRAINWATCH_RUN_ID to name the run yourself");
  return r;
}

}  // namespace

absl::StatusOr<std::optional<LauncherRunId>> RunIdFromLauncher(const EnvLookup& env) {
  if (std::optional<std::string> v = Get(env, "TORCHELASTIC_RUN_ID"); v && *v != "none") {
    return Derive(*v, "TORCHELASTIC_RUN_ID (torchrun --rdzv-id)");
  }
  std::optional<std::string> array_job = Get(env, "SLURM_ARRAY_JOB_ID");
  std::optional<std::string> array_task = Get(env, "SLURM_ARRAY_TASK_ID");
  if (array_job && array_task) {
    return Derive(absl::StrCat("slurm-", *array_job, "_", *array_task),
                  "SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID");
  }
  if (std::optional<std::string> v = Get(env, "SLURM_JOB_ID")) {
    return Derive(absl::StrCat("slurm-", *v), "SLURM_JOB_ID");
  }
  return std::nullopt;
}

std::string NoRunIdMessage(const std::string& server_address) {
  return absl::StrCat(
      "trainwatch agent: not streaming to ", server_address,
      ": no run id. Pass one (run_id) or set TRAINWATCH_RUN_ID; torchrun's --rdzv-id "
      "(TORCHELASTIC_RUN_ID) or SLURM's SLURM_JOB_ID also name the run. Local verdicts "
      "(skip, halt) keep working.");
}

}  // namespace trainwatch::agent::internal
