// The tiered rule engine: the same code decides in the agent (tier 1 skip,
// tier 3 halt, before optimizer.step()), in the server (every tier, the
// system of record) and in `twctl replay` (offline). It is pure: no I/O, no
// clock, no randomness; its output is a function of the records fed to it,
// which is what makes every rank reach the same verdict and lets a server
// rebuild a run's state by feeding the stored records again.
//
// One RuleEngine holds the state of one run. It is not thread-safe.

#ifndef TRAINWATCH_CORE_RULE_ENGINE_H_
#define TRAINWATCH_CORE_RULE_ENGINE_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/event.h"
#include "trainwatch/core/step_record.h"

namespace trainwatch::core {

// The run's state and the rules over it (core/src/engine_state.h).
struct EngineState;

struct Verdict {
  Decision decision = Decision::kContinue;
  int tier = 0;
  // The rule behind a skip or a halt; meaningless for kContinue.
  EventKind rule = EventKind::kDataAnomaly;
};

// The result of one step. Reused across calls so that the steady state does
// not allocate: Judge() clears it first.
struct StepOutcome {
  Verdict verdict;
  // The derived health metric (loss / EMA of the previous steps), NaN when
  // the loss or the EMA is unknown.
  double loss_ema_ratio = 0.0;
  double loss_ema = 0.0;
  double grad_norm_median = 0.0;
  bool warming_up = true;
  std::vector<Event> events;
};

// Where a run stands in its warm-up (config.h): the baseline rules decide
// once the run is warmup_steps past its first record and the EMA and the
// grad-norm median hold enough records.
struct WarmUpState {
  bool active = true;          // the next step is still in warm-up
  int64_t until_step = -1;     // first step + warmup_steps; -1 before the first
  int64_t loss_records = 0;    // in the EMA
  int64_t grad_samples = 0;    // in the median (0 for a run without grad_norm)
  bool needs_grad = false;     // the run reports grad_norm: its samples count
};

class RuleEngine {
 public:
  // REQUIRES: Validate(config).ok().
  explicit RuleEngine(const RuleConfig& config);
  ~RuleEngine();
  RuleEngine(const RuleEngine&) = delete;
  RuleEngine& operator=(const RuleEngine&) = delete;

  // Evaluates one step and updates the run's state. Steps must increase
  // strictly; anything else is InvalidArgument and leaves the state as it
  // was. `out` is cleared and filled.
  absl::Status Judge(const StepRecord& record, StepOutcome* out);

  // Records a checkpoint the trainer saved at `step`, for recommendations
  // (the last `checkpoints_retained` are kept). For notices that arrive
  // apart from the step records; a record's checkpoint_uri does the same.
  void NoteCheckpoint(int64_t step, absl::string_view uri);

  const RuleConfig& config() const;
  // Last step observed, -1 before the first.
  int64_t last_step() const;
  // The run's first step (its warm-up counts from it), -1 before it.
  int64_t first_step() const;
  // The warm-up as the next step will find it.
  WarmUpState WarmUp() const;
  // Bytes held by this run's state (windows, rings, episode state).
  size_t MemoryBytes() const;

  // The whole state (windows, EMAs, the medians' samples, spike, episode
  // and transient state, shard and checkpoint history) as a versioned blob
  // that names the rules it was built under (RuleConfigToJson) and carries
  // a checksum (core/src/engine_state_codec.cc). An engine restored from it
  // decides on later records exactly as this one would: a server snapshot
  // of a run replaces replaying its history. Doubles keep their bits (NaN
  // included); integers are little-endian on every host.
  std::string SaveState() const;
  // The engine a SaveState() blob describes. InvalidArgument naming what is
  // wrong when the blob is damaged (bad magic, checksum, truncation, a
  // window whose shape does not match `config`); FailedPrecondition when it
  // is another format version or was built under other rules than
  // `config`. Never a partly restored engine.
  static absl::StatusOr<std::unique_ptr<RuleEngine>> FromState(const RuleConfig& config,
                                                               absl::string_view blob);

 private:
  std::unique_ptr<EngineState> s_;
};

// History replayed into a fresh engine, as after a restart, a resume or a
// rollback: every record and checkpoint at or before `up_to`, records in
// step order. The engine is deterministic, so the same history gives the
// same windows and episodes, on every rank and after every restart. The
// events of the replay are discarded: they were acted on the first time.
// Checkpoints may come before, between or after the records.
class EngineRebuilder {
 public:
  explicit EngineRebuilder(const RuleConfig& config,
                           int64_t up_to = std::numeric_limits<int64_t>::max())
      : engine_(std::make_unique<RuleEngine>(config)), up_to_(up_to) {}
  // Continues from an engine that already lived the history up to its
  // last_step() (one restored from a snapshot): only later records are fed.
  explicit EngineRebuilder(std::unique_ptr<RuleEngine> engine,
                           int64_t up_to = std::numeric_limits<int64_t>::max())
      : engine_(std::move(engine)), up_to_(up_to) {}

  // True when the engine took the record; false past `up_to` or for a step
  // the engine refuses (not after the last one).
  bool Feed(const StepRecord& record);
  void NoteCheckpoint(int64_t step, absl::string_view uri);
  // Records the engine took.
  int64_t fed() const { return fed_; }
  // The outcome of the last record taken (its loss_ema_ratio, verdict).
  const StepOutcome& last_outcome() const { return scratch_; }

  std::unique_ptr<RuleEngine> Finish() && { return std::move(engine_); }

 private:
  std::unique_ptr<RuleEngine> engine_;
  int64_t up_to_;
  int64_t fed_ = 0;
  StepOutcome scratch_;
};

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_RULE_ENGINE_H_
