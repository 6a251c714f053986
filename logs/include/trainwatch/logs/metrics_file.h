// Reading a run's metrics for `twctl replay`, in the formats trainers
// already write:
//   csv       trainwatch's own CSV: a header naming step, loss, grad_norm,
//             log_z, nan_frac (all five required) and optionally shard (the
//             batch's shards separated by ';': an entry of digits only is a
//             shard id, anything else a shard name such as shard-00500:0, so
//             a name in a CSV cannot hold ';'), checkpoint (a uri on the steps that saved
//             one), lr, z_loss_alpha, activation_max, attention_logit_p99;
//   wandb-csv any CSV export with a header (W&B, TensorBoard): a step column
//             and metric columns, found by name or mapped with --map;
//             absent metric columns are unknown;
//   jsonl     JSON lines with the keys of the CSV; shard is an id, a list
//             of ids and names (a JSON string in a list is a name, whatever
//             its characters) or a string read as the CSV's;
//   llmc      llm.c's main.log: "s:STEP trl:LOSS lr:LR norm:GRADNORM" (the
//             "s:STEP tel:VAL" validation lines are read past);
//   steplog   "step:S/N train_loss:L ..." (modded-nanogpt and its family;
//             val_loss-only lines are read past);
//   megatron  Megatron-LM's "iteration N/ M | ... | lm loss: ... | grad norm:
//             ... | learning rate: ... | number of nan iterations: ... |"; a
//             line with a grad norm and no lm loss is a step whose loss was
//             NaN (Megatron drops the field), so its loss is NaN;
//   nanogpt   nanoGPT's "iter N: loss X, time ...ms, mfu ...%", with or without
//             a "YYYY-MM-DD HH:MM:SS " prefix; "step N: train loss X, val loss
//             Y" eval lines are read past, and "saving checkpoint to DIR" is a
//             checkpoint (uri DIR) at the last eval step;
//   deepspeed DeepSpeed's fp16 loss-scaler lines alone (see below);
//   hf        Hugging Face Trainer's stdout: "{'loss': 1.67, 'grad_norm': ...,
//             'learning_rate': ..., 'epoch': ...}" lines (values as numbers, or
//             as strings in transformers 5), each at the step of the tqdm bar
//             "N/M [" drawn before it, else at k * ReadOptions::logging_steps;
//             eval and summary dicts are read past;
//   hf-state  Hugging Face's trainer_state.json: its log_history entries with
//             a loss (eval and summary entries read past);
//   torchtitan  torchtitan's "step: N  loss: L  grad_norm: G  memory: ..."
//             (ANSI colours and the logger prefix read past; only rank 0's
//             line of a step);
//   composer  MosaicML Composer's ConsoleLogger blocks: "[batch=N/M]:" then
//             "\t Train loss/train/total: L" lines;
//   nemo      NeMo 2's "Training epoch E, iteration I/T | lr: ... | global_step:
//             S | reduced_train_loss: L | ..." lines, and NeMo 1's progress bar
//             ("| N/M [..., reduced_train_loss=L, global_step=S]").
// Lightning's CSVLogger metrics.csv is a wandb-csv (train_loss,
// train_loss_step and grad_2.0_norm_total are among the names found).
//
// DeepSpeed's loss-scaler lines are read inside every text log above, as
// they are interleaved with the trainer's own lines in real logs: "OVERFLOW!
// Rank 0 Skipping step. Attempted loss scale: S, reducing to S'" and "...,
// but hysteresis is H. Reducing hysteresis to H'" are overflow steps at
// scale S (a skipped update: tier 0 until they persist); "step=N,
// skipped=K, lr=[...]" is step N with its learning rate; "Current loss
// scale already at minimum" is a step at scale 0, which the loss_scale_floor
// rule halts on (the scaler has no scale left). DeepSpeed does not print
// the step of an overflow: it is placed at the step after the last one the
// log named (a trainer's line, step=N, or the overflow before it), and a
// trainer's record at that step carries it.
//   tensorboard  TensorBoard event files (tensorboard.h), one or a folder.
//
// Reading is all or nothing: malformed input (a garbage number, a step
// repeated on the next record) is an error naming the file, line and column,
// and no record is returned, so a replay never prints a partial answer. Steps
// that go back are kept in file order: a job restarted from a checkpoint
// that logged into the same file, which Replay() reads as a new attempt. A metric the run
// never reports (no column, an empty cell, a JSON null, a log line without
// it) is "unknown" for the whole run, not zero: the rules that need it stay
// silent and events list it under lacked_signals. A nan or inf the log
// writes is a report, as it is from the agent: a signal (tier 3), even when
// the metric was never finite before.

