// Every threshold of the rule engine. The defaults are the chapter's
// ("Stability Tricks in Large-Scale Training", 5.2.2) except where the
// chapter's literal rule contradicts its own worked examples; each such
// place says what was changed and why.
//
// Bounds. Every field has a largest value Validate accepts (`twctl replay
// --print-config` prints them all under "bounds"): step counts and spans
// 10,000,000, thresholds in nats, ratios and z-scores 1e6, fractions and
// z_loss_alpha_recommended 1, activation levels the largest float. The fields
// that size a run's windows are bounded tighter, so that no valid
// configuration costs one run's engine more than kRuleMemoryBudgetBytes
// (each line: the bound x the bytes each unit holds):
//   median_window_steps        500,000 x 32 B (a slot, its heap index) = 16.0 MB
//   logz_rise_window_steps     100,000 x 16 B (a sliding-min slot)     =  1.6 MB
//   logz_drift_window_steps    500,000 x 16 B                          =  8.0 MB
//   transient_baseline_records 100,000 x 64 B (two medians)            =  6.4 MB
//   transient_window_records   100,000 x 16 B                          =  1.6 MB
//   shard_history_steps *
//     max_shards_per_step      kMaxShardSlots (1,048,576) x 8 B       =  8.4 MB
//   shard_history_steps        100,000 x 16 B (its step entry)         =  1.6 MB
//   shard_name_history_bytes   8,388,608 B of names, each name also
//                              counting 32 B (its string) and each step
//                              with names 40 B (its entry)             =  8.4 MB
//   warn_logz_rising_steps /
//     logz_bucket_steps        kMaxLogzBuckets (10,000) x 40 B         =  0.4 MB
//   checkpoints_retained       1,000 x 40 B (and each uri's bytes)     =  0.04 MB
// about 53 MB in all; the other fields size nothing. (max_event_shards,
// 65,536, bounds one event's shard list, 512 KB.)

#ifndef TRAINWATCH_CORE_CONFIG_H_
#define TRAINWATCH_CORE_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace trainwatch::core {

struct RuleConfig {
  // ---- windows
  // loss_ema_ratio divides by an EMA of the loss over the previous 1,000
  // steps (the current step and nonfinite losses excluded).
  double ema_span_steps = 1000;
  // Tier 1 compares grad_norm with its median over the prior 5,000 steps.
  int64_t median_window_steps = 5000;
  // Short EMA used wherever a decision must not turn on one noisy step:
  // recovery, the log_z rise. 20 steps lag a trend by about 10 steps.
  double smoothing_span_steps = 20;

  // ---- warm-up: no skip and no decision of the baseline rules (tier 1, the
  // spike, the tier 2 pages that measure against the EMA) until all three
  // hold; tier 3 is never held back, a NaN is never benign, and the warm-up
  // rules below decide from the first record.
  // Early warnings need their own full histories and wait for them.
  int64_t warmup_steps = 1000;        // steps since the run's first record
  int64_t warmup_min_records = 20;    // loss records in the EMA
  int64_t warmup_min_grad_samples = 20;  // grad-norm samples in the median
  // ---- warm-up: what is decided before the baseline exists (docs/rules.md,
  // "Warm-up"). A divergence needs none: the loss at least
  // warmup_divergence_ratio times its lowest value so far, and at least
  // warmup_divergence_nats above it, for warmup_divergence_records records
  // in a row, pages (tier 2, non_recovering). The early fall of a healthy
  // run only lowers the minimum; one bad batch is a record, not a page. A
  // bad batch (the tier 1 trigger, against the EMA and the grad-norm median
  // of the records so far, once warmup_min_records and
  // warmup_min_grad_samples of them exist) is recorded (tier 0), not
  // skipped: the update is kept until the warm-up ends.
  double warmup_divergence_ratio = 2.0;
  double warmup_divergence_nats = 2.0;
  int64_t warmup_divergence_records = 3;

  // ---- windows counted in steps need records too: a log written every
  // 500 steps crosses 50 steps in two records (docs/rules.md, "Steps and
  // records"). A spike (spike_min_steps) and an escalation (escalate_steps)
  // also need this many loss records, and the short smoothing spans at
  // least as many.
  int64_t min_window_records = 3;
  // The EMAs (ema_span_steps) span at least this many records: 1,000 steps
  // of a log written every 500 would be two.
  double ema_min_span_records = 20;

  // ---- spike: loss >= spike_delta above its EMA for more than N steps
  double spike_delta_nats = 0.1;
  int64_t spike_min_steps = 50;
  // Up to this many records below the threshold inside a spike are noise:
  // they neither end the spike nor count toward its length.
  int64_t spike_gap_records = 2;

