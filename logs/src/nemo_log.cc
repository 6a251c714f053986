// NeMo's console log: NeMo 2's "Training epoch E, iteration I/T | ..." lines
// and NeMo 1's Lightning progress bar with reduced_train_loss=. Like the
// other text readers, it reads its own metric lines, reads past everything
// else, and names line and column when a metric's value is not a number.

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

// A number in Lightning's progress-bar postfix: tqdm's format_num shortens
// floats to 3 significant digits ("9e+3", "1.63e+6"), and a nan loss
// prints as "nan.0".
bool PostfixNumber(absl::string_view v, double* out) {
  if (ParseDouble(v, out)) return true;
  return absl::ConsumeSuffix(&v, ".0") &&
         (absl::EqualsIgnoreCase(v, "nan") || absl::EqualsIgnoreCase(v, "inf") ||
          absl::EqualsIgnoreCase(v, "-inf")) &&
         ParseDouble(v, out);
}

// NeMo 2's MegatronProgressBar prints, every log_every_n_steps,
//   Training epoch E, iteration I/T | lr: X | consumed_samples: N |
//   global_batch_size: B | global_step: S | reduced_train_loss: L |
//   train_step_timing in s: T [| val_loss: V]
// on one line. The step is global_step (iteration when absent).
//
// NeMo 1 shows Lightning's tqdm bar, redrawn with '\r':
//   Epoch 0:   1%|   | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1,
//   v_num=, reduced_train_loss=3.090, global_step=794.0, consumed_samples=...]
// Each redraw with a new step is a record. global_step is shortened to 3
// significant digits past 999 ("9e+3"), so the step is the bar's N plus the
// offset the last exact global_step showed (N counts within the epoch).
class NemoParser : public LineParser {
 public:
  explicit NemoParser(absl::string_view source) : source_(source) {}

  absl::Status Line(absl::string_view line, int n, TraceBuilder& b) override {
    if (line.find("reduced_train_loss=") != absl::string_view::npos) return BarLine(line, n, b);
    const size_t at = line.find("Training epoch ");
    if (at == absl::string_view::npos) return absl::OkStatus();
    absl::string_view step_text, loss_text;
    parts_.clear();
    for (absl::string_view part : absl::StrSplit(line.substr(at), '|')) parts_.push_back(part);
    if (parts_.size() < 2) return absl::OkStatus();
    // "Training epoch E, iteration I/T"
    const size_t it = parts_[0].find("iteration ");
    if (it != absl::string_view::npos) {
      size_t end;
      step_text = DigitsAt(parts_[0], it + 10, &end);
    }
    for (size_t p = 1; p < parts_.size(); ++p) {
      const size_t colon = parts_[p].find(':');
      if (colon == absl::string_view::npos) continue;
      const absl::string_view key = absl::StripAsciiWhitespace(parts_[p].substr(0, colon));
      const absl::string_view value = absl::StripAsciiWhitespace(parts_[p].substr(colon + 1));
      if (key == "global_step") step_text = value;
      if (key == "reduced_train_loss") loss_text = value;
    }
    if (loss_text.empty() || step_text.empty()) return absl::OkStatus();
    int64_t step;
    double d;
    // Lightning's logged global_step can print as a float ("120.0").
    const bool ok = ParseInt64(step_text, &step) ||
                    (ParseDouble(step_text, &d) && d >= 0 && d < 9.0e15 &&
                     d == static_cast<int64_t>(d) && ((step = static_cast<int64_t>(d)), true));
    if (!ok || step < 0) {
      return At(source_, n, ColumnOf(line, step_text),
                absl::StrCat("global_step \"", step_text, "\" is not a non-negative integer"));
    }
    auto& row = b.NewRow(n);
    if (absl::Status s = b.SetStep(row, step, ColumnOf(line, step_text)); !s.ok()) return s;
    for (size_t p = 1; p < parts_.size(); ++p) {
      const size_t colon = parts_[p].find(':');
      if (colon == absl::string_view::npos) continue;
      const absl::string_view key = absl::StripAsciiWhitespace(parts_[p].substr(0, colon));
      const absl::string_view value = absl::StripAsciiWhitespace(parts_[p].substr(colon + 1));
      Signal sig;
      if (key == "reduced_train_loss") {
        sig = Signal::kLoss;
      } else if (key == "grad_norm") {
        sig = Signal::kGradNorm;
      } else if (key == "lr") {
        sig = Signal::kLearningRate;
      } else {
        continue;
      }
      double v;
      if (!ParseDouble(value, &v)) {
        return At(source_, n, ColumnOf(line, value),
                  absl::StrCat(key, " \"", value, "\" is not a number"));
      }
      b.SetValue(row, sig, v);
    }
    return absl::OkStatus();
  }
  absl::Status End(const TraceBuilder& b) override {
    return NoRecords(b, source_,
                     "NeMo \"Training epoch E, iteration I/T | ... |\" or reduced_train_loss=");
  }

