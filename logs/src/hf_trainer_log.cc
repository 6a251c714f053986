// Hugging Face Trainer's stdout (kHfTrainer).
//
// Trainer's on_log writes str(logs) through tqdm.write (ProgressCallback:
// the bar is cleared, the dict printed, the bar drawn again) or print()
// (PrinterCallback, no bars). A train log has 'loss'; eval dicts
// ('eval_loss') and the summary ('train_runtime', 'train_loss') do not.
//
// A dict never names its step. Two things say it:
// - The training bar's N: how many optimizer steps were done when it was
//   drawn. tqdm redraws at most every 0.1 s, so a bar drawn before a dict
//   may be older than the dict; the redraw right after a dict shows its
//   step exactly. Where stdout and stderr share a file, the bars may reach
//   it only every few hundred steps.
// - logging_steps S (--logging-steps, or learned from the bars): dicts come
//   every S steps, so the dicts between two bars are spread by S.
// Where they disagree the bar wins, with a note: it counts what was done.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "reader_helpers.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

// Dicts waiting for a bar to place them, at most: beyond it the log has
// neither bars nor a known logging_steps, and says so.
constexpr size_t kMaxHeld = 4096;
// Disagreements noted one by one; the rest are counted in the last note.
constexpr int kMaxNotes = 5;

class HfTrainerParser : public LineParser {
 public:
  HfTrainerParser(absl::string_view source, int64_t logging_steps)
      : source_(source), spread_(logging_steps) {}

  absl::Status Line(absl::string_view line, int n, TraceBuilder& b) override {
    const absl::string_view dict = DictSegment(line);
    if (line.find('|') != absl::string_view::npos) {
      // The bars drawn on an eval dict's line are the evaluation's.
      const bool eval_line = absl::StrContains(dict, "'eval_");
      for (absl::string_view seg : absl::StrSplit(line, '\r')) {
        int64_t step, total;
        if (!TqdmBar(seg, &step, &total)) continue;
        // The training bar's total is max_steps; evaluation's bars count
        // batches of the eval set, not steps.
        if (bar_total_ < 0 && !eval_line) bar_total_ = total;
        if (total != bar_total_) continue;
        bar_step_ = step;
        bar_fresh_ = true;
        if (!held_.empty()) {
          if (absl::Status s = PlaceHeld(step, b); !s.ok()) return s;
        }
      }
    }
    if (dict.empty()) return absl::OkStatus();
    if (!PythonDict(dict, &entries_)) return absl::OkStatus();  // not one whole dict
    Values v;
    bool loss = false;
    for (const DictEntry& e : entries_) {
      // A train log's loss is 'loss' (the summary's 'train_loss' is the
      // run's mean); its other keys are read by the table every keyed
      // format shares.
      Signal sig;
      if (e.key == "loss") {
        sig = Signal::kLoss;
        loss = true;
      } else if (!SignalByAlias(absl::AsciiStrToLower(e.key), &sig) || sig == Signal::kLoss) {
        continue;
      }
      double value;
      if (!PythonNumber(e.value, &value)) {
        return At(source_, n, ColumnOf(line, e.value),
                  absl::StrCat(e.key, " \"", e.value, "\" is not a number"));
      }
      v.values.Set(sig, value);
    }
    if (!loss) return absl::OkStatus();  // eval, summary, or another callback's dict
    v.line = n;
    v.column = ColumnOf(line, dict);
    return Dict(v, b);
  }

