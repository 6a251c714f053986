// "key:value key:value ..." logs: llm.c's main.log (`s:STEP trl:LOSS lr:LR
// norm:NORM`) and the step:S/N family (modded-nanogpt, parameter-golf: `step:S/N
// train_loss:L ...`), one reader with a table each. Each reads its own metric
// lines and reads past everything else, but a metric line with a garbage
// value is an error that names the line and column.

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
    return NoRecords(b, source_, f_.what);
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

bool IsLlmcLine(absl::string_view raw) {
  const absl::string_view line = absl::StripAsciiWhitespace(raw);
  return absl::StartsWith(line, "s:") &&
         (absl::StrContains(line, " trl:") || absl::StrContains(line, " tel:"));
}

bool IsStepLogLine(absl::string_view raw) {
  const absl::string_view line = absl::StripAsciiWhitespace(raw);
  return absl::StartsWith(line, "step:") && absl::StrContains(line.substr(0, 32), "/");
}

}  // namespace trainwatch::logs
