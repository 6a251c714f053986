// Megatron-LM's iteration lines: `iteration N/ M | ... | lm loss: L | ...
// | grad norm: G | ...`. Each metric line with a garbage value is an error
// that names the line and column; everything else is read past.

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
    return NoRecords(b, source_, "Megatron-LM \"iteration N/ M |\"");
  }

 private:
  absl::string_view source_;
  int64_t prev_step_ = -1;
};

}  // namespace

std::unique_ptr<LineParser> NewMegatronParser(absl::string_view source) {
  return std::make_unique<MegatronParser>(source);
}

bool IsMegatronLine(absl::string_view line) {
  return absl::StrContains(line, "iteration") && absl::StrContains(line, "|") &&
         (absl::StrContains(line, "lm loss:") || absl::StrContains(line, "learning rate:"));
}

}  // namespace trainwatch::logs
