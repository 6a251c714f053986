// Lines of a text, the way every reader of replay walks them: split at '\n',
// a trailing '\r' dropped, numbered from 1 for error messages.

#ifndef TRAINWATCH_CLI_LINES_H_
#define TRAINWATCH_CLI_LINES_H_

#include "absl/strings/string_view.h"

namespace trainwatch::cli {

class LineReader {
 public:
  explicit LineReader(absl::string_view content) : content_(content) {}

  // The next line, or false at the end.
  bool Next(absl::string_view* line) {
    if (pos_ >= content_.size()) return false;
    size_t end = content_.find('\n', pos_);
    if (end == absl::string_view::npos) end = content_.size();
    *line = content_.substr(pos_, end - pos_);
    pos_ = end + 1;
    ++line_no_;
    if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
    return true;
  }
  // The number of the line Next() gave last.
  int line_no() const { return line_no_; }

 private:
  absl::string_view content_;
  size_t pos_ = 0;
  int line_no_ = 0;
};

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_LINES_H_