  // ---- transient: a short loss excursion (tier 0, recorded, never paged).
  // The mean of the last 8 loss records sits above the median of the 64
  // records before them by at least spike_delta and by transient_z times the
  // local noise (1.4826 x the median absolute deviation). Measured against
  // the local level, not the EMA: early in a run the 1,000-step EMA lags a
  // falling loss by more than a real excursion's height. It is what a run
  // without grad_norm can still say about a bad batch or two.
  int64_t transient_window_records = 8;
  int64_t transient_baseline_records = 64;
  double transient_z = 2.5;

  // ---- tier 1: data anomaly, skip and continue
  double tier1_grad_ratio = 3.0;   // grad_norm > 3 x median, one step
  double tier1_loss_ratio = 1.5;   // ... and loss_ema_ratio > 1.5, or:
  // The chapter's scenario 1 (2.41 -> 2.89, ratio 1.2) is tier 1 although
  // 1.2 < 1.5: a ratio is blind to scale (1.5 at loss 2.4 means +1.2 nats).
  // So the loss condition also holds for a jump that is both spike-sized
  // (>= spike_delta) and statistically clear of the run's own step-to-step
  // noise: >= tier1_loss_z standard deviations of (loss - EMA).
  double tier1_loss_z = 4.0;
  // Skip the optimizer update whenever loss_ema_ratio > 2.0 ...
  double skip_loss_ratio = 2.0;
  // ... and on the step a tier 1 anomaly fires (the chapter's "optionally
  // skip", which its scenario 1 does).
  bool tier1_skip_on_trigger = true;
  // Tier 1 is confirmed when, within 200 steps, the smoothed excess over the
  // pre-spike level has fallen to this fraction of its peak ("begins
  // returning toward the baseline").
  int64_t tier1_confirm_steps = 200;
  double tier1_confirm_fraction = 0.75;
  // An episode not recovered (smoothed loss back under pre-spike level +
  // spike_delta) this many steps after its onset escalates to tier 2; this is
  // also the "loss rises for more than 500 steps" rule.
  int64_t escalate_steps = 500;

  // ---- tier 2: page a human
  double tier2_loss_ratio = 2.5;
  // loss_ema_ratio > 2.5 pages only when it holds for this many consecutive
  // records: one catastrophic batch is tier 1 (skipped, recorded); a run of
  // them is a bad data range or a broken model.
  int64_t tier2_loss_ratio_records = 3;
  // The chapter's rule: log_z rose by more than 3 within 300 steps.
  double logz_rise = 3.0;
  int64_t logz_rise_window_steps = 300;
  // The chapter's scenario 2 rises 11.9 -> 15.2 in 500 steps (at most ~2 per
  // 300 steps) yet is diagnosed tier 2 by step 58,500. So the same rise over
  // a longer window (the scenario's own 1,500 steps) also pages, but only
  // when corroborated by a confirmed loss spike. A benign slow drift (the
  // chapter's 5 -> 18 over 200k steps) moves ~0.1 per 1,500 steps, and noise
  // alone does not keep the loss 0.1 nats up for 50 steps.
  int64_t logz_drift_window_steps = 1500;
  // log_z "led" an episode when it had risen by at least this much since its
  // recent minimum before the loss moved; then z-loss is recommended.
  double logz_led_min_rise = 1.0;
  // Where a log_z rise began: the end of the last 100-step bucket whose mean
  // was within this tolerance of the minimum bucket over the prior 5,000.
  double logz_onset_tolerance = 0.5;
  int64_t logz_bucket_steps = 100;
  double z_loss_alpha_recommended = 1e-4;  // PaLM's

  // ---- tier 3: numerical failure, halt
  // loss above this without a grad-norm explanation (grad_norm not above
  // tier1_grad_ratio x median) and above tier1_loss_ratio x EMA.
  double tier3_loss_nats = 10.0;
  // A tier 3 episode ends after this many clean steps in a row.
  int64_t tier3_clear_steps = 100;
  // A language model's loss, its cross-entropy in nats, starts near
  // ln(vocab_size) (an untrained model's uniform guess) and falls. A loss
  // above tier3_vocab_factor x ln(vocab_size) is no value training reaches
  // short of a numerical failure: tier 3 from the first record, no baseline
  // needed. Only when the vocabulary is known: vocab_size 0 is unknown, and
  // the rule is off. The healthy runs in tests/data start at most 1.05x
  // ln(vocab) (docs/rules.md).
  int64_t vocab_size = 0;
  double tier3_vocab_factor = 3.0;

