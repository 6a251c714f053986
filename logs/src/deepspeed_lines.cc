// DeepSpeed's fp16 loss-scaler lines, read inside a trainer's log.
//
// DeepSpeed's DynamicLossScaler prints, on rank 0,
//   [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: S, reducing to S'
//   [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: S, but hysteresis is H.
//       Reducing hysteresis to H-1
// ("[deepscale]" in older releases, S as "65536" or "65536.0"), raises
//   Exception: Current loss scale already at minimum - cannot decrease scale anymore.
// when an overflow comes at its minimum scale, and the engine logs
//   [Rank 0] step=N, skipped=K, lr=[...], mom=[...]
// every steps_per_print steps. None of the first three names its step, and
// they share physical lines with a trainer's output (a tqdm bar written with
// '\r' ends where DeepSpeed's message begins). So the trainer's reader reads
// each line first, through a builder of this layer's own, and this layer
// then places an overflow at the step after the last one the log named:
// the trainer's last record or progress position (LineParser::Position),
// step=N, or the overflow before it. The newest DeepSpeed step is held until
// a later line shows no trainer's record of that step is coming, so that a
// trainer's record at the step (a Hugging Face loss logged at the step that
// overflowed) is one record carrying both.

#include <limits>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "trainwatch/logs/lines.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

constexpr absl::string_view kOverflow = "OVERFLOW! Rank";
constexpr absl::string_view kAttempted = "Attempted loss scale:";
constexpr absl::string_view kAtMinimum = "Current loss scale already at minimum";
constexpr absl::string_view kStepEq = "step=";
constexpr absl::string_view kSkipped = ", skipped=";

// The number that starts `text` after any spaces, up to a ',', ']' or space.
absl::string_view NumberAt(absl::string_view text, size_t* begin) {
  size_t i = 0;
  while (i < text.size() && text[i] == ' ') ++i;
  *begin = i;
  size_t end = i;
  while (end < text.size() && text[end] != ',' && text[end] != ']' && text[end] != ' ') ++end;
  return text.substr(i, end - i);
}

// Where "step=N, skipped=" starts in `line` (N: its digits), else npos.
size_t StepLineAt(absl::string_view line, absl::string_view* digits) {
  for (size_t at = line.find(kStepEq); at != absl::string_view::npos;
       at = line.find(kStepEq, at + 1)) {
    if (at > 0 && line[at - 1] != ' ' && line[at - 1] != ']') continue;  // global_step=
    size_t i = at + kStepEq.size();
    const size_t begin = i;
    while (i < line.size() && absl::ascii_isdigit(static_cast<unsigned char>(line[i]))) ++i;
    if (i == begin || line.substr(i, kSkipped.size()) != kSkipped) continue;
    *digits = line.substr(begin, i - begin);
    return at;
  }
  return absl::string_view::npos;
}

class DeepSpeedLayer : public LineParser {
 public:
  DeepSpeedLayer(absl::string_view source, std::unique_ptr<LineParser> trainer)
      : source_(source), trainer_(std::move(trainer)), scratch_(source) {}

  absl::Status Line(absl::string_view line, int n, TraceBuilder& b) override {
    if (trainer_ != nullptr) {
      if (absl::Status s = trainer_->Line(line, n, scratch_); !s.ok()) {
        scratch_.Drop();
        return s;
      }
      if (absl::Status s = TakeTrainerRows(b); !s.ok()) return s;
      const int64_t pos = trainer_->Position();
      if (pos >= 0 && pos != trainer_position_) {
        trainer_position_ = pos;
        Anchor(pos);
      }
    }
    if (const size_t at = line.find(kOverflow); at != absl::string_view::npos) {
      const size_t scale_at = line.find(kAttempted, at);
      // Without "Attempted loss scale" (not fp16) the line says nothing
      // about the scale: read past.
      if (scale_at == absl::string_view::npos) return absl::OkStatus();
      size_t begin;
      const absl::string_view text = line.substr(scale_at + kAttempted.size());
      const absl::string_view number = NumberAt(text, &begin);
      double scale;
      if (!ParseDouble(number, &scale) || scale < 0) {
        return At(source_, n, static_cast<int>(number.data() - line.data()) + 1,
                  absl::StrCat("loss scale \"", number, "\" is not a number >= 0"));
      }
      return Place(n, scale, /*at_minimum=*/false, b);
    }
    if (absl::StrContains(line, kAtMinimum)) {
      // Every rank raises it: one failure, whichever ranks print it.
      if (pending_.has && pending_.at_minimum && placed_ > 0) return absl::OkStatus();
      return Place(n, 0.0, /*at_minimum=*/true, b);
    }
    absl::string_view digits;
    if (const size_t at = StepLineAt(line, &digits); at != absl::string_view::npos) {
      int64_t step;
      if (!ParseInt64(digits, &step)) {
        return At(source_, n, static_cast<int>(at + kStepEq.size()) + 1,
                  "step number out of range");
      }
      if (trainer_ != nullptr) {
        // The trainer's lines are the records; DeepSpeed's count only tells
        // where its next overflow falls.
        Anchor(step);
        return absl::OkStatus();
      }
      bool has_lr = false;
      double lr = 0;
      if (const size_t lr_at = line.find("lr=[", at); lr_at != absl::string_view::npos) {
        size_t begin;
        const absl::string_view number = NumberAt(line.substr(lr_at + 4), &begin);
        if (!ParseDouble(number, &lr)) {
          return At(source_, n, static_cast<int>(number.data() - line.data()) + 1,
                    absl::StrCat("lr \"", number, "\" is not a number"));
        }
        has_lr = true;
      }
      if (pending_.has && pending_.step >= step && step > b.last_step()) {
        pending_.step = step;  // the overflows ran ahead of DeepSpeed's own count
      } else if (absl::Status s = Commit(b); !s.ok()) {
        return s;
      }
      if (!pending_.has) pending_ = Pending{true, step, n};
      if (has_lr) {
        pending_.has_lr = true;
        pending_.lr = lr;
      }
      Anchor(step);
    }
    return absl::OkStatus();
  }