#ifndef TRAINWATCH_LOGS_METRICS_FILE_H_
#define TRAINWATCH_LOGS_METRICS_FILE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/core/large_allocator.h"
#include "trainwatch/core/step_record.h"

namespace trainwatch::logs {

class LinePattern;

enum class MetricsFormat {
  kAuto,
  kCsv,
  kGenericCsv,
  kJsonLines,
  kLlmc,
  kStepLog,
  kMegatron,
  kTensorBoard,
  kNanoGpt,
  kDeepSpeed,
  kHfTrainer,
  kHfTrainerState,
  kTorchTitan,
  kComposer,
  kNemo,
  kPattern,  // the user's own (ReadOptions::pattern, --pattern: line_pattern.h)
};

// "auto", "csv", "wandb-csv", "jsonl", "llmc", "steplog", "megatron",
// "tensorboard", "nanogpt", "deepspeed", "hf", "hf-state", "torchtitan",
// "composer", "nemo", "pattern" (not a --format value: --pattern gives it).
absl::string_view FormatName(MetricsFormat f);
bool ParseFormatName(absl::string_view name, MetricsFormat* out);

// Which source column feeds which signal, for CSV exports whose names differ
// from ours: {kLoss, "train/loss"}. Names match case-insensitively.
using ColumnMap = std::vector<std::pair<core::Signal, std::string>>;

// Parses "loss=train/loss,grad_norm=train/grad_norm".
absl::StatusOr<ColumnMap> ParseColumnMap(absl::string_view spec);

struct ReadOptions {
  MetricsFormat format = MetricsFormat::kAuto;
  ColumnMap column_map;
  // The run's logging interval, for a Hugging Face Trainer log without
  // progress bars (kHfTrainer): its k-th loss line is step k * logging_steps.
  // 0: unknown (the bars must say).
  int64_t logging_steps = 0;
  // With kPattern: the user's line format.
  std::shared_ptr<const LinePattern> pattern;
};

// A parsed file. Records are views into its storage: keep the Trace alive
// while they are used.
class Trace {
 public:
  // Every row's shard ids, one after another (on huge pages, as the rows).
  using ShardIds = std::vector<uint64_t, core::LargeAllocator<uint64_t>>;

  size_t size() const { return rows_.size(); }
  // The i-th record, ready for RuleEngine::Judge().
  core::StepRecord Record(size_t i) const;
  // Source line of the i-th record, for messages.
  int line(size_t i) const { return rows_[i].line; }
  // Signals present in at least one row (nan and inf included).
  uint32_t reported() const { return reported_; }
  // The format the content was read as (never kAuto).
  MetricsFormat format() const { return format_; }
  // What the reader read past but a user should hear about (a torn final
  // record in an event file), one message each.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  friend class TraceBuilder;
  struct Row {
    int64_t step;
    std::array<double, core::kNumSignals> values;
    uint32_t present;
    uint32_t shard_begin;
    uint32_t shard_count;
    uint32_t name_begin;
    uint32_t name_count;
    int32_t checkpoint;  // index into checkpoints_, -1 when none
    int line;
    double loss_scale;      // when loss_scale_set
    bool loss_scale_set;    // core::StepValues::SetLossScale
    bool loss_scale_overflow;
  };
  // A row per record: 50 MB for 500k steps, on huge pages.
  std::vector<Row, core::LargeAllocator<Row>> rows_;
  ShardIds shards_;
  std::vector<std::string> shard_names_;
  std::vector<std::string> checkpoints_;
  std::vector<std::string> warnings_;
  uint32_t reported_ = 0;
  MetricsFormat format_ = MetricsFormat::kCsv;
};

// Parses `content`; `source` names it in errors. With kAuto the format is
// detected from the content.
absl::StatusOr<Trace> ParseMetrics(absl::string_view content, absl::string_view source,
                                   const ReadOptions& options = ReadOptions());

// Reads and parses a file; a folder is read as TensorBoard event files, as is
// a file named events.out.tfevents.* when the format is kAuto, except with
// kHfTrainerState: a Trainer's output folder, read through its newest
// trainer_state.json (its own or a checkpoint-N/'s).
absl::StatusOr<Trace> ReadMetricsFile(const std::string& path,
                                      const ReadOptions& options = ReadOptions());

}  // namespace trainwatch::logs

#endif  // TRAINWATCH_LOGS_METRICS_FILE_H_
