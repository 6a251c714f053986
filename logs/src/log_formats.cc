// Readers for the logs trainers already write. Each reads its own metric
// lines and reads past everything else (banners, configuration dumps,
// warnings), but a metric line with a garbage value is an error that names
// the line and column: a replay must never quietly drop a step it was given.

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "trainwatch/logs/lines.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {

using core::Signal;

namespace {

struct Token {
  absl::string_view key;
  absl::string_view value;
  int value_column;  // 1-based
};

// Splits "k1:v1 k2:v2 ..." on whitespace; tokens without ':' get an empty key.
std::vector<Token> KeyValues(absl::string_view line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && absl::ascii_isspace(static_cast<unsigned char>(line[i]))) ++i;
    const size_t start = i;
    while (i < line.size() && !absl::ascii_isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i == start) break;
    const absl::string_view tok = line.substr(start, i - start);
    const size_t colon = tok.find(':');
    if (colon == absl::string_view::npos) {
      out.push_back({absl::string_view(), tok, static_cast<int>(start) + 1});
    } else {
      out.push_back({tok.substr(0, colon), tok.substr(colon + 1),
                     static_cast<int>(start + colon) + 2});
    }
  }
  return out;
}

absl::Status Number(absl::string_view source, int line, const Token& t, absl::string_view what,
                    double* out) {
  if (ParseDouble(t.value, out)) return absl::OkStatus();
  return At(source, line, t.value_column,
            absl::StrCat(what, " \"", t.value, "\" is not a number"));
}

// "S" or "S/N" -> S.
absl::Status StepOf(absl::string_view source, int line, const Token& t, int64_t* step) {
  absl::string_view v = t.value;
  const size_t slash = v.find('/');
  if (slash != absl::string_view::npos) v = v.substr(0, slash);
  if (ParseInt64(v, step) && *step >= 0) return absl::OkStatus();
  return At(source, line, t.value_column,
            absl::StrCat("step \"", t.value, "\" is not a non-negative integer"));
}

