// `twctl replay`: a past run's metrics through the same rule engine that runs
// in the agent and the server, for backtesting thresholds.

#ifndef TRAINWATCH_CLI_REPLAY_H_
#define TRAINWATCH_CLI_REPLAY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainwatch/cli/metrics_file.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/event.h"

namespace trainwatch::cli {

struct ReplayResult {
  std::vector<core::Event> events;
  int64_t records = 0;
  int64_t skipped_steps = 0;  // steps whose verdict was skip_update
  int64_t halted_at = -1;     // first step whose verdict was halt
};

// Feeds every record of `trace` to a fresh engine. Fails only if the engine
// rejects a record (the reader already guarantees increasing steps).
absl::StatusOr<ReplayResult> Replay(const Trace& trace, const core::RuleConfig& config);

// One event per line. JSON: one object per line with the keys step, tier,
// action, kind, episode, onset_step, shards (ids), shard_names, shards_truncated,
// recommended_checkpoint_step (null when none), recommended_checkpoint_uri,
// recommended_actions (objects with kind, text and their parameters), reason,
// lacked_signals. Table: aligned columns for a terminal.
std::string FormatEventsJson(const std::vector<core::Event>& events);
std::string FormatEventsTable(const std::vector<core::Event>& events);

// Per tier: incidents (episodes), first and last event step, and the steps
// skipped; one line each, for comparing configurations side by side.
std::string FormatSummaryTable(const ReplayResult& result);
std::string FormatSummaryJson(const ReplayResult& result);

// The whole `twctl replay` command: argv after "replay". Writes the answer to
// `out` and diagnostics to `err`; returns the process exit code (0 ok,
// 1 error, 2 usage or bad input).
int ReplayCommand(const std::vector<std::string>& args, std::string* out, std::string* err);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_REPLAY_H_