 private:
  absl::Status BarLine(absl::string_view line, int n, TraceBuilder& b) {
    for (absl::string_view seg : absl::StrSplit(line, '\r')) {
      int64_t bar, total;
      if (!TqdmBar(seg, &bar, &total)) continue;
      const size_t open = seg.find(" [", seg.find(absl::StrCat(bar, "/", total)));
      const size_t close = seg.rfind(']');
      if (open == absl::string_view::npos || close == absl::string_view::npos || close < open) {
        continue;
      }
      absl::string_view loss_text, step_text;
      for (absl::string_view pair : absl::StrSplit(seg.substr(open + 2, close - open - 2), ", ")) {
        const size_t eq = pair.find('=');
        if (eq == absl::string_view::npos) continue;
        const absl::string_view key = pair.substr(0, eq);
        if (key == "reduced_train_loss") loss_text = pair.substr(eq + 1);
        if (key == "global_step") step_text = pair.substr(eq + 1);
      }
      if (loss_text.empty()) continue;
      int64_t step = bar + offset_;
      if (!step_text.empty()) {
        double gs;
        if (!PostfixNumber(step_text, &gs) || !(gs >= 0) || gs > 9.0e15) {
          return At(source_, n, ColumnOf(line, step_text),
                    absl::StrCat("global_step \"", step_text, "\" is not a non-negative number"));
        }
        const auto rounded = static_cast<int64_t>(std::llround(gs));
        if (step_text.find_first_of("eE") == absl::string_view::npos) {
          step = rounded;  // exact
          offset_ = rounded - bar;
        } else if (std::fabs(static_cast<double>(step) - gs) > 0.005 * gs + 0.5) {
          // Not within the shortened figure's rounding: a new epoch's bar.
          step = rounded;
          offset_ = rounded - bar;
        }
      }
      if (step == b.last_step()) continue;  // a redraw of the same step
      double loss;
      if (!PostfixNumber(loss_text, &loss)) {
        return At(source_, n, ColumnOf(line, loss_text),
                  absl::StrCat("reduced_train_loss \"", loss_text, "\" is not a number"));
      }
      auto& row = b.NewRow(n);
      if (absl::Status s = b.SetStep(row, step, ColumnOf(line, seg)); !s.ok()) return s;
      b.SetValue(row, Signal::kLoss, loss);
    }
    return absl::OkStatus();
  }

  absl::string_view source_;
  std::vector<absl::string_view> parts_;
  int64_t offset_ = 0;  // global_step - the bar's N, as last seen exact
};

}  // namespace

std::unique_ptr<LineParser> NewNemoParser(absl::string_view source) {
  return std::make_unique<NemoParser>(source);
}

bool IsNemoLine(absl::string_view line) {
  return (absl::StrContains(line, "Training epoch ") &&
          absl::StrContains(line, "reduced_train_loss:")) ||
         (absl::StrContains(line, "reduced_train_loss=") && absl::StrContains(line, "|"));
}
}  // namespace trainwatch::logs
