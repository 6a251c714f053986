// The pieces every metrics reader (and twctl follow) shares: building a
// Trace row by row with the ordering rules enforced once, and the error and
// number helpers that make every message name file, line and column.

#ifndef TRAINWATCH_LOGS_TRACE_BUILDER_H_
#define TRAINWATCH_LOGS_TRACE_BUILDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/logs/metrics_file.h"

namespace trainwatch::logs {

// "<source>:<line>:<column>: <what>" as InvalidArgument.
absl::Status At(absl::string_view source, int line, int column, absl::string_view what);

// Whole-string number parsers; ParseDouble accepts nan, inf, infinity (any
// case) and a leading '+'.
bool ParseDouble(absl::string_view text, double* out);
bool ParseInt64(absl::string_view text, int64_t* out);
bool ParseUint64(absl::string_view text, uint64_t* out);

// Signal by its file name ("loss", "grad_norm", ...).
bool SignalByName(absl::string_view name, core::Signal* out);
// Signal by the usual names trainers and exporters give it ("train/loss",
// "learning_rate", ...); `lower` is lower case. One table for every keyed
// format.
bool SignalByAlias(absl::string_view lower, core::Signal* out);
// The names SignalByAlias() knows for `s`, its own name first.
std::vector<std::string> AliasesOf(core::Signal s);

class TraceBuilder {
 public:
  using Row = Trace::Row;

  explicit TraceBuilder(absl::string_view source) : source_(source) {}

  // Room for `rows` rows up front (a reader's line count), so that a long
  // log's rows are not copied each time the vector grows: that copying and
  // its page faults were a fifth of a 500k-step replay.
  void Reserve(size_t rows) { trace_.rows_.reserve(rows); }
  Row& NewRow(int line);
  // Refuses a negative step; a step below the last is a restart (see
  // Replay()). A step equal to the last is merged with it (MergeSameStep)
  // when the rows are complete. `column` locates the step in errors.
  absl::Status SetStep(Row& r, int64_t step, int column);
  void SetValue(Row& r, core::Signal s, double v);
  // Shards separated by ';', each an id (digits only) or a name.
  absl::Status AddShards(Row& r, absl::string_view text, int column);
  // One shard of such a list: an id when all digits, else a name.
  absl::Status AddShard(Row& r, absl::string_view text, int column);
  void AddShard(Row& r, uint64_t id);
  // A name as it is (a JSON string in a shard list), whatever its bytes.
  absl::Status AddShardName(Row& r, absl::string_view name, int column);
  void SetCheckpoint(Row& r, absl::string_view uri);
  // The fp16 loss scaler's state at this step (core::StepValues::SetLossScale).
  void SetLossScale(Row& r, double scale, bool overflow);
  // A record another builder built (its values, shards, checkpoint and loss
  // scale), as a new row at `line`; *out is the row, valid until the next
  // NewRow. Fails as SetStep() does.
  absl::Status AddRecord(const core::StepRecord& rec, int line, Row** out);
  void AddWarning(std::string message) { trace_.warnings_.push_back(std::move(message)); }
  // The warnings added since the last call, for a follower to print as they
  // come (Finish() gives a whole file's to its Trace).
  std::vector<std::string> TakeWarnings() { return std::exchange(trace_.warnings_, {}); }
  // Step of the last row, -1 when none.
  int64_t last_step() const { return have_last_ ? last_step_ : -1; }
  size_t rows() const { return trace_.rows_.size(); }

  // Fails on an empty trace. A signal no row holds stays absent (unknown for
  // the run); one a row holds as nan or inf is kept, as follow's Drain()
  // keeps it, so that replay and follow judge a log alike.
  absl::StatusOr<Trace> Finish(MetricsFormat format);

