// A user's own line format, for `twctl follow --pattern` and `twctl replay
// --pattern`: the way to read a script that prints its metrics in a format
// no reader knows, without changing the script.
//
// Two ways to write one (docs/replay-and-follow.md#your-own-format):
//   a template  `step {step}/{} | loss {loss} | gnorm {grad_norm} | lr {lr}`:
//               {NAME} is a number (the step: an integer), {} any text, a
//               run of spaces one or more spaces (or tabs), {{ and }} the
//               braces themselves, and every other character itself;
//   a regex     (RE2 syntax) with named groups, (?<NAME>...) or
//               (?P<NAME>...): `step\s+(?<step>\d+)/\d+ \| loss (?<loss>\S+)`.
// It is searched for anywhere in a line (a timestamp or a logger's prefix
// before it is read past); a line it does not match is not a metric line.
// NAME is `step` (required), `loss` (required), or another signal by its
// name or a usual alias: grad_norm, log_z, nan_frac, lr (learning_rate),
// z_loss_alpha, activation_max, attention_logit_p99, train_loss, ... A value
// may be nan or inf, as the other readers take them.

#ifndef TRAINWATCH_LOGS_LINE_PATTERN_H_
#define TRAINWATCH_LOGS_LINE_PATTERN_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/core/step_record.h"

namespace re2 {
class RE2;
}

namespace trainwatch::logs {

class LineParser;

// A compiled RE2 regex whose groups may be named (?<name>...), as in
// ECMAScript and PCRE, or (?P<name>...), as RE2 itself writes them.
class NamedRegex {
 public:
  // InvalidArgument naming `flag` and RE2's reason when `pattern` is not a
  // regex.
  static absl::StatusOr<NamedRegex> Compile(absl::string_view pattern, absl::string_view flag);

  // Group numbers (from 1) by name.
  const std::map<std::string, int>& named() const { return named_; }
  // How many capture groups, named or not.
  int groups() const { return groups_; }
  // The first match anywhere in `line`: captures[0] is the whole match,
  // captures[i] group i (data() == nullptr when the group took no part).
  bool Search(absl::string_view line, std::vector<absl::string_view>* captures) const;

 private:
  std::shared_ptr<const re2::RE2> re_;
  std::map<std::string, int> named_;
  int groups_ = 0;
};

class LinePattern {
 public:
  // A template or a regex as above; InvalidArgument naming what is wrong (no
  // step or loss field, an unknown name, a bad regex).
  static absl::StatusOr<std::shared_ptr<const LinePattern>> Compile(absl::string_view text);

  const std::string& text() const { return text_; }
  // The regex a template became (the text itself for a regex).
  const std::string& regex() const { return regex_; }

 private:
  friend class PatternParser;
  std::string text_, regex_;
  NamedRegex re_;
  int step_group_ = 0;
  std::vector<std::pair<core::Signal, int>> signal_groups_;
};

// The reader of lines `pattern` describes; `source` names the input in
// errors and must outlive the parser.
std::unique_ptr<LineParser> NewPatternParser(std::shared_ptr<const LinePattern> pattern,
                                             absl::string_view source);

}  // namespace trainwatch::logs

#endif  // TRAINWATCH_LOGS_LINE_PATTERN_H_
