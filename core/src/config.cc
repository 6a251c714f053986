#include "trainwatch/core/config.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainwatch/core/json.h"

namespace trainwatch::core {

namespace {

// The bounds' units. Step counts and spans: 10,000,000 steps, longer than
// any run a window would need to look back over. Thresholds in nats, ratios
// and z-scores: 1e6, past which a rule can never fire. Activation levels: the
// largest float, the most an fp32 or bf16 tensor can hold.
constexpr double kMaxSteps = 10'000'000;
constexpr double kMaxLevel = 1e6;
constexpr double kMaxActivation = std::numeric_limits<float>::max();

// One row per configurable field: its file name, where it lives, and the
// largest value Validate accepts (the windows' bounds keep a run's engine
// under kRuleMemoryBudgetBytes; see config.h). Exactly one of the member
// pointers is set; a bool has no bound.
struct Field {
  const char* name;
  double RuleConfig::*d = nullptr;
  int64_t RuleConfig::*i = nullptr;
  bool RuleConfig::*b = nullptr;
  double max = 0;
};

#define TW_D(f, max) Field{#f, &RuleConfig::f, nullptr, nullptr, max}
#define TW_I(f, max) Field{#f, nullptr, &RuleConfig::f, nullptr, max}
#define TW_B(f) Field{#f, nullptr, nullptr, &RuleConfig::f}

const Field kFields[] = {
    TW_D(ema_span_steps, kMaxSteps),
    TW_I(median_window_steps, 500'000),
    TW_D(smoothing_span_steps, kMaxSteps),
    TW_I(warmup_steps, kMaxSteps),
    TW_I(warmup_min_records, kMaxSteps),
    TW_I(warmup_min_grad_samples, kMaxSteps),
    TW_D(warmup_divergence_ratio, kMaxLevel),
    TW_D(warmup_divergence_nats, kMaxLevel),
    TW_I(warmup_divergence_records, kMaxSteps),
    TW_I(min_window_records, kMaxSteps),
    TW_D(ema_min_span_records, kMaxSteps),
    TW_D(spike_delta_nats, kMaxLevel),
    TW_I(spike_min_steps, kMaxSteps),
    TW_I(spike_gap_records, kMaxSteps),
    TW_I(transient_window_records, 100'000),
    TW_I(transient_baseline_records, 100'000),
    TW_D(transient_z, kMaxLevel),
    TW_D(tier1_grad_ratio, kMaxLevel),
    TW_D(tier1_loss_ratio, kMaxLevel),
    TW_D(tier1_loss_z, kMaxLevel),
    TW_D(skip_loss_ratio, kMaxLevel),
    TW_B(tier1_skip_on_trigger),
    TW_I(tier1_confirm_steps, kMaxSteps),
    TW_D(tier1_confirm_fraction, 1.0),
    TW_I(escalate_steps, kMaxSteps),
    TW_D(tier2_loss_ratio, kMaxLevel),
    TW_I(tier2_loss_ratio_records, kMaxSteps),
    TW_D(logz_rise, kMaxLevel),
    TW_I(logz_rise_window_steps, 100'000),
    TW_I(logz_drift_window_steps, 500'000),
    TW_D(logz_led_min_rise, kMaxLevel),
    TW_D(logz_onset_tolerance, kMaxLevel),
    TW_I(logz_bucket_steps, kMaxSteps),
    TW_D(z_loss_alpha_recommended, 1.0),
    TW_D(tier3_loss_nats, kMaxLevel),
    TW_I(tier3_clear_steps, kMaxSteps),
    TW_I(vocab_size, 1e9),
    TW_D(tier3_vocab_factor, kMaxLevel),
    TW_I(loss_scale_max_overflow_steps, kMaxSteps),
    TW_D(loss_scale_floor, kMaxActivation),
    TW_D(warn_logz_level, kMaxLevel),
    TW_I(warn_logz_rising_steps, kMaxSteps),
    TW_D(warn_logz_min_rise, kMaxLevel),
    TW_I(warn_grad_median_window_steps, kMaxSteps),
    TW_D(warn_grad_median_factor, kMaxLevel),
    TW_D(warn_grad_median_steady_fraction, 1.0),
    TW_D(warn_attention_min_rise_fraction, kMaxLevel),
    TW_D(warn_activation_floor, kMaxActivation),
    TW_D(warn_activation_target, kMaxActivation),
    TW_I(warn_activation_horizon_steps, kMaxSteps),
    TW_I(checkpoints_retained, 1'000),
    TW_I(shard_history_steps, 100'000),
    TW_I(max_shards_per_step, 65'536),
    TW_I(max_event_shards, 65'536),
    TW_I(shard_name_history_bytes, 8'388'608),
    TW_I(shard_steps_before_onset, 100'000),
};

#undef TW_D
#undef TW_I
#undef TW_B

constexpr const char kBoundsKey[] = "bounds";

}  // namespace

absl::Status Validate(const RuleConfig& c) {
  for (const Field& f : kFields) {
    if (f.d != nullptr && !(std::isfinite(c.*f.d) && c.*f.d >= 0.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.name, " must be a finite number >= 0, not ", c.*f.d));
    }
    if (f.i != nullptr && c.*f.i < 0) {
      return absl::InvalidArgumentError(absl::StrCat(f.name, " must be >= 0, not ", c.*f.i));
    }
    const double v = f.d != nullptr ? c.*f.d : f.i != nullptr ? double(c.*f.i) : 0.0;
    if (f.b == nullptr && v > f.max) {
      // %.15g: whole numbers in full (1e8 as 100000000), as a file would say them.
      return absl::InvalidArgumentError(absl::StrCat(
          f.name, " = ", f.d != nullptr ? absl::StrFormat("%.15g", c.*f.d) : absl::StrCat(c.*f.i),
          " is above its bound ", absl::StrFormat("%.15g", f.max)));
    }
  }
  auto positive = [](absl::string_view name, double v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(name, " must be > 0"));
  };
  for (auto [name, v] : {std::pair<const char*, double>{"ema_span_steps", c.ema_span_steps},
                         {"smoothing_span_steps", c.smoothing_span_steps},
                         {"median_window_steps", double(c.median_window_steps)},
                         {"logz_rise_window_steps", double(c.logz_rise_window_steps)},
                         {"logz_drift_window_steps", double(c.logz_drift_window_steps)},
                         {"logz_bucket_steps", double(c.logz_bucket_steps)},
                         {"checkpoints_retained", double(c.checkpoints_retained)},
                         {"shard_history_steps", double(c.shard_history_steps)},
                         {"max_shards_per_step", double(c.max_shards_per_step)},
                         {"tier1_grad_ratio", c.tier1_grad_ratio},
                         {"spike_delta_nats", c.spike_delta_nats},
                         {"transient_window_records", double(c.transient_window_records)},
                         {"transient_baseline_records",
                          double(c.transient_baseline_records)}}) {
    if (absl::Status s = positive(name, v); !s.ok()) return s;
  }
  // Both factors are bounded above, so neither product overflows.
  if (const int64_t slots = c.shard_history_steps * c.max_shards_per_step;
      slots > kMaxShardSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard_history_steps * max_shards_per_step = ", slots,
                     " is above its bound ", kMaxShardSlots));
  }
  if (const int64_t buckets = c.warn_logz_rising_steps / c.logz_bucket_steps;
      buckets > kMaxLogzBuckets) {
    return absl::InvalidArgumentError(
        absl::StrCat("warn_logz_rising_steps / logz_bucket_steps = ", buckets,
                     " is above its bound ", kMaxLogzBuckets));
  }
  if (c.warn_logz_rising_steps < 5 * c.logz_bucket_steps) {
    return absl::InvalidArgumentError(
        "warn_logz_rising_steps must span at least five log_z buckets "
        "(5 * logz_bucket_steps)");
  }
  if (c.warn_grad_median_window_steps < 10) {
    return absl::InvalidArgumentError("warn_grad_median_window_steps must be >= 10");
  }
  if (c.skip_loss_ratio > c.tier2_loss_ratio) {
    return absl::InvalidArgumentError(
        "skip_loss_ratio must not exceed tier2_loss_ratio: a step that pages must "
        "also have its update skipped");
  }
  if (c.tier1_confirm_fraction > 1.0 || c.warn_grad_median_steady_fraction > 1.0) {
    return absl::InvalidArgumentError("fractions must lie in [0, 1]");
  }
  return absl::OkStatus();
}

absl::StatusOr<RuleConfig> ParseRuleConfigJson(absl::string_view json,
                                               absl::string_view source) {
  absl::StatusOr<JsonValue> doc = ParseJson(json, source);
  if (!doc.ok()) return doc.status();
  if (doc->type != JsonValue::Type::kObject) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s:%d:%d: the configuration must be a JSON object", source, doc->line, doc->column));
  }
  RuleConfig c;
  for (const auto& [key, v] : doc->object) {
    // What RuleConfigToJson prints for the reader of the file, not a setting.
    if (key == kBoundsKey && v.type == JsonValue::Type::kObject) continue;
    const Field* field = nullptr;
    for (const Field& f : kFields) {
      if (key == f.name) field = &f;
    }
    auto where = [&, &v = v] { return absl::StrFormat("%s:%d:%d: ", source, v.line, v.column); };
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "unknown setting \"", key, "\""));
    }
    if (field->b != nullptr) {
      if (v.type != JsonValue::Type::kBool) {
        return absl::InvalidArgumentError(absl::StrCat(where(), key, " must be true or false"));
      }
      c.*field->b = v.boolean;
      continue;
    }
    if (v.type != JsonValue::Type::kNumber || !std::isfinite(v.number)) {
      return absl::InvalidArgumentError(absl::StrCat(where(), key, " must be a finite number"));
    }
    if (field->d != nullptr) {
      c.*field->d = v.number;
    } else {
      if (v.number != std::floor(v.number) || std::fabs(v.number) > 9.0e15) {
        return absl::InvalidArgumentError(absl::StrCat(where(), key, " must be an integer"));
      }
      c.*field->i = static_cast<int64_t>(v.number);
    }
  }
  if (absl::Status s = Validate(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return c;
}

std::string RuleConfigToJson(const RuleConfig& c) {
  std::string out = "{";
  for (const Field& f : kFields) {
    absl::StrAppend(&out, "\n  ");
    AppendJsonString(&out, f.name);
    out += ": ";
    if (f.d != nullptr) {
      AppendJsonNumber(&out, c.*f.d);
    } else if (f.i != nullptr) {
      absl::StrAppend(&out, c.*f.i);
    } else {
      out += c.*f.b ? "true" : "false";
    }
    out += ",";
  }
  // The bounds, last, as one object: what Validate accepts, one line each.
  absl::StrAppend(&out, "\n  \"", kBoundsKey, "\": {");
  for (const Field& f : kFields) {
    if (f.b != nullptr) continue;
    absl::StrAppend(&out, "\n    ");
    AppendJsonString(&out, f.name);
    out += ": ";
    AppendJsonNumber(&out, f.max);
    out += ",";
  }
  absl::StrAppend(&out, "\n    \"shard_history_steps * max_shards_per_step\": ", kMaxShardSlots,
                  ",\n    \"warn_logz_rising_steps / logz_bucket_steps\": ", kMaxLogzBuckets,
                  ",\n    \"memory_budget_bytes_per_run\": ", kRuleMemoryBudgetBytes,
                  "\n  }\n}\n");
  return out;
}

}  // namespace trainwatch::core