  // For a reader fed as a log grows (twctl follow), in bounded memory: calls
  // fn(record, line) for each row built since the last Drain() (the record
  // valid inside fn only), then forgets them; the step order check goes on
  // across calls. `hold_last`: the last row is kept back, since the next
  // line may be more of its step (an eval line after the train line); the
  // follower drains without it when its source is idle or ends.
  // In a Live() builder, a row at the step of the record drained last that
  // agrees with it is more of that step come too late to join it (the log
  // was quiet between them): it is not drained, and a note names what it
  // held that the record lacks.
  template <typename Fn>
  void Drain(Fn fn, bool hold_last = false) {
    MergeSameStep();
    const size_t n = trace_.rows_.size() - (hold_last && !trace_.rows_.empty() ? 1 : 0);
    for (size_t i = 0; i < n; ++i) {
      if (i == 0 && live_ && LateForDrained(trace_.rows_[0])) continue;
      fn(trace_.Record(i), trace_.line(i));
      drained_row_ = trace_.rows_[i];
      have_drained_row_ = true;
    }
    KeepFrom(n);
    drained_ = {have_last_, last_step_};
  }
  // The builder of a follower, whose drained records are sent: see Drain().
  void Live() { live_ = true; }
  // Forgets the rows built since the last Drain() and their steps: what a
  // follower does with a line its reader refused, so that a partial row is
  // never sent nor blocks the next line's step. A row Drain() held back
  // stays.
  void Drop() {
    Truncate(held_);
    have_last_ = drained_.have_last;
    last_step_ = drained_.last_step;
  }

 private:
  // Rows a logger writes apart at one step (train and eval lines, W&B's
  // rows, a line every rank prints) are one record: each row is merged into
  // the one before when both are at one step and agree on every value they
  // both hold. Rows that disagree stay apart: the second is the job
  // restarted at that step (Replay() opens an attempt there), never a value
  // overwritten.
  void MergeSameStep();
  // Whether `r` is more of the step Drain() gave last (see Drain()); notes
  // what it adds.
  bool LateForDrained(const Row& r);
  // Keeps rows [from, end) alone, at the front, with their shards, names and
  // checkpoint; at most one row is kept (Drain's held row).
  void KeepFrom(size_t from);
  // Keeps the first `rows` rows and what they reference.
  void Truncate(size_t rows);

