// Reading a run's exported metrics for `twctl replay`: CSV with a header, or
// JSON lines, with the columns/keys step, loss, grad_norm, log_z, nan_frac
// and optionally shard (ids separated by ';'), checkpoint (a uri on the steps
// that saved one), lr, z_loss_alpha, activation_max, attention_logit_p99.
//
// Reading is all or nothing: malformed input is an error naming the file,
// line and column, and no record is returned, so a replay never prints a
// partial answer. A metric the file never reports with a finite value is
// "unknown" for the whole run (not zero); a NaN in a metric the run does
// report is kept, since it is a signal.

#ifndef TRAINWATCH_CLI_METRICS_FILE_H_
#define TRAINWATCH_CLI_METRICS_FILE_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/core/step_record.h"

namespace trainwatch::cli {

enum class MetricsFormat { kAuto, kCsv, kJsonLines };

// A parsed file. Records are views into its storage: keep the Trace alive
// while they are used.
class Trace {
 public:
  size_t size() const { return rows_.size(); }
  // The i-th record, ready for RuleEngine::Observe().
  core::StepRecord Record(size_t i) const;
  // Source line of the i-th record, for messages.
  int line(size_t i) const { return rows_[i].line; }
  // Signals present in at least one row with a finite value.
  uint32_t reported() const { return reported_; }

 private:
  friend class TraceBuilder;
  struct Row {
    int64_t step;
    std::array<double, core::kNumSignals> values;
    uint32_t present;
    uint32_t shard_begin;
    uint32_t shard_count;
    int32_t checkpoint;  // index into checkpoints_, -1 when none
    int line;
  };
  std::vector<Row> rows_;
  std::vector<uint64_t> shards_;
  std::vector<std::string> checkpoints_;
  uint32_t reported_ = 0;
};

// Parses `content`; `source` names it in errors.
absl::StatusOr<Trace> ParseMetrics(absl::string_view content, absl::string_view source,
                                   MetricsFormat format = MetricsFormat::kAuto);

// Reads and parses a file.
absl::StatusOr<Trace> ReadMetricsFile(const std::string& path,
                                      MetricsFormat format = MetricsFormat::kAuto);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_METRICS_FILE_H_