  absl::Status Flush(TraceBuilder& b) override {
    if (trainer_ != nullptr) {
      if (absl::Status s = trainer_->Flush(scratch_); !s.ok()) return s;
      if (absl::Status s = TakeTrainerRows(b); !s.ok()) return s;
    }
    return Commit(b);
  }

  absl::Status Idle(TraceBuilder& b) override {
    if (trainer_ == nullptr) return absl::OkStatus();
    if (absl::Status s = trainer_->Idle(scratch_); !s.ok()) {
      scratch_.Drop();
      return s;
    }
    return TakeTrainerRows(b);
  }

  absl::Status End(const TraceBuilder& b) override {
    if (trainer_ != nullptr) return trainer_->End(b);
    if (b.rows() > 0) return absl::OkStatus();
    return At(source_, 1, 1,
              "no DeepSpeed loss-scale lines (OVERFLOW!, step=N, skipped=K): nothing to replay");
  }

  int64_t Position() const override { return anchor_ + placed_; }

 private:
  // The DeepSpeed step not yet added: a later trainer's record of the same
  // step carries it.
  struct Pending {
    bool has = false;
    int64_t step = 0;
    int line = 0;
    bool has_scale = false;
    double scale = 0;
    bool at_minimum = false;
    bool has_lr = false;
    double lr = 0;
  };

  void Anchor(int64_t step) {
    anchor_ = step;
    placed_ = 0;
  }

  // An overflow (or the failure at the minimum scale) at the step after the
  // last one the log named.
  absl::Status Place(int line, double scale, bool at_minimum, TraceBuilder& b) {
    const int64_t step = anchor_ + placed_ + 1;
    ++placed_;
    if (pending_.has && pending_.step != step) {
      if (absl::Status s = Commit(b); !s.ok()) return s;
    }
    if (!pending_.has) pending_ = Pending{true, step, line};
    pending_.has_scale = true;
    pending_.scale = scale;
    pending_.at_minimum = at_minimum;
    return absl::OkStatus();
  }

  void Apply(const Pending& p, TraceBuilder::Row& r, TraceBuilder& b) {
    // An overflow skipped the update; at the minimum the scaler has no scale
    // left, which the loss_scale_floor rule judges.
    if (p.has_scale) b.SetLossScale(r, p.scale, /*overflow=*/true);
    if (p.has_lr && !(r.present & core::Bit(Signal::kLearningRate))) {
      b.SetValue(r, Signal::kLearningRate, p.lr);
    }
  }

  absl::Status Commit(TraceBuilder& b) {
    if (!pending_.has) return absl::OkStatus();
    const Pending p = pending_;
    pending_ = Pending();
    auto& row = b.NewRow(p.line);
    if (absl::Status s = b.SetStep(row, p.step, 1); !s.ok()) return s;
    Apply(p, row, b);
    return absl::OkStatus();
  }

  // The trainer's records of this line, in order, each carrying the held
  // DeepSpeed step when it is theirs.
  absl::Status TakeTrainerRows(TraceBuilder& b) {
    absl::Status status;
    scratch_.Drain([&](const core::StepRecord& rec, int line) {
      if (!status.ok()) return;
      // A held step before this record, or a log going back (a restart):
      // the held step is a record of its own, before this one. Else it is at
      // or after this record's step, which the log names, so it is this one.
      if (pending_.has && (pending_.step < rec.step || rec.step <= b.last_step())) {
        status = Commit(b);
        if (!status.ok()) return;
      }
      TraceBuilder::Row* row;
      status = b.AddRecord(rec, line, &row);
      if (!status.ok()) return;
      if (pending_.has) {
        Apply(pending_, *row, b);
        pending_ = Pending();
      }
      Anchor(rec.step);
    });
    for (std::string& w : scratch_.TakeWarnings()) b.AddWarning(std::move(w));
    return status;
  }

  absl::string_view source_;
  std::unique_ptr<LineParser> trainer_;
  TraceBuilder scratch_;  // the trainer's rows of the current line
  int64_t trainer_position_ = -1;
  int64_t anchor_ = 0;  // the last step the log named
  int64_t placed_ = 0;  // overflows placed after it
  Pending pending_;
};

}  // namespace

bool IsDeepSpeedLine(absl::string_view line) {
  absl::string_view digits;
  return (absl::StrContains(line, kOverflow) && absl::StrContains(line, kAttempted)) ||
         absl::StrContains(line, kAtMinimum) ||
         StepLineAt(line, &digits) != absl::string_view::npos;
}

std::unique_ptr<LineParser> NewDeepSpeedLayer(absl::string_view source,
                                              std::unique_ptr<LineParser> trainer) {
  return std::make_unique<DeepSpeedLayer>(source, std::move(trainer));
}

}  // namespace trainwatch::logs
