#include "engine_state.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainwatch::core {

EngineState::EngineState(const RuleConfig& config)
    : c(config),
      ema(config.ema_span_steps, config.ema_min_span_records),
      dev_mean(config.ema_span_steps, config.ema_min_span_records),
      dev_sq(config.ema_span_steps, config.ema_min_span_records),
      smooth_loss(config.smoothing_span_steps, config.min_window_records),
      smooth_logz(config.smoothing_span_steps, config.min_window_records),
      grad_median(config.median_window_steps),
      logz_min_short(config.logz_rise_window_steps),
      logz_min_long(config.logz_drift_window_steps),
      logz_buckets(config.logz_bucket_steps,
                   static_cast<size_t>(config.warn_logz_rising_steps /
                                       config.logz_bucket_steps) + 2),
      grad_hist(std::max<int64_t>(1, config.warn_grad_median_window_steps / 10), 12),
      attn_hist(std::max<int64_t>(1, config.warn_logz_rising_steps / 5), 7),
      act_hist(std::max<int64_t>(1, config.warn_logz_rising_steps / 5), 7),
      transient_base(config.transient_baseline_records),
      transient_dev(config.transient_baseline_records),
      transient_short(static_cast<size_t>(config.transient_window_records)),
      shard_ids(static_cast<size_t>(config.shard_history_steps *
                                    config.max_shards_per_step)),
      shard_steps(static_cast<size_t>(config.shard_history_steps)) {
  checkpoints.reserve(static_cast<size_t>(config.checkpoints_retained) + 1);
}

void EngineState::AddCheckpoint(int64_t step, absl::string_view uri) {
  // Kept in step order; a repeated notice for a step replaces its uri.
  auto it = std::lower_bound(
      checkpoints.begin(), checkpoints.end(), step,
      [](const Checkpoint& c, int64_t s) { return c.step < s; });
  if (it != checkpoints.end() && it->step == step) {
    it->uri = std::string(uri);
    return;
  }
  checkpoints.insert(it, Checkpoint{step, std::string(uri)});
  if (checkpoints.size() > static_cast<size_t>(c.checkpoints_retained)) {
    checkpoints.erase(checkpoints.begin());
  }
}

namespace {

// What one kept name costs, as config.h's bounds count it.
size_t NameCost(absl::string_view name) { return name.size() + sizeof(std::string); }

}  // namespace

void EngineState::RecordShardNames(const StepRecord& r) {
  const size_t per = static_cast<size_t>(c.max_shards_per_step);
  const size_t budget = static_cast<size_t>(c.shard_name_history_bytes);
  NamedShardEntry entry{r.step, {}, r.shard_names.size() > per};
  size_t bytes = sizeof(NamedShardEntry);
  // Exact, so that the vector's own storage is what the bound counts.
  entry.names.reserve(std::min(per, r.shard_names.size()));
  for (size_t i = 0; i < r.shard_names.size() && i < per; ++i) {
    if (bytes + NameCost(r.shard_names[i]) > budget) {
      entry.truncated = true;  // this step alone is over the budget
      break;
    }
    bytes += NameCost(r.shard_names[i]);
    entry.names.emplace_back(r.shard_names[i]);
  }
  while (!shard_name_steps.empty() &&
         (shard_name_bytes + bytes > budget ||
          shard_name_steps.size() >= static_cast<size_t>(c.shard_history_steps))) {
    const NamedShardEntry& old = shard_name_steps.front();
    shard_name_bytes -= sizeof(NamedShardEntry);
    for (const std::string& n : old.names) shard_name_bytes -= NameCost(n);
    shard_name_steps.pop_front();
  }
  if (entry.names.empty() || bytes > budget) return;
  shard_name_bytes += bytes;
  shard_name_steps.push_back(std::move(entry));
}

Event& EngineState::NewEvent(StepOutcome* out, const StepRecord& r, int tier, Action action,
                             EventKind kind, uint64_t episode, int64_t onset) const {
  out->events.emplace_back();
  Event& e = out->events.back();
  e.step = r.step;
  e.onset_step = onset;
  e.tier = tier;
  e.action = action;
  e.kind = kind;
  e.episode = episode;
  e.lacked_signals = kCoreSignals & ~ever_present;
  e.loss = r.Get(Signal::kLoss);
  e.loss_ema = out->loss_ema;
  e.loss_ema_ratio = out->loss_ema_ratio;
  e.grad_norm = r.Get(Signal::kGradNorm);
  e.grad_norm_median = out->grad_norm_median;
  e.log_z = r.Get(Signal::kLogZ);
  return e;
}

