// Readers for the console logs of Python training frameworks, which print
// their metrics for people, not parsers: torchtitan's coloured step lines,
// Composer's ConsoleLogger blocks and NeMo's "Training epoch" lines and bars
// (Hugging Face Trainer's dicts: hf_trainer_log.cc). Like the other
// text readers, each reads its own metric lines, reads past everything else,
// and names line and column when a metric's value is not a number.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "framework_lines.h"
#include "trainwatch/logs/lines.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

// ---------------------------------------------------------------------------
// torchtitan

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

// ---------------------------------------------------------------------------
// Composer

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

// ---------------------------------------------------------------------------
// NeMo

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

std::unique_ptr<LineParser> NewTorchTitanParser(absl::string_view source) {
  return std::make_unique<TorchTitanParser>(source);
}
std::unique_ptr<LineParser> NewComposerParser(absl::string_view source) {
  return std::make_unique<ComposerParser>(source);
}
std::unique_ptr<LineParser> NewNemoParser(absl::string_view source) {
  return std::make_unique<NemoParser>(source);
}

bool IsNemoLine(absl::string_view line) {
  return (absl::StrContains(line, "Training epoch ") &&
          absl::StrContains(line, "reduced_train_loss:")) ||
         (absl::StrContains(line, "reduced_train_loss=") && absl::StrContains(line, "|"));
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
