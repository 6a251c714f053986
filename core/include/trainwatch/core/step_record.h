// The input of the rule engine: one step of one run, already reduced across
// ranks. A record is a view: it points at the caller's shard ids and names,
// tensor statistics and checkpoint uri, which must outlive the call that
// reads it.
//
// Every numeric signal is either present (the trainer reported it, possibly
// as NaN or Inf, which is itself a signal) or absent (unknown: never zero).

#ifndef TRAINWATCH_CORE_STEP_RECORD_H_
#define TRAINWATCH_CORE_STEP_RECORD_H_

#include <array>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace trainwatch::core {

enum class Signal : uint8_t {
  kLoss = 0,        // training loss of the batch, nats
  kGradNorm,        // global L2 norm of all gradients before clipping
  kLogZ,            // mean over tokens of logsumexp of the output logits
  kNanFrac,         // nonfinite gradient elements / all gradient elements
  kLearningRate,    // optimizer learning rate
  kZLossAlpha,      // z-loss coefficient in force (0 = off)
  kActivationMax,   // largest |activation| the trainer saw this step
  kAttentionLogitP99,  // max over layers of the per-layer p99 |attention logit|
};
inline constexpr int kNumSignals = 8;

// Bit for a signal in a presence mask.
constexpr uint32_t Bit(Signal s) { return 1u << static_cast<int>(s); }
// The five health metrics minus loss_ema_ratio, which the engine derives.
inline constexpr uint32_t kCoreSignals =
    Bit(Signal::kLoss) | Bit(Signal::kGradNorm) | Bit(Signal::kLogZ) |
    Bit(Signal::kNanFrac);

// Lower-case wire and file name of a signal ("loss", "grad_norm", ...).
absl::string_view SignalName(Signal s);

// Per-tensor gradient statistics, when the agent computes them; they name
// the source of a numerical failure.
struct TensorStat {
  absl::string_view name;
  double sum_squares = 0.0;
  int64_t nonfinite = 0;
  int64_t elements = 0;
};

// A step's gradient element counts: how many were nonfinite, of how many.
// The one encoding of "no counts" wherever a step is kept (the agent's slot,
// the wire report, the store row extend this): elements == 0, since a
// reported count always covers at least one element.
struct GradCounts {
  uint64_t nonfinite = 0;
  uint64_t elements = 0;  // 0: no counts
  bool has_counts() const { return elements > 0; }
};

// The numbers of one step: a value per signal and which of them are
// present. The one representation of a step's signals, wherever it is kept:
// the engine's input, the agent's history and queue, the store's rows.
class StepValues {
 public:
  StepValues& Set(Signal s, double v) {
    values_[static_cast<int>(s)] = v;
    present_ |= Bit(s);
    return *this;
  }
  void Clear(Signal s) { present_ &= ~Bit(s); }
  bool Has(Signal s) const { return (present_ & Bit(s)) != 0; }
  // NaN when absent; check Has() to tell "absent" from "reported NaN".
  double Get(Signal s) const {
    return Has(s) ? values_[static_cast<int>(s)]
                  : std::numeric_limits<double>::quiet_NaN();
  }
  uint32_t present() const { return present_; }

  // fp16 dynamic loss scaling (torch's GradScaler, Megatron, DeepSpeed): the
  // scale the step's loss was multiplied by, and whether the scaler found
  // inf/NaN in the gradients and so skipped the update (an overflow step).
  // Not a Signal: it is the scaler's state, not a health metric, and the
  // engine judges it apart (numerical_rule.cc). Absent for bf16 and fp32 runs,
  // which the engine judges as before.
  StepValues& SetLossScale(double scale, bool overflow) {
    loss_scale_ = scale;
    has_loss_scale_ = true;
    loss_scale_overflow_ = overflow;
    return *this;
  }
  void ClearLossScale() { has_loss_scale_ = loss_scale_overflow_ = false; }
  bool HasLossScale() const { return has_loss_scale_; }
  // NaN when absent.
  double loss_scale() const {
    return has_loss_scale_ ? loss_scale_ : std::numeric_limits<double>::quiet_NaN();
  }
  // False when absent.
  bool loss_scale_overflow() const { return has_loss_scale_ && loss_scale_overflow_; }

 private:
  std::array<double, kNumSignals> values_{};
  uint32_t present_ = 0;
  double loss_scale_ = 0.0;
  bool has_loss_scale_ = false;
  bool loss_scale_overflow_ = false;
};

// One step as every layer keeps it: its number, its signals and gradient
// counts, and the loss_ema_ratio the engine derived for it (NaN before the
// engine judged it, or when a report did not carry it). The engine's record,
// the agent's slot, the wire report and the store row are this plus what
// their layer adds, never a copy of its fields.
struct Step : StepValues, GradCounts {
  int64_t step = 0;
  double loss_ema_ratio = std::numeric_limits<double>::quiet_NaN();

  Step() = default;
  Step(int64_t step, const StepValues& values) : StepValues(values), step(step) {}
};

// The engine's input: a step and views of what came with it. Judge derives
// loss_ema_ratio itself and reports it in its outcome; the record's own is
// not read.
struct StepRecord : Step {
  // Shard ids of the batch (empty when the trainer does not say).
  absl::Span<const uint64_t> shards;
  // Shard names of the batch, for loaders that name their data with strings
  // (a webdataset url, "train-00012-of-01024.parquet:7"); beside `shards`,
  // not instead of it. Bounded by shard_names.h.
  absl::Span<const std::string> shard_names;
  // Non-empty on the steps where a checkpoint was saved.
  absl::string_view checkpoint_uri;
  // Optional per-tensor breakdown.
  absl::Span<const TensorStat> tensors;

  StepRecord() = default;
  StepRecord(int64_t step, const StepValues& values) : Step(step, values) {}
  explicit StepRecord(const Step& s) : Step(s) {}
};

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_STEP_RECORD_H_