void EngineState::CollectShards(int64_t from, int64_t to, Event* e) const {
  const size_t ring = shard_steps.size();
  const size_t per = static_cast<size_t>(c.max_shards_per_step);
  for (size_t i = 0; i < shard_count; ++i) {
    const size_t slot = (shard_head + i) % ring;
    const ShardEntry& se = shard_steps[slot];
    if (se.step < from || se.step > to) continue;
    e->shards.insert(e->shards.end(), shard_ids.begin() + slot * per,
                     shard_ids.begin() + slot * per + se.count);
    if (se.truncated) e->shards_truncated = true;
  }
  for (const NamedShardEntry& ne : shard_name_steps) {
    if (ne.step < from || ne.step > to) continue;
    e->shard_names.insert(e->shard_names.end(), ne.names.begin(), ne.names.end());
    if (ne.truncated) e->shards_truncated = true;
  }
  const size_t cap = static_cast<size_t>(c.max_event_shards);
  auto sort_and_cap = [&](auto* v) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
    if (v->size() <= cap) return;
    // Keep both ends, so that front() and back() still bound the range a
    // quarantine covers.
    const size_t head = cap / 2, tail = cap - head;
    v->erase(v->begin() + static_cast<std::ptrdiff_t>(head),
             v->end() - static_cast<std::ptrdiff_t>(tail));
    e->shards_truncated = true;
  };
  sort_and_cap(&e->shards);
  sort_and_cap(&e->shard_names);
}

// The last retained checkpoint at or before the onset. A numerical failure
// takes one strictly before it: a checkpoint written at the failing step
// may already hold the NaN.
void EngineState::RecommendCheckpoint(Event* e) const {
  const int64_t limit = e->tier == 3 ? e->onset_step - 1 : e->onset_step;
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
    if (it->step <= limit) {
      e->recommended_checkpoint_step = it->step;
      e->recommended_checkpoint_uri = it->uri;
      return;
    }
  }
}

void EngineState::AddShardAction(RecommendedAction::Kind kind, Event* e) const {
  if (e->shards.empty() && e->shard_names.empty()) return;
  RecommendedAction a;
  a.kind = kind;
  a.text = kind == RecommendedAction::Kind::kQuarantineShards ? "quarantine shards" : "inspect shards";
  a.has_shard_range = !e->shards.empty();
  if (a.has_shard_range) {
    a.shard_first = e->shards.front();
    a.shard_last = e->shards.back();
    absl::StrAppendFormat(&a.text, " %d..%d", a.shard_first, a.shard_last);
  }
  a.shard_names = e->shard_names;
  // A few names in words; the action itself carries them all.
  constexpr size_t kNamesInText = 3;
  for (size_t i = 0; i < a.shard_names.size() && i < kNamesInText; ++i) {
    absl::StrAppend(&a.text, i == 0 && !e->shards.empty() ? " and " : i == 0 ? " " : ", ",
                    a.shard_names[i]);
  }
  if (a.shard_names.size() > kNamesInText) {
    absl::StrAppend(&a.text, " and ", a.shard_names.size() - kNamesInText, " more names");
  }
  e->recommended_actions.push_back(std::move(a));
}

void EngineState::AddZLossAction(double current_alpha, Event* e) const {
  RecommendedAction a;
  a.kind = RecommendedAction::Kind::kSetZLossAlpha;
  if (Finite(current_alpha) && current_alpha > 0.0) {
    // Already on: raise it tenfold, but stay at or below 1e-3, past which
    // the chapter reports a visible loss penalty.
    a.z_loss_alpha = std::min(current_alpha * 10.0, 1e-3);
    a.text = absl::StrFormat("raise z-loss alpha %g -> %g", current_alpha,
                             a.z_loss_alpha);
  } else {
    a.z_loss_alpha = c.z_loss_alpha_recommended;
    a.text = absl::StrFormat("add z-loss alpha=%g", a.z_loss_alpha);
  }
  e->recommended_actions.push_back(std::move(a));
}

size_t EngineState::MemoryBytes() const {
  auto bucket_bytes = [](const BucketSeries& b) {
    return b.capacity() * sizeof(BucketSeries::Bucket);
  };
  size_t bytes = sizeof(EngineState) + grad_median.MemoryBytes() +
                 (c.logz_rise_window_steps + c.logz_drift_window_steps + 2) *
                     (sizeof(int64_t) + sizeof(double)) +
                 bucket_bytes(logz_buckets) + bucket_bytes(grad_hist) +
                 bucket_bytes(attn_hist) + bucket_bytes(act_hist) +
                 shard_ids.capacity() * sizeof(uint64_t) +
                 shard_steps.capacity() * sizeof(ShardEntry) +
                 checkpoints.capacity() * sizeof(Checkpoint) +
                 transient_base.MemoryBytes() + transient_dev.MemoryBytes() +
                 transient_short.capacity() * sizeof(std::pair<int64_t, double>);
  for (const auto& ck : checkpoints) bytes += ck.uri.capacity();
  bytes += shard_name_bytes;
  return bytes;
}

}  // namespace trainwatch::core