  absl::Status Flush(TraceBuilder& b) override {
    std::vector<Values> held = std::move(held_);
    held_.clear();
    if (!held.empty() && bar_total_ < 0 && spread_ <= 0) {
      return At(source_, held.front().line, held.front().column,
                "a Hugging Face Trainer loss line with no progress bar in the log: its step is "
                "unknown; give --logging-steps N (the run's logging_steps)");
    }
    // No bar came after them: spread from the last dict placed.
    for (const Values& v : held) {
      if (absl::Status s = Place(v, Base() + std::max<int64_t>(1, spread_), b); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status End(const TraceBuilder& b) override {
    return NoRecords(b, source_, "Hugging Face Trainer \"{'loss': ...}\"");
  }

  int64_t Position() const override { return bar_total_ >= 0 ? bar_step_ : -1; }

 private:
  struct Values {
    core::StepValues values;
    int line = 0, column = 1;
  };

  int64_t Base() const { return last_ < 0 ? 0 : last_; }

  absl::Status Dict(const Values& v, TraceBuilder& b) {
    if (bar_fresh_) {
      bar_fresh_ = false;
      const int64_t bar = bar_step_;
      // The first dict, or the bar went back: a restarted job's first.
      if ((last_ < 0 && bar > 0) || bar < last_) return Place(v, bar, b);
      if (bar > last_ && last_ >= 0) {
        if (spread_ <= 0 || bar > last_ + spread_) {
          if (spread_ > 0) {
            Note(v, absl::StrFormat("the progress bar says step %d where logging every %d steps "
                                    "puts this loss line at step %d: the bar's step is taken",
                                    bar, spread_, last_ + spread_),
                 b);
          }
          return Place(v, bar, b);
        }
        // A bar drawn between two logging steps: the dict is at the next.
        return Place(v, last_ + spread_, b);
      }
      // bar == last_: the redraw after the last dict; this one is later.
    }
    if (spread_ > 0) return Place(v, Base() + spread_, b);
    if (held_.size() >= kMaxHeld) {
      const Values first = held_.front();
      held_.clear();  // reported: a follower reads on
      return At(source_, first.line, first.column,
                absl::StrFormat("%d Hugging Face Trainer loss lines from here on without a "
                                "progress bar after them: their steps are unknown; give "
                                "--logging-steps N (the run's logging_steps)",
                                kMaxHeld + 1));
    }
    held_.push_back(v);  // the next bar, drawn after them, places them
    return absl::OkStatus();
  }

  // The dicts held since the last placed one end at `bar`, the redraw after
  // the last of them: spread evenly back from it. An even spread is the
  // run's logging_steps, learned.
  absl::Status PlaceHeld(int64_t bar, TraceBuilder& b) {
    std::vector<Values> held = std::move(held_);
    held_.clear();
    bar_fresh_ = false;
    const int64_t base = Base();
    const auto k = static_cast<int64_t>(held.size());
    int64_t step = bar - base;
    if (bar > base && (bar - base) % k == 0) {
      step = (bar - base) / k;
      if (k > 1) spread_ = step;  // more dicts than one per bar: the run's logging_steps
    } else if (k > 1) {
      step = std::max<int64_t>(1, (bar - base) / k);
      Note(held.back(),
           absl::StrFormat("%d loss lines end at the progress bar's step %d, which steps %d to "
                           "%d do not divide evenly: spread %d steps apart, the last at the "
                           "bar's step",
                           k, bar, base, bar, step),
           b);
    }
    for (int64_t i = 0; i < k; ++i) {
      const int64_t at = i + 1 == k ? bar : base + (i + 1) * step;
      if (absl::Status s = Place(held[i], at, b); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // The bar and the count disagree: a note, not an error (the bar wins).
  void Note(const Values& v, absl::string_view what, TraceBuilder& b) {
    if (++notes_ > kMaxNotes) return;
    b.AddWarning(absl::StrFormat("%s:%d: %s%s", source_, v.line, what,
                                 notes_ == kMaxNotes ? " (further ones are not noted)" : ""));
  }

  absl::Status Place(const Values& v, int64_t step, TraceBuilder& b) {
    auto& row = b.NewRow(v.line);
    if (absl::Status s = b.SetStep(row, step, v.column); !s.ok()) return s;
    for (int i = 0; i < core::kNumSignals; ++i) {
      const Signal sig = static_cast<Signal>(i);
      if (v.values.Has(sig)) b.SetValue(row, sig, v.values.Get(sig));
    }
    last_ = step;
    return absl::OkStatus();
  }

  absl::string_view source_;
  int64_t spread_;  // logging_steps: given, learned, or 0 (unknown)
  std::vector<DictEntry> entries_;
  int64_t bar_total_ = -1;  // the training bar's total, once one is seen
  int64_t bar_step_ = -1;
  bool bar_fresh_ = false;  // a training bar drawn since the last dict
  int64_t last_ = -1;       // the step of the last dict placed
  std::vector<Values> held_;
  int notes_ = 0;
};

}  // namespace

bool IsHfTrainerLine(absl::string_view line) {
  // A dict with a train, eval or summary key.
  const absl::string_view dict = DictSegment(line);
  return !dict.empty() &&
         (absl::StrContains(dict, "'loss': ") || absl::StrContains(dict, "'eval_loss': ") ||
          absl::StrContains(dict, "'train_runtime': "));
}

std::unique_ptr<LineParser> NewHfTrainerParser(absl::string_view source, int64_t logging_steps) {
  return std::make_unique<HfTrainerParser>(source, logging_steps);
}

}  // namespace trainwatch::logs
