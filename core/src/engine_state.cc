#include "engine_state.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"

namespace trainwatch::core {

EngineState::EngineState(const RuleConfig& config)
    : c(config),
      ema(config.ema_span_steps),
      dev_mean(config.ema_span_steps),
      dev_sq(config.ema_span_steps),
      smooth_loss(config.smoothing_span_steps),
      smooth_logz(config.smoothing_span_steps),
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
  std::sort(e->shards.begin(), e->shards.end());
  e->shards.erase(std::unique(e->shards.begin(), e->shards.end()), e->shards.end());
  const size_t cap = static_cast<size_t>(c.max_event_shards);
  if (e->shards.size() > cap) {
    // Keep both ends, so that front() and back() still bound the range a
    // quarantine covers.
    const size_t head = cap / 2, tail = cap - head;
    e->shards.erase(e->shards.begin() + static_cast<std::ptrdiff_t>(head),
                    e->shards.end() - static_cast<std::ptrdiff_t>(tail));
    e->shards_truncated = true;
  }
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
  if (e->shards.empty()) return;
  RecommendedAction a;
  a.kind = kind;
  a.shard_first = e->shards.front();
  a.shard_last = e->shards.back();
  a.text = absl::StrFormat(
      "%s shards %d..%d", kind == RecommendedAction::Kind::kQuarantineShards
                              ? "quarantine"
                              : "inspect",
      a.shard_first, a.shard_last);
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
  return bytes;
}

}  // namespace trainwatch::core