  absl::string_view source_;
  Trace trace_;
  bool have_last_ = false;
  int64_t last_step_ = 0;
  size_t held_ = 0;  // rows Drain() held back (0 or 1)
  Row drained_row_{};  // the last row Drain() gave (its shards and names are gone)
  bool have_drained_row_ = false;
  bool live_ = false;
  struct {
    bool have_last = false;
    int64_t last_step = 0;
  } drained_;  // the step state at the last Drain(), for Drop()
};

// One text format's reader fed a line at a time: each whole-file reader is
// this loop (ParseLines), and twctl follow feeds it lines as they arrive, so
// a format is parsed by one piece of code. Line() adds the line's record, if
// it is a metric line, to `b`; errors name the line and column.
class LineParser {
 public:
  virtual ~LineParser() = default;
  virtual absl::Status Line(absl::string_view line, int line_no, TraceBuilder& b) = 0;
  // At the end of a whole file: what only all of it can tell (no metric line
  // at all, a CSV without a header, JSON lines that never name a metric).
  virtual absl::Status End(const TraceBuilder& b) = 0;
  // Adds the rows a reader holds back until a later line completes them (a
  // DeepSpeed overflow waiting for the trainer's record of its step). Called
  // at the end of a whole file before End(), and by twctl follow when its
  // source ends or restarts.
  virtual absl::Status Flush(TraceBuilder& b) { return absl::OkStatus(); }
  // Called by twctl follow when its source has nothing new and no partial
  // line: adds a record held only because a later line might still belong
  // to it (Composer's block, printed at once). Unlike Flush(), what waits
  // for another line to say where it belongs (a DeepSpeed overflow) waits on.
  virtual absl::Status Idle(TraceBuilder& b) { return absl::OkStatus(); }
  // The last step the log named, on a line that is a record or not (a
  // progress bar); -1 when none or when the format does not say.
  virtual int64_t Position() const { return -1; }
};

// The reader of `format`, from the list of formats (formats.h): nullptr for
// kAuto and kTensorBoard, which are not line formats; a trainer's log is
// read with DeepSpeed's lines in it (NewDeepSpeedLayer). `source` names the
// input in errors and must outlive the parser. `options`: the column map,
// logging_steps (kHfTrainer) and the pattern (kPattern); its format is not
// read.
std::unique_ptr<LineParser> NewLineParser(MetricsFormat format, absl::string_view source,
                                          const ReadOptions& options = ReadOptions());
// A whole text read by NewLineParser(format).
absl::StatusOr<Trace> ParseLines(absl::string_view content, absl::string_view source,
                                 MetricsFormat format, const ReadOptions& options = ReadOptions());

// The text logs' readers, a file each in logs/src/ (key_value_logs.cc: llm.c
// and step:S/N; megatron_log.cc; nanogpt_log.cc). Each reads only its own
// metric lines and reads past everything else a trainer prints.
std::unique_ptr<LineParser> NewLlmcParser(absl::string_view source);
std::unique_ptr<LineParser> NewStepLogParser(absl::string_view source);
std::unique_ptr<LineParser> NewMegatronParser(absl::string_view source);
std::unique_ptr<LineParser> NewNanoGptParser(absl::string_view source);
// The Python frameworks' console logs (hf_trainer_log.cc, torchtitan_log.cc,
// composer_log.cc, nemo_log.cc): Hugging Face Trainer's dicts, torchtitan's
// step lines, Composer's ConsoleLogger blocks, NeMo's "Training epoch" lines
// and bars.
std::unique_ptr<LineParser> NewHfTrainerParser(absl::string_view source, int64_t logging_steps);
std::unique_ptr<LineParser> NewTorchTitanParser(absl::string_view source);
std::unique_ptr<LineParser> NewComposerParser(absl::string_view source);
std::unique_ptr<LineParser> NewNemoParser(absl::string_view source);
// Each format's metric line, for detection (formats.cc): a line as read,
// with its '\r' segments and colour codes.
bool IsHfTrainerLine(absl::string_view line);
bool IsTorchTitanLine(absl::string_view line);
bool IsComposerLine(absl::string_view line);
bool IsNemoLine(absl::string_view line);
bool IsLlmcLine(absl::string_view line);
bool IsStepLogLine(absl::string_view line);
bool IsMegatronLine(absl::string_view line);
bool IsNanoGptLine(absl::string_view line);
// Hugging Face's trainer_state.json (hf_trainer_state.cc), fed a line at a
// time: each complete JSON document is read whole, and only its entries at
// steps above the last one given become records, so that a follower fed the
// file again after each rewrite sends each step once.
std::unique_ptr<LineParser> NewHfTrainerStateParser(absl::string_view source);
// True when `content` looks like a trainer_state.json (an object with a
// "log_history" key near its start).
bool LooksLikeHfTrainerState(absl::string_view content);
// The newest (by modification time) of FOLDER/NAME and FOLDER/*/NAME: a
// Trainer's output folder holds trainer_state.json in each checkpoint-N/
// and, at the end, its own. FOLDER/NAME when none exists.
std::string NewestFileNamed(const std::string& folder, const std::string& name);
// DeepSpeed's loss-scaler lines (deepspeed_lines.cc) read around `trainer`,
// the reader of the log's own lines (nullptr: DeepSpeed's lines alone). The
// trainer's records pass through, each carrying the overflow DeepSpeed
// reported at its step; an overflow at a step the trainer does not record
// is a record of its own.
std::unique_ptr<LineParser> NewDeepSpeedLayer(absl::string_view source,
                                              std::unique_ptr<LineParser> trainer);
// A DeepSpeed loss-scaler line (an fp16 overflow, the minimum-scale failure,
// step=N, skipped=K), for format detection.
bool IsDeepSpeedLine(absl::string_view line);
// CSV and JSON lines (metrics_file.cc).
// Column names that mean the step in exports of common tools (`lower`: the
// name in lower case): step, _step, global_step, iteration, ...
bool IsStepColumn(absl::string_view lower);
std::unique_ptr<LineParser> NewCsvParser(absl::string_view source, bool strict,
                                         const ColumnMap& map);
std::unique_ptr<LineParser> NewJsonLinesParser(absl::string_view source);
// Guesses the format from the first lines: kCsv when none of the logs'
// lines is among them and the first line that is not a comment is a header
// (a step column (IsStepColumn), or names alone, without spaces); kAuto when
// nothing matches.
MetricsFormat DetectFormat(absl::string_view content);
// What replay and follow say when DetectFormat() knows nothing: the formats
// tried, the first line that names a loss (else the first that is not a
// comment), and how to give --pattern.
absl::Status UnknownFormatError(absl::string_view source, absl::string_view content);

}  // namespace trainwatch::logs

#endif  // TRAINWATCH_LOGS_TRACE_BUILDER_H_
