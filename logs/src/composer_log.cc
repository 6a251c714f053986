// Composer's ConsoleLogger (llm-foundry's console output): a progress header
// `[batch=N/M]:` then one `\t Train NAME: VALUE` line per metric. Like the
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

// Composer's progress header, "[batch=N/M]:", "[epoch=E][batch=B/T]:" (B
// counts within epoch E, from 1) or "[token=N/M]:" and other units; the
// trailing ':' only when metrics follow. *step: the batches done, -1 when
// the header does not say. False when `text` is not a header.
bool ComposerHeader(absl::string_view text, int64_t* step) {
  if (text.size() < 2 || text[0] != '[' || absl::StartsWith(text, "[Eval")) return false;
  *step = -1;
  int64_t epoch = -1;
  size_t i = 0;
  bool any = false;
  while (i < text.size() && text[i] == '[') {
    const size_t eq = text.find('=', i);
    const size_t close = text.find(']', i);
    if (eq == absl::string_view::npos || close == absl::string_view::npos || eq > close) {
      return false;
    }
    const absl::string_view unit = text.substr(i + 1, eq - i - 1);
    const absl::string_view value = text.substr(eq + 1, close - eq - 1);
    const size_t slash = value.find('/');
    const absl::string_view count = value.substr(0, slash);
    if (!AllDigits(count)) return false;
    int64_t c;
    if (!ParseInt64(count, &c)) return false;
    if (unit == "epoch") {
      epoch = c;
    } else if (unit == "batch") {
      if (epoch < 0) {
        *step = c;
      } else if (slash != absl::string_view::npos) {
        int64_t total;
        if (!ParseInt64(value.substr(slash + 1), &total)) return false;
        *step = (epoch - 1) * total + c;
      }
    } else if (!absl::ascii_isalpha(static_cast<unsigned char>(unit.empty() ? '0' : unit[0]))) {
      return false;
    }
    any = true;
    i = close + 1;
  }
  return any && (i == text.size() || (i + 1 == text.size() && text[i] == ':'));
}

// Composer's ConsoleLogger (llm-foundry's console output): a header, then
// one "\t {prefix}{name}: {value}" line per metric logged since the last,
// printed at once. A block is a record when it is complete: at the next
// line that is not one of its own, or the end of the source.
class ComposerParser : public LineParser {
 public:
  explicit ComposerParser(absl::string_view source) : source_(source) {}

  absl::Status Line(absl::string_view line, int n, TraceBuilder& b) override {
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    const bool indented = !line.empty() && (line[0] == '\t' || line[0] == ' ');
    if (indented && block_.open) {
      absl::string_view rest = text;
      if (!absl::ConsumePrefix(&rest, "Train ")) return absl::OkStatus();
      const size_t colon = rest.find(": ");
      if (colon == absl::string_view::npos) return absl::OkStatus();
      const absl::string_view name = rest.substr(0, colon);
      const absl::string_view value = absl::StripAsciiWhitespace(rest.substr(colon + 2));
      int i;
      if (name == "loss/train/total") {
        i = 0;
      } else if (name == "l2_norm/grad/global") {  // Composer's OptimizerMonitor
        i = 1;
      } else if (absl::StartsWith(name, "lr-") && !block_.set[2]) {
        i = 2;
      } else if (name == "time/batch") {
        int64_t batch;
        if (!ParseInt64(value, &batch) || batch < 0) {
          return At(source_, n, ColumnOf(line, value),
                    absl::StrCat("time/batch \"", value, "\" is not a non-negative integer"));
        }
        block_.time_batch = batch;
        return absl::OkStatus();
      } else {
        return absl::OkStatus();
      }
      if (!ParseDouble(value, &block_.value[i])) {
        return At(source_, n, ColumnOf(line, value),
                  absl::StrCat(name, " \"", value, "\" is not a number"));
      }
      block_.set[i] = true;
      return absl::OkStatus();
    }
    if (indented && text.empty()) return absl::OkStatus();
    // Any other line ends the block.
    if (absl::Status s = Finish(b); !s.ok()) return s;
    int64_t step;
    if (!indented && ComposerHeader(text, &step)) {
      block_ = Block();
      block_.open = true;
      block_.header_step = step;
      block_.line = n;
      block_.column = ColumnOf(line, text);
    }
    return absl::OkStatus();
  }

  absl::Status Flush(TraceBuilder& b) override { return Finish(b); }
  // Composer prints a block with one print(): a source gone quiet after
  // one has given all of it.
  absl::Status Idle(TraceBuilder& b) override { return Finish(b); }

  absl::Status End(const TraceBuilder& b) override {
    return NoRecords(b, source_, "Composer \"[batch=N/M]:\" blocks with Train");
  }

 private:
  struct Block {
    bool open = false;
    int64_t header_step = -1;
    int64_t time_batch = -1;
    bool set[3] = {false, false, false};
    double value[3] = {0, 0, 0};
    int line = 0, column = 1;
  };

  absl::Status Finish(TraceBuilder& b) {
    if (!block_.open) return absl::OkStatus();
    const Block k = block_;
    block_ = Block();
    if (!k.set[0] && !k.set[1] && !k.set[2]) return absl::OkStatus();
    // The header counts batches done; time/batch, logged as the batch
    // began, counts those before it.
    const int64_t step = k.header_step >= 0  ? k.header_step
                         : k.time_batch >= 0 ? k.time_batch + 1
                                             : -1;
    if (step < 0) {
      return At(source_, k.line, k.column,
                "a Composer block whose header gives no batch and without Train time/batch: "
                "its step is unknown");
    }
    auto& row = b.NewRow(k.line);
    if (absl::Status s = b.SetStep(row, step, k.column); !s.ok()) return s;
    static constexpr Signal kSignals[] = {Signal::kLoss, Signal::kGradNorm, Signal::kLearningRate};
    for (int i = 0; i < 3; ++i) {
      if (k.set[i]) b.SetValue(row, kSignals[i], k.value[i]);
    }
    return absl::OkStatus();
  }

  absl::string_view source_;
  Block block_;
};

}  // namespace

std::unique_ptr<LineParser> NewComposerParser(absl::string_view source) {
  return std::make_unique<ComposerParser>(source);
}

bool IsComposerLine(absl::string_view line) {
  const absl::string_view text = absl::StripAsciiWhitespace(line);
  int64_t step;
  if (absl::StartsWith(text, "[batch=") || absl::StartsWith(text, "[epoch=")) {
    if (ComposerHeader(text, &step)) return true;
  }
  return absl::StartsWith(text, "Train loss/train/total:") ||
         absl::StartsWith(text, "Train time/batch:");
}
}  // namespace trainwatch::logs
