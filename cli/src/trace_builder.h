// Private to cli/: the pieces every metrics reader shares — building a
// Trace row by row with the ordering rules enforced once, and the error and
// number helpers that make every message name file, line and column.

#ifndef TRAINWATCH_CLI_SRC_TRACE_BUILDER_H_
#define TRAINWATCH_CLI_SRC_TRACE_BUILDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/cli/metrics_file.h"

namespace trainwatch::cli {

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
// "learning_rate", ...); `lower` is lower case.
bool SignalByAlias(absl::string_view lower, core::Signal* out);

class TraceBuilder {
 public:
  using Row = Trace::Row;

  explicit TraceBuilder(absl::string_view source) : source_(source) {}

  // Room for `rows` rows up front (a reader's line count), so that a long
  // log's rows are not copied each time the vector grows: that copying and
  // its page faults were a fifth of a 500k-step replay.
  void Reserve(size_t rows) { trace_.rows_.reserve(rows); }
  Row& NewRow(int line);
  // Refuses a negative step and one equal to the last; a step below the last
  // is a restart (see Replay()). `column` locates the step in errors.
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
  void AddWarning(std::string message) { trace_.warnings_.push_back(std::move(message)); }
  // Step of the last row, -1 when none.
  int64_t last_step() const { return have_last_ ? last_step_ : -1; }
  size_t rows() const { return trace_.rows_.size(); }

  // Fails on an empty trace. Signals never reported with a finite value are
  // cleared from every row: unknown for the run, not failures.
  absl::StatusOr<Trace> Finish(MetricsFormat format);

 private:
  absl::string_view source_;
  Trace trace_;
  bool have_last_ = false;
  int64_t last_step_ = 0;
  int last_line_ = 0;
};

// Text-log readers (log_formats.cc). Each reads only its own metric lines
// and reads past everything else a trainer prints.
absl::StatusOr<Trace> ParseLlmcLog(absl::string_view content, absl::string_view source);
absl::StatusOr<Trace> ParseStepLog(absl::string_view content, absl::string_view source);
absl::StatusOr<Trace> ParseMegatronLog(absl::string_view content, absl::string_view source);
absl::StatusOr<Trace> ParseGenericCsv(absl::string_view content, absl::string_view source,
                                      const ColumnMap& map);
// Guesses the format from the first lines; kCsv when nothing else matches.
MetricsFormat DetectFormat(absl::string_view content);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_TRACE_BUILDER_H_
