// nanoGPT's console log: `iter N: loss X, time Tms, mfu M%` (and its forks'
// `step N: train loss X, val loss Y` evals and `saving checkpoint to DIR`),
// with or without a `YYYY-MM-DD HH:MM:SS ` prefix. A metric line with a
// garbage value is an error that names the line and column; everything
// else is read past.

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "reader_helpers.h"
#include "trainwatch/logs/lines.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

// "YYYY-MM-DD HH:MM:SS " (and a ",mmm" or ".mmm" after the seconds), which
// some trainers' loggers put before nanoGPT's own text: its length, else 0.
size_t TimestampPrefix(absl::string_view line) {
  static constexpr absl::string_view kShape = "dddd-dd-dd dd:dd:dd";
  if (line.size() <= kShape.size()) return 0;
  for (size_t i = 0; i < kShape.size(); ++i) {
    const bool digit = absl::ascii_isdigit(static_cast<unsigned char>(line[i]));
    if (kShape[i] == 'd' ? !digit : line[i] != kShape[i]) return 0;
  }
  size_t i = kShape.size();
  if (line[i] == ',' || line[i] == '.') {
    ++i;
    while (i < line.size() && absl::ascii_isdigit(static_cast<unsigned char>(line[i]))) ++i;
  }
  if (i >= line.size() || line[i] != ' ') return 0;
  return i + 1;
}

// The digits of "<word> N:" at the start of `text` (after `word` and one
// space); false when `text` is not that shape.
bool CountedPrefix(absl::string_view text, absl::string_view word, absl::string_view* digits,
                   size_t* after_colon) {
  if (!absl::StartsWith(text, word) || text.size() <= word.size() ||
      text[word.size()] != ' ') {
    return false;
  }
  size_t i = word.size() + 1;
  const size_t begin = i;
  while (i < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == begin || i >= text.size() || text[i] != ':') return false;
  *digits = text.substr(begin, i - begin);
  *after_colon = i + 1;
  return true;
}

// nanoGPT's train.py: "iter N: loss X, time T ms, mfu M%" every log_interval
// (forks add ", lr L"), "step N: train loss X, val loss Y" at each eval, and
// "saving checkpoint to DIR" right after an eval.
class NanoGptParser : public LineParser {
 public:
  explicit NanoGptParser(absl::string_view source) : source_(source) {}

  absl::Status Line(absl::string_view line, int n, TraceBuilder& b) override {
    const size_t offset = TimestampPrefix(line);
    const absl::string_view text = line.substr(offset);
    absl::string_view digits;
    size_t after;
    if (CountedPrefix(text, "step", &digits, &after) &&
        absl::StartsWith(text.substr(after), " train loss")) {
      // An eval: its losses are estimates over eval_iters batches, not the
      // step's; the step is where a checkpoint saved next belongs.
      if (!ParseInt64(digits, &eval_step_)) eval_step_ = -1;
      return absl::OkStatus();
    }
    if (absl::StartsWith(text, "saving checkpoint to ")) {
      if (eval_step_ >= 0) {
        checkpoint_step_ = eval_step_;
        checkpoint_uri_ = std::string(
            absl::StripAsciiWhitespace(text.substr(sizeof("saving checkpoint to ") - 1)));
      }
      return absl::OkStatus();
    }
    if (!CountedPrefix(text, "iter", &digits, &after)) return absl::OkStatus();
    const int step_column = static_cast<int>(offset + (digits.data() - text.data())) + 1;
    int64_t step;
    if (!ParseInt64(digits, &step)) {
      return At(source_, n, step_column, "iteration number out of range");
    }
    // ", "-separated "key value" fields after the colon.
    struct Field {
      absl::string_view key, value;
      int column;
    };
    Field fields[8];
    int count = 0;
    bool has_loss = false;
    size_t pos = after;
    while (pos < text.size() && count < 8) {
      size_t end = text.find(',', pos);
      if (end == absl::string_view::npos) end = text.size();
      const absl::string_view part = absl::StripAsciiWhitespace(text.substr(pos, end - pos));
      pos = end + 1;
      const size_t space = part.find(' ');
      if (space == absl::string_view::npos) continue;
      const absl::string_view value = absl::StripLeadingAsciiWhitespace(part.substr(space + 1));
      fields[count++] = {part.substr(0, space), value,
                         static_cast<int>(offset + (value.data() - text.data())) + 1};
      has_loss |= part.substr(0, space) == "loss";
    }
    if (!has_loss) return absl::OkStatus();
    if (checkpoint_step_ >= 0 && checkpoint_step_ != step) {
      // The eval's step logged no iter line (log_interval does not divide
      // eval_interval): the checkpoint is a record of its own.
      auto& ckpt = b.NewRow(n);
      if (absl::Status s = b.SetStep(ckpt, checkpoint_step_, 1); !s.ok()) return s;
      b.SetCheckpoint(ckpt, checkpoint_uri_);
      checkpoint_step_ = -1;
    }
    auto& row = b.NewRow(n);
    if (absl::Status s = b.SetStep(row, step, step_column); !s.ok()) return s;
    if (checkpoint_step_ == step) {
      b.SetCheckpoint(row, checkpoint_uri_);
      checkpoint_step_ = -1;
    }
    for (int i = 0; i < count; ++i) {
      const Field& f = fields[i];
      Signal sig;
      if (f.key == "loss") {
        sig = Signal::kLoss;
      } else if (f.key == "lr") {
        sig = Signal::kLearningRate;
      } else {
        continue;  // time, mfu, tokens: not health signals
      }
      double v;
      if (!ParseDouble(f.value, &v)) {
        return At(source_, n, f.column,
                  absl::StrCat(f.key, " \"", f.value, "\" is not a number"));
      }
      b.SetValue(row, sig, v);
    }
    return absl::OkStatus();
  }
  absl::Status Flush(TraceBuilder& b) override {
    // A checkpoint after the last iter line: a record of its own.
    if (checkpoint_step_ < 0 || checkpoint_step_ == b.last_step()) return absl::OkStatus();
    auto& ckpt = b.NewRow(0);
    if (absl::Status s = b.SetStep(ckpt, checkpoint_step_, 1); !s.ok()) return s;
    b.SetCheckpoint(ckpt, checkpoint_uri_);
    checkpoint_step_ = -1;
    return absl::OkStatus();
  }
  absl::Status End(const TraceBuilder& b) override {
    return NoRecords(b, source_, "nanoGPT \"iter N: loss X\"");
  }

 private:
  absl::string_view source_;
  int64_t eval_step_ = -1;
  int64_t checkpoint_step_ = -1;
  std::string checkpoint_uri_;
};

}  // namespace

std::unique_ptr<LineParser> NewNanoGptParser(absl::string_view source) {
  return std::make_unique<NanoGptParser>(source);
}

bool IsNanoGptLine(absl::string_view raw) {
  const absl::string_view line = absl::StripAsciiWhitespace(raw);
  const absl::string_view text = line.substr(TimestampPrefix(line));
  absl::string_view digits;
  size_t after;
  return (CountedPrefix(text, "iter", &digits, &after) &&
          absl::StartsWith(text.substr(after), " loss ")) ||
         (CountedPrefix(text, "step", &digits, &after) &&
          absl::StartsWith(text.substr(after), " train loss "));
}

}  // namespace trainwatch::logs