absl::Status NoLinesUnlessRows(const TraceBuilder& b, absl::string_view source,
                              absl::string_view what) {
  if (b.rows() == 0) {
    return At(source, 1, 1, absl::StrCat("no ", what, " lines: nothing to replay"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// A "key:value key:value ..." log: lines whose first key is `step_key` and
// that carry `train_key` are records; `signals` maps the keys read.
struct KeyValueFormat {
  absl::string_view step_key;
  absl::string_view train_key;
  std::vector<std::pair<absl::string_view, Signal>> signals;
  absl::string_view what;  // for "no ... lines"
};

class KeyValueParser : public LineParser {
 public:
  KeyValueParser(absl::string_view source, const KeyValueFormat& f) : source_(source), f_(f) {}

  absl::Status Line(absl::string_view line, int n, TraceBuilder& b) override {
    const std::vector<Token> toks = KeyValues(line);
    if (toks.empty() || toks[0].key != f_.step_key) return absl::OkStatus();
    bool train = false;
    for (const Token& t : toks) train |= t.key == f_.train_key;
    if (!train) return absl::OkStatus();  // a validation-only line
    int64_t step;
    if (absl::Status s = StepOf(source_, n, toks[0], &step); !s.ok()) return s;
    auto& row = b.NewRow(n);
    if (absl::Status s = b.SetStep(row, step, toks[0].value_column); !s.ok()) return s;
    for (const Token& t : toks) {
      for (const auto& [key, sig] : f_.signals) {
        if (t.key != key) continue;
        double v;
        if (absl::Status s = Number(source_, n, t, t.key, &v); !s.ok()) return s;
        b.SetValue(row, sig, v);
      }
    }
    return absl::OkStatus();
  }
  absl::Status End(const TraceBuilder& b) override {
    return NoLinesUnlessRows(b, source_, f_.what);
  }

 private:
  absl::string_view source_;
  const KeyValueFormat& f_;
};

}  // namespace

std::unique_ptr<LineParser> NewLlmcParser(absl::string_view source) {
  // "s:STEP trl:LOSS lr:LR norm:NORM"; "s:STEP tel:VAL" lines are validation.
  static const KeyValueFormat kLlmc{
      "s", "trl",
      {{"trl", Signal::kLoss}, {"norm", Signal::kGradNorm}, {"lr", Signal::kLearningRate}},
      "llm.c \"s:STEP trl:LOSS\""};
  return std::make_unique<KeyValueParser>(source, kLlmc);
}

std::unique_ptr<LineParser> NewStepLogParser(absl::string_view source) {
  // "step:S/N train_loss:L ..."; val_loss-only lines are validation; other
  // keys (train_time, step_avg, seq_len, ...) are read past.
  static const KeyValueFormat kStep{"step",
                                    "train_loss",
                                    {{"train_loss", Signal::kLoss},
                                     {"grad_norm", Signal::kGradNorm},
                                     {"norm", Signal::kGradNorm},
                                     {"lr", Signal::kLearningRate}},
                                    "\"step:S/N train_loss:L\""};
  return std::make_unique<KeyValueParser>(source, kStep);
}

namespace {

class MegatronParser : public LineParser {
 public:
  explicit MegatronParser(absl::string_view source) : source_(source) {}

  absl::Status Line(absl::string_view line, int n, TraceBuilder& b) override {
    const size_t it = line.find("iteration");
    if (it == absl::string_view::npos || line.find('|') == absl::string_view::npos) {
      return absl::OkStatus();
    }
    size_t i = it + 9;
    while (i < line.size() && line[i] == ' ') ++i;
    const size_t digits = i;
    while (i < line.size() && absl::ascii_isdigit(static_cast<unsigned char>(line[i]))) ++i;
    if (i == digits || i >= line.size() || line[i] != '/') return absl::OkStatus();
    int64_t step;
    if (!ParseInt64(line.substr(digits, i - digits), &step)) {
      return At(source_, n, static_cast<int>(digits) + 1, "iteration number out of range");
    }
    auto& row = b.NewRow(n);
    if (absl::Status s = b.SetStep(row, step, static_cast<int>(digits) + 1); !s.ok()) return s;
    // " key: value |" segments after the iteration counter.
    bool has_loss = false, has_grad_norm = false;
    size_t seg = line.find('|', i);
    while (seg != absl::string_view::npos) {
      const size_t next = line.find('|', seg + 1);
      const size_t end = next == absl::string_view::npos ? line.size() : next;
      const absl::string_view part = line.substr(seg + 1, end - seg - 1);
      seg = next;
      const size_t colon = part.find(':');
      if (colon == absl::string_view::npos) continue;
      const std::string key =
          absl::AsciiStrToLower(absl::StripAsciiWhitespace(part.substr(0, colon)));
      const absl::string_view raw = part.substr(colon + 1);
      const absl::string_view value = absl::StripAsciiWhitespace(raw);
      const int column = static_cast<int>((value.data() - line.data())) + 1;
      Signal sig;
      if (key == "lm loss") {
        sig = Signal::kLoss;
        has_loss = true;
      } else if (key == "grad norm") {
        sig = Signal::kGradNorm;
        has_grad_norm = true;
      } else if (key == "learning rate") {
        sig = Signal::kLearningRate;
      } else if (key == "number of nan iterations") {
        double count;
        if (!ParseDouble(value, &count) || count < 0) {
          return At(source_, n, column, absl::StrCat(key, " \"", value, "\" is not a count"));
        }
        // Megatron counts NaN iterations per logging interval; as nan_frac
        // this is the fraction of the interval's iterations that had one.
        const double interval = prev_step_ >= 0 ? static_cast<double>(step - prev_step_) : 1.0;
        b.SetValue(row, Signal::kNanFrac, count / std::max(1.0, interval));
        continue;
      } else {
        continue;
      }
      double v;
      if (!ParseDouble(value, &v)) {
        return At(source_, n, column, absl::StrCat(key, " \"", value, "\" is not a number"));
      }
      b.SetValue(row, sig, v);
    }
    // Megatron prints "lm loss" only when the interval's average is above
    // zero, so a NaN loss drops the field: a line with a grad norm (an update
    // was applied, not skipped) and no loss is the silent NaN of a bf16 run,
    // a failed step, not a step without a loss.
    if (has_grad_norm && !has_loss) {
      b.SetValue(row, Signal::kLoss, std::numeric_limits<double>::quiet_NaN());
    }
    prev_step_ = step;
    return absl::OkStatus();
  }
  absl::Status End(const TraceBuilder& b) override {
    return NoLinesUnlessRows(b, source_, "Megatron-LM \"iteration N/ M |\"");
  }

 private:
  absl::string_view source_;
  int64_t prev_step_ = -1;
};

}  // namespace

std::unique_ptr<LineParser> NewMegatronParser(absl::string_view source) {
  return std::make_unique<MegatronParser>(source);
}

namespace {

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
    return NoLinesUnlessRows(b, source_, "nanoGPT \"iter N: loss X\"");
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

bool IsLlmcLine(absl::string_view raw) {
  const absl::string_view line = absl::StripAsciiWhitespace(raw);
  return absl::StartsWith(line, "s:") &&
         (absl::StrContains(line, " trl:") || absl::StrContains(line, " tel:"));
}

bool IsStepLogLine(absl::string_view raw) {
  const absl::string_view line = absl::StripAsciiWhitespace(raw);
  return absl::StartsWith(line, "step:") && absl::StrContains(line.substr(0, 32), "/");
}

bool IsMegatronLine(absl::string_view line) {
  return absl::StrContains(line, "iteration") && absl::StrContains(line, "|") &&
         (absl::StrContains(line, "lm loss:") || absl::StrContains(line, "learning rate:"));
}

}  // namespace trainwatch::logs