  // ---- fp16 dynamic loss scaling (records with a loss scale only;
  // StepValues::SetLossScale). An overflow step (the scaler found inf in the
  // gradients and skipped the update) is tier 0: recorded, counted, never a
  // halt, and it feeds no window (its grad_norm is inf). A nonfinite loss
  // still halts. Tier 3 when the scaler cannot recover:
  // - this many overflow steps in a row. Megatron-LM starts at
  //   initial_loss_scale 2^32 and, with hysteresis 2 and backoff 0.5, needs
  //   2 overflows per halving: 64 in a row take it from 2^32 to its
  //   min_loss_scale of 1.0, the longest start-up descent a healthy run
  //   makes (DeepSpeed from 2^16, hysteresis 2: 32; torch's GradScaler from
  //   2^16, no hysteresis: 16). 0 turns this rule off.
  int64_t loss_scale_max_overflow_steps = 64;
  // - the scale below this. Megatron's min_loss_scale is 1.0 and DeepSpeed's
  //   min_loss_scale defaults to 1 (it stops the run when an overflow comes
  //   at that minimum); torch's GradScaler has no minimum and keeps halving,
  //   so a scale under 1 means the fp16 gradients no longer fit even
  //   unscaled. 0 turns this rule off.
  double loss_scale_floor = 1.0;

  // ---- early warnings (alerts, not pages)
  double warn_logz_level = 12.0;         // log_z above this ...
  int64_t warn_logz_rising_steps = 5000;  // ... and rising for this long:
  // five equal segments, each mean above the one before by at least a fifth
  // of this (0.05 per 1,000 steps; the chapter's drift of 5 -> 18 over 200k
  // steps is 0.065), so in all at least:
  double warn_logz_min_rise = 0.25;
  // grad-norm median rising steadily, e.g. 1.0 -> 3.0 over 10,000 steps:
  int64_t warn_grad_median_window_steps = 10000;
  double warn_grad_median_factor = 2.0;
  double warn_grad_median_steady_fraction = 0.8;  // of 1,000-step increments
  // attention-logit p99 rising without plateau over 5,000 steps, by at least:
  double warn_attention_min_rise_fraction = 0.1;
  // activation max trending toward the overflow region: above the floor and
  // on course (linear, last 5,000 steps) to reach the target in the horizon.
  double warn_activation_floor = 1e3;
  double warn_activation_target = 1e4;
  int64_t warn_activation_horizon_steps = 10000;

  // ---- checkpoints and shards
  int64_t checkpoints_retained = 10;  // the last 10 reported
  int64_t shard_history_steps = 1024;
  int64_t max_shards_per_step = 16;
  int64_t max_event_shards = 256;
  // Shard names (StepRecord::shard_names) of the last shard_history_steps
  // steps are kept within this many bytes, the oldest steps' names dropped
  // first (an event that wanted them says shards_truncated). A name counts
  // its bytes plus 32, a step with names 40 more; see "Bounds" above.
  int64_t shard_name_history_bytes = 1 << 20;
  // Shards of this many steps before the onset go with an event too.
  int64_t shard_steps_before_onset = 2;
};

// What one run's rule engine may hold at most for any valid configuration
// (RuleEngine::MemoryBytes(), checkpoint uris aside): see "Bounds" above.
inline constexpr int64_t kRuleMemoryBudgetBytes = int64_t{64} << 20;
// The shard-id slots a run keeps: shard_history_steps * max_shards_per_step.
inline constexpr int64_t kMaxShardSlots = int64_t{1} << 20;
// The log_z buckets a run keeps: warn_logz_rising_steps / logz_bucket_steps.
inline constexpr int64_t kMaxLogzBuckets = 10'000;

// Checks ranges, bounds and relations (positive windows, ordered
// thresholds). An out-of-bound value is an error naming the field, the value
// and the bound.
absl::Status Validate(const RuleConfig& config);

// Reads a JSON object whose keys are RuleConfig's field names; keys not
// given keep their defaults, unknown keys are an error. A "bounds" object
// (what RuleConfigToJson prints) is read past, so printed output reads back. `source` names the
// input in error messages ("thresholds.json").
absl::StatusOr<RuleConfig> ParseRuleConfigJson(absl::string_view json,
                                               absl::string_view source);

// Every field as JSON, for `twctl replay --print-config`, followed by a
// "bounds" object: each field's largest value, the two products bounded
// together, and kRuleMemoryBudgetBytes.
std::string RuleConfigToJson(const RuleConfig& config);

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_CONFIG_H_
