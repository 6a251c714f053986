// The log formats replay and follow read, in one list (formats.cc): each
// one's --format name, its reader, and how detection knows its lines.
// Adding a format is a file with its reader and its line detector, and one
// entry in that list (docs/architecture.md, "Adding a log format").

#ifndef TRAINWATCH_LOGS_SRC_FORMATS_H_
#define TRAINWATCH_LOGS_SRC_FORMATS_H_

#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "trainwatch/logs/metrics_file.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {

struct FormatSpec {
  MetricsFormat id;
  const char* name;  // its --format value (FormatName)
  // As the unknown-format error names it among the formats tried; nullptr
  // when it is not detected from a log's lines.
  const char* tried;
  // Its line reader; nullptr for what has none (auto; TensorBoard's event
  // files have a reader of their own).
  std::unique_ptr<LineParser> (*reader)(absl::string_view source, const ReadOptions& options);
  // A trainer's console log, where DeepSpeed's loss-scaler lines are read
  // too (NewDeepSpeedLayer).
  bool deepspeed_lines;
  // Whether `line` (as read, with its '\r' segments and colour codes) is one
  // of its metric lines; `first`: the log's first line that is neither
  // empty nor a comment. Detection takes the first format, in list order,
  // whose detector takes one of the first 500 such lines. nullptr: not
  // detected by a line (DetectFormat says how, if at all).
  bool (*detects)(absl::string_view line, bool first);
};

// Every format, in detection order.
const std::vector<FormatSpec>& Formats();
// nullptr for an id not in the list.
const FormatSpec* FindFormat(MetricsFormat id);

}  // namespace trainwatch::logs

#endif  // TRAINWATCH_LOGS_SRC_FORMATS_H_
