// twctl replay's readers: the first byte picks the format (as --format
// would, kAuto included, so detection is fuzzed too) and whether
// --logging-steps is given, the rest is the file. With kPattern the file's
// first line is the --pattern (a template or a regex), the rest the log.
// A trace the reader accepts is replayed through the rule engine with the
// default rules, as `twctl replay` does.

#include <algorithm>

#include "absl/strings/match.h"
#include "fuzz_target.h"
#include "trainwatch/logs/line_pattern.h"
#include "trainwatch/logs/metrics_file.h"
#include "trainwatch/logs/replay.h"
#include "trainwatch/core/config.h"

namespace {

using trainwatch::logs::MetricsFormat;

constexpr MetricsFormat kFormats[] = {
    MetricsFormat::kAuto,     MetricsFormat::kCsv,      MetricsFormat::kGenericCsv,
    MetricsFormat::kJsonLines, MetricsFormat::kLlmc,    MetricsFormat::kStepLog,
    MetricsFormat::kMegatron, MetricsFormat::kTensorBoard,
    // Appended, so that the seeds' first bytes keep naming the formats above.
    MetricsFormat::kNanoGpt,  MetricsFormat::kDeepSpeed,
    MetricsFormat::kHfTrainer, MetricsFormat::kHfTrainerState, MetricsFormat::kTorchTitan,
    MetricsFormat::kComposer, MetricsFormat::kNemo,     MetricsFormat::kPattern,
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  trainwatch::logs::ReadOptions options;
  options.format = kFormats[data[0] % (sizeof(kFormats) / sizeof(kFormats[0]))];
  // The first byte's high bit: a Hugging Face log's --logging-steps (its
  // step without progress bars).
  options.logging_steps = (data[0] & 0x80) != 0 ? 10 : 0;
  absl::string_view content = trainwatch::fuzz::Bytes(data + 1, size - 1);
  if (options.format == MetricsFormat::kPattern) {
    const size_t eol = std::min(content.find('\n'), content.size());
    absl::StatusOr<std::shared_ptr<const trainwatch::logs::LinePattern>> pattern =
        trainwatch::logs::LinePattern::Compile(content.substr(0, eol));
    // A bad pattern is refused with a reason that names the flag.
    if (!pattern.ok()) {
      FUZZ_CHECK(absl::StrContains(pattern.status().message(), "--pattern"));
      return 0;
    }
    options.pattern = *std::move(pattern);
    content.remove_prefix(std::min(eol + 1, content.size()));
  }
  absl::StatusOr<trainwatch::logs::Trace> trace =
      trainwatch::logs::ParseMetrics(content, "fuzz-input", options);
  if (!trace.ok()) {
    // Errors name the input, so an operator knows which file is wrong.
    FUZZ_CHECK(absl::StrContains(trace.status().message(), "fuzz-input"));
    return 0;
  }
  // Rows at one step merge or, with another value of a metric, are a
  // restart there; a step going back opens an attempt too, whose engine
  // holds only earlier steps. So the engine takes every record, and each
  // belongs to one attempt: nothing is dropped.
  absl::StatusOr<trainwatch::logs::ReplayResult> result =
      trainwatch::logs::Replay(*trace, trainwatch::core::RuleConfig());
  FUZZ_CHECK(result.ok());
  FUZZ_CHECK(result->records == static_cast<int64_t>(trace->size()));
  int64_t in_attempts = 0;
  for (const trainwatch::logs::ReplayAttempt& a : result->attempts) in_attempts += a.records;
  FUZZ_CHECK(in_attempts == result->records);
  return 0;
}
