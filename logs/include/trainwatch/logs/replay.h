// `twctl replay`: a past run's metrics through the same rule engine that runs
// in the agent and the server, for backtesting thresholds.

#ifndef TRAINWATCH_LOGS_REPLAY_H_
#define TRAINWATCH_LOGS_REPLAY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainwatch/logs/metrics_file.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/event.h"

namespace trainwatch::logs {

// One life of the job in the log: the first start, then one per restart.
// A log whose steps go back is a job restarted from a checkpoint that kept
// writing to the same file: as trainwatchd does after a resume, the restart
// opens a new attempt that resumes after S = its first step - 1, whose
// history is the records up to S of the attempts before it; the abandoned
// tail (the earlier attempt's steps after S) stays that attempt's.
struct ReplayAttempt {
  int64_t resumed_from = -1;  // S; -1 for the first attempt (and a restart at step 0)
  int64_t first_step = -1;
  int64_t last_step = -1;
  int64_t records = 0;
  int64_t skipped_steps = 0;
  int64_t halted_at = -1;
  // Its events: ReplayResult::events[first_event, first_event + events).
  size_t first_event = 0;
  size_t events = 0;
};

struct ReplayResult {
  std::vector<core::Event> events;
  std::vector<ReplayAttempt> attempts;  // in log order; one for a log that never goes back
  int64_t records = 0;        // every record of every attempt
  int64_t skipped_steps = 0;  // steps whose verdict was skip_update
  int64_t halted_at = -1;     // first step whose verdict was halt
};

// How replay and follow read a log, from their flags: --format (a name
// ParseFormatName knows), --map, --pattern (nullopt: not given; with it the
// format must be auto) and --logging-steps (empty: not given). A bad value
// is InvalidArgument naming the flag.
absl::StatusOr<ReadOptions> ReadOptionsFromFlags(absl::string_view format,
                                                 absl::string_view map,
                                                 const std::optional<std::string>& pattern,
                                                 absl::string_view logging_steps);

// The rules replay and follow judge a log by: the defaults, or the JSON
// object of RuleConfig fields in the file `config_path`, with `vocab` (when
// not empty) as its vocab_size. An unreadable file is NotFound; a bad file
// or vocab is InvalidArgument (a usage error); both say which.
absl::StatusOr<core::RuleConfig> RulesFromFlags(const std::string& config_path,
                                                absl::string_view vocab);

// Feeds every record of `trace` to the engine, in log order. A step not
// after the one before opens an attempt: the engine is rebuilt
// (core::EngineRebuilder) from the current history up to S, so an abandoned
// tail never reaches the new attempt's windows. Fails only if the engine
// rejects a record.
absl::StatusOr<ReplayResult> Replay(const Trace& trace, const core::RuleConfig& config);

// One event per line. JSON: one object per line with the keys step, tier,
// action, kind, episode, onset_step, shards (ids), shard_names, shards_truncated,
// recommended_checkpoint_step (null when none), recommended_checkpoint_uri,
// recommended_actions (objects with kind, text and their parameters), reason,
// lacked_signals, attempt (the index into result.attempts). Table: aligned
// columns for a terminal; with more than one attempt, each attempt's events
// under a line naming it.
std::string FormatEventsJson(const ReplayResult& result);
std::string FormatEventsTable(const ReplayResult& result);

// Per tier: incidents (episodes), first and last event step, and the steps
// skipped; one line each, for comparing configurations side by side. Then
// the attempts: JSON, always, one line each with the keys attempt,
// resumed_from (null for the first), first_step, last_step, records, events,
// skipped_steps, halted_at (null when none); the table, when there is more
// than one.
std::string FormatSummaryTable(const ReplayResult& result);
std::string FormatSummaryJson(const ReplayResult& result);

// The whole `twctl replay` command: argv after "replay". Writes the answer to
// `out` and diagnostics to `err`; returns the process exit code (0 ok,
// 1 error, 2 usage or bad input).
int ReplayCommand(const std::vector<std::string>& args, std::string* out, std::string* err);

}  // namespace trainwatch::logs

#endif  // TRAINWATCH_LOGS_REPLAY_H_
