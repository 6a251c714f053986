// Private to cli/: what `twctl follow` does with what it parsed.
//
// FollowStream sends a followed job's records to trainwatchd through the
// agent library (agent.h): the agent's stream, durable acks, reconnects and
// spill, as rank 0 of world_size 1, with AgentConfig::observed set so that
// the server keeps the run as observed, not enforced. A step at or below
// the last one sent is a restart of the job: the current agent is closed
// (its records acknowledged, up to the drain timeout) and a new one, a new
// incarnation, starts with resume_step = that step - 1, which opens a new
// attempt on the server as a restarted agent would.
//
// CheckpointMatcher finds the checkpoints a log announces: Megatron-LM's
// "saving checkpoint at iteration N [to PATH]", and a --checkpoint-pattern.

#ifndef TRAINWATCH_CLI_SRC_FOLLOW_STREAM_H_
#define TRAINWATCH_CLI_SRC_FOLLOW_STREAM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/core/step_record.h"
#include "trainwatch/logs/line_pattern.h"

namespace trainwatch::cli {

struct FollowCounts {
  int64_t sent = 0;   // records handed to an agent
  int64_t acked = 0;  // durable at the server
  int64_t spilled = 0;
  int64_t dropped = 0;    // lost (counted by the agent)
  int64_t in_flight = 0;  // sent, neither acknowledged nor dropped
  int64_t attempts = 0;   // agents started: 1 + the restarts seen
  int64_t checkpoints = 0;
  bool connected = false;
};

class FollowStream {
 public:
  // `base`: connection, run id, spill; observed, world and windows are set
  // here. `drain_timeout_ms` bounds each wait for acks (at a restart and at
  // Close).
  // `stop_requested`: true once the follow is to end (a signal): Send()
  // then waits for the window no more.
  // `window`: records sent and unacknowledged before Send() waits; each
  // agent's memory_records and ring_records are set to window + kWindowCheck.
  static constexpr int64_t kWindowCheck = 256;
  FollowStream(agent::AgentConfig base, int64_t window, int drain_timeout_ms,
               std::function<bool()> stop_requested)
      : base_(std::move(base)),
        window_(window),
        drain_timeout_ms_(drain_timeout_ms),
        stop_requested_(std::move(stop_requested)) {}
  ~FollowStream();

  // Starts the first agent; errors (a bad run id, a TLS file) are the
  // configuration's.
  absl::Status Start();
  // Sends one record; a step not above the last opens a new attempt first.
  // Waits while `window` records are unacknowledged (the source
  // is read no faster than the server takes it, so nothing is dropped),
  // unless a stop is requested.
  absl::Status Send(const core::StepRecord& record);
  // Called every few milliseconds while Send() waits for the window (the
  // follower's status line keeps coming while the server is away).
  void SetWhilePaused(std::function<void()> f) { while_paused_ = std::move(f); }
  void Checkpoint(int64_t step, const std::string& uri);
  // The source's liveness (Agent::SourceCaughtUp, SourceEnded): read to
  // its end for now; its writer gone (true) or back.
  void CaughtUp();
  void SourceEnded(bool ended);
  FollowCounts Counts() const;
  // Waits up to the drain timeout for every record to be acknowledged, then
  // stops. True when none is left unacknowledged.
  bool Close();

 private:
  absl::Status NewAgent(std::optional<int64_t> resume_step);
  void Retire();  // closes the current agent, keeping its counts

  agent::AgentConfig base_;
  const int64_t window_;
  int64_t since_check_ = 0;
  const int drain_timeout_ms_;
  const std::function<bool()> stop_requested_;
  std::function<void()> while_paused_;
  std::unique_ptr<agent::Agent> agent_;
  int64_t last_step_ = -1;
  bool source_ended_ = false;
  FollowCounts retired_;  // of the agents closed at restarts
  int64_t attempts_ = 0, checkpoints_ = 0;
};

class CheckpointMatcher {
 public:
  // `pattern`: an RE2 regex with one capture group for the step and
  // optionally a group named path, written (?<path>...) or (?P<path>...);
  // empty: none. `megatron`: also Megatron-LM's own line.
  static absl::StatusOr<CheckpointMatcher> Create(const std::string& pattern, bool megatron);
  // True when `line` announces a checkpoint: its step, and its uri (the
  // path group; else Megatron's "to PATH" or iter_NNNNNNN; else the matched
  // text).
  bool Match(absl::string_view line, int64_t* step, std::string* uri) const;

 private:
  bool megatron_ = false;
  std::shared_ptr<const logs::NamedRegex> regex_;
  int step_group_ = 0, path_group_ = 0;
};

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_FOLLOW_STREAM_H_
