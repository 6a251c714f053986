// torchtitan's console log: on every rank, `step: N  loss: L  grad_norm: G
// memory: M GiB(P%)  tps: T  tflops: F  mfu: U%` in ANSI colours after the
// logger's prefix and torchrun's `[rankN]:`. Like the other text readers, it
// reads its own metric lines, reads past everything else, and names line and
// column when a metric's value is not a number.

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "reader_helpers.h"
#include "trainwatch/logs/lines.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

// `line` without ANSI escapes ("\x1b[31m"): *out, and in *offsets each
// character's column in `line`. False (nothing written) when there are none.
bool StripAnsi(absl::string_view line, std::string* out, std::vector<int>* offsets) {
  if (line.find('\x1b') == absl::string_view::npos) return false;
  out->clear();
  offsets->clear();
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '\x1b' && i + 1 < line.size() && line[i + 1] == '[') {
      size_t j = i + 2;
      while (j < line.size() && !absl::ascii_isalpha(static_cast<unsigned char>(line[j]))) ++j;
      i = j;  // the final letter too
      continue;
    }
    out->push_back(line[i]);
    offsets->push_back(static_cast<int>(i) + 1);
  }
  return true;
}

// Where torchtitan's "step:" starts in `text` (not "validate step:"), else
// npos.
size_t TitanStepAt(absl::string_view text) {
  for (size_t at = text.find("step:"); at != absl::string_view::npos;
       at = text.find("step:", at + 1)) {
    if (at > 0 && text[at - 1] != ' ') continue;
    if (at >= 9 && text.substr(at - 9, 9) == "validate ") continue;
    return at;
  }
  return absl::string_view::npos;
}

struct TitanField {
  absl::string_view key, value;
};

// "step: 10  loss:  7.8906  grad_norm:  1.2  memory: ..." from `at`: the
// "key: value" pairs (a key token ends with ':').
void TitanFields(absl::string_view text, std::vector<TitanField>* out) {
  out->clear();
  absl::string_view key;
  for (absl::string_view tok : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!key.empty()) {
      out->push_back({key, tok});
      key = absl::string_view();
      continue;
    }
    const size_t colon = tok.find(':');
    if (colon == absl::string_view::npos) continue;
    if (colon + 1 == tok.size()) {
      key = tok.substr(0, colon);
    } else {
      out->push_back({tok.substr(0, colon), tok.substr(colon + 1)});
    }
  }
}

// torchtitan's MetricsProcessor.log: logger.info(f"{red}step: {step:2}
// {green}loss: {loss:7.4f}  {orange}grad_norm: {g:7.4f}  {turquoise}memory:
// ...GiB(...%)  {blue}tps: {tps:,}  {cyan}tflops: ...  {magenta}mfu: ...%")
// (older releases: no grad_norm, wps for tps), after the logger's
// "[titan] DATE - root - INFO - " and torchrun's "[rankN]:". Every rank
// logs: a line of another rank (its prefix says so, or it repeats the
// step just read) is read past. "validate step:" lines are evaluation.
class TorchTitanParser : public LineParser {
 public:
  explicit TorchTitanParser(absl::string_view source) : source_(source) {}

  absl::Status Line(absl::string_view line, int n, TraceBuilder& b) override {
    if (line.find("step:") == absl::string_view::npos) return absl::OkStatus();
    absl::string_view text = line;
    const bool colored = StripAnsi(line, &plain_, &offsets_);
    if (colored) text = plain_;
    auto column = [&](absl::string_view part) {
      const int c = ColumnOf(text, part);
      return colored ? offsets_[static_cast<size_t>(c - 1)] : c;
    };
    if (absl::StartsWith(text, "[rank")) {
      size_t end;
      const absl::string_view rank = DigitsAt(text, 5, &end);
      if (!rank.empty() && text.substr(end, 2) == "]:" && rank != "0") return absl::OkStatus();
    }
    const size_t at = TitanStepAt(text);
    if (at == absl::string_view::npos) return absl::OkStatus();
    TitanFields(text.substr(at), &fields_);
    if (fields_.empty() || fields_[0].key != "step") return absl::OkStatus();
    bool loss = false;
    for (const TitanField& f : fields_) loss |= f.key == "loss";
    if (!loss) return absl::OkStatus();
    int64_t step;
    if (!ParseInt64(fields_[0].value, &step) || step < 0) {
      return At(source_, n, column(fields_[0].value),
                absl::StrCat("step \"", fields_[0].value, "\" is not a non-negative integer"));
    }
    if (step == b.last_step()) return absl::OkStatus();  // another rank's copy
    auto& row = b.NewRow(n);
    if (absl::Status s = b.SetStep(row, step, column(fields_[0].value)); !s.ok()) return s;
    for (const TitanField& f : fields_) {
      Signal sig;
      if (f.key == "loss") {
        sig = Signal::kLoss;
      } else if (f.key == "grad_norm") {
        sig = Signal::kGradNorm;
      } else if (f.key == "lr") {
        sig = Signal::kLearningRate;
      } else {
        continue;
      }
      double v;
      if (!ParseDouble(f.value, &v)) {
        return At(source_, n, column(f.value),
                  absl::StrCat(f.key, " \"", f.value, "\" is not a number"));
      }
      b.SetValue(row, sig, v);
    }
    return absl::OkStatus();
  }
  absl::Status End(const TraceBuilder& b) override {
    return NoRecords(b, source_, "torchtitan \"step: N  loss: L\"");
  }

 private:
  absl::string_view source_;
  std::string plain_;
  std::vector<int> offsets_;
  std::vector<TitanField> fields_;
};

}  // namespace

std::unique_ptr<LineParser> NewTorchTitanParser(absl::string_view source) {
  return std::make_unique<TorchTitanParser>(source);
}

bool IsTorchTitanLine(absl::string_view line) {
  if (!absl::StrContains(line, "step:") || !absl::StrContains(line, "loss:")) return false;
  std::string plain;
  std::vector<int> offsets;
  const absl::string_view t = StripAnsi(line, &plain, &offsets) ? plain : line;
  const size_t at = TitanStepAt(t);
  return at != absl::string_view::npos && absl::StrContains(t.substr(at), " loss:") &&
         (absl::StrContains(t, "memory:") || absl::StrContains(t, " tps:") ||
          absl::StrContains(t, " wps:"));
}
}  // namespace trainwatch::logs
