#include "trainwatch/core/config.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainwatch/core/json.h"

namespace trainwatch::core {

namespace {

// One row per configurable field: its file name and where it lives. Exactly
// one of the member pointers is set.
struct Field {
  const char* name;
  double RuleConfig::*d = nullptr;
  int64_t RuleConfig::*i = nullptr;
  bool RuleConfig::*b = nullptr;
};

#define TW_D(f) Field{#f, &RuleConfig::f, nullptr, nullptr}
#define TW_I(f) Field{#f, nullptr, &RuleConfig::f, nullptr}
#define TW_B(f) Field{#f, nullptr, nullptr, &RuleConfig::f}

const Field kFields[] = {
    TW_D(ema_span_steps),
    TW_I(median_window_steps),
    TW_D(smoothing_span_steps),
    TW_I(warmup_steps),
    TW_I(warmup_min_records),
    TW_I(warmup_min_grad_samples),
    TW_D(spike_delta_nats),
    TW_I(spike_min_steps),
    TW_I(spike_gap_records),
    TW_I(transient_window_records),
    TW_I(transient_baseline_records),
    TW_D(transient_z),
    TW_D(tier1_grad_ratio),
    TW_D(tier1_loss_ratio),
    TW_D(tier1_loss_z),
    TW_D(skip_loss_ratio),
    TW_B(tier1_skip_on_trigger),
    TW_I(tier1_confirm_steps),
    TW_D(tier1_confirm_fraction),
    TW_I(escalate_steps),
    TW_D(tier2_loss_ratio),
    TW_I(tier2_loss_ratio_records),
    TW_D(logz_rise),
    TW_I(logz_rise_window_steps),
    TW_I(logz_drift_window_steps),
    TW_D(logz_led_min_rise),
    TW_D(logz_onset_tolerance),
    TW_I(logz_bucket_steps),
    TW_D(z_loss_alpha_recommended),
    TW_D(tier3_loss_nats),
    TW_I(tier3_clear_steps),
    TW_D(warn_logz_level),
    TW_I(warn_logz_rising_steps),
    TW_D(warn_logz_min_rise),
    TW_I(warn_grad_median_window_steps),
    TW_D(warn_grad_median_factor),
    TW_D(warn_grad_median_steady_fraction),
    TW_D(warn_attention_min_rise_fraction),
    TW_D(warn_activation_floor),
    TW_D(warn_activation_target),
    TW_I(warn_activation_horizon_steps),
    TW_I(checkpoints_retained),
    TW_I(shard_history_steps),
    TW_I(max_shards_per_step),
    TW_I(max_event_shards),
    TW_I(shard_steps_before_onset),
};

#undef TW_D
#undef TW_I
#undef TW_B

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
  if (c.median_window_steps > 10'000'000 || c.logz_drift_window_steps > 10'000'000 ||
      c.logz_rise_window_steps > 10'000'000 || c.shard_history_steps > 1'000'000 ||
      c.transient_window_records > 100'000 || c.transient_baseline_records > 100'000) {
    return absl::InvalidArgumentError("a window above 10,000,000 steps is not supported");
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
  bool first = true;
  for (const Field& f : kFields) {
    absl::StrAppend(&out, first ? "\n  " : ",\n  ");
    first = false;
    AppendJsonString(&out, f.name);
    out += ": ";
    if (f.d != nullptr) {
      AppendJsonNumber(&out, c.*f.d);
    } else if (f.i != nullptr) {
      absl::StrAppend(&out, c.*f.i);
    } else {
      out += c.*f.b ? "true" : "false";
    }
  }
  out += "\n}\n";
  return out;
}

}  // namespace trainwatch::core
