// What the text readers share (one file per format in logs/src/): the
// "nothing to replay" message, columns, digits, tqdm bars and Python dict
// reprs.

#ifndef TRAINWATCH_LOGS_SRC_READER_HELPERS_H_
#define TRAINWATCH_LOGS_SRC_READER_HELPERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {

// OK when `b` holds a record; else "no <what> lines: nothing to replay".
absl::Status NoRecords(const TraceBuilder& b, absl::string_view source, absl::string_view what);
// The 1-based column of `part`, a view into `line`.
int ColumnOf(absl::string_view line, absl::string_view part);
bool AllDigits(absl::string_view s);
// The digits at `i` in `s` and the index after them (an empty view when none).
absl::string_view DigitsAt(absl::string_view s, size_t i, size_t* end);
// A tqdm bar's "| N/M [" in `seg`: N and M. The Trainer's bar is
// "{pct}|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}]".
bool TqdmBar(absl::string_view seg, int64_t* n, int64_t* total);

struct DictEntry {
  absl::string_view key;
  absl::string_view value;  // as printed, stripped
};
// A Python dict's repr, "{'k': v, 'k2': 'v2'}", read shallowly: keys are
// quoted strings, a value runs to the next ',' or '}' outside quotes and
// brackets. False when `text` (starting at '{') is not one whole dict.
bool PythonDict(absl::string_view text, std::vector<DictEntry>* out);
// A value as the Trainer prints it: a float's repr (1.6747, 1e-05, nan),
// a string holding one ('1.675', transformers 5's f"{v:.4g}"), or a tensor's
// repr (tensor(0.5, device='cuda:0'), as some versions logged grad_norm).
bool PythonNumber(absl::string_view v, double* out);
// The first '\r'-separated segment of `line` that is a Trainer dict
// ("{'...': ...}" after spaces, or right after a bar whose clearing was
// lost), else an empty view.
absl::string_view DictSegment(absl::string_view line);

}  // namespace trainwatch::logs

#endif  // TRAINWATCH_LOGS_SRC_READER_HELPERS_H_
