// Synthetic training runs with the statistics of a real one (a decaying
// loss with step noise, a grad norm with multiplicative noise, a slowly
// drifting log_z) and optional injected failures: a corrupted batch, a logit
// drift, a NaN. Deterministic for a given seed.

#ifndef TRAINWATCH_EXAMPLES_SYNTHETIC_SYNTHETIC_H_
#define TRAINWATCH_EXAMPLES_SYNTHETIC_SYNTHETIC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "trainwatch/core/step_record.h"

namespace trainwatch::synth {

struct Row {
  int64_t step = 0;
  double loss = 0.0;
  double grad_norm = 0.0;
  double log_z = 0.0;
  double nan_frac = 0.0;
  uint64_t shard = 0;
  std::string checkpoint;  // non-empty every checkpoint_every steps
};

struct Options {
  int64_t steps = 24000;
  uint64_t seed = 1;
  int64_t checkpoint_every = 1000;
  // Benign behaviour.
  double loss_floor = 2.2;
  double loss_noise = 0.02;
  double grad_noise = 0.1;     // sigma of log(grad_norm)
  double log_z_noise = 0.15;
  double log_z_drift_per_1k = 0.0;  // slow benign drift
  // Injected failures; -1 disables each.
  int64_t corrupt_batch_step = -1;  // one batch of garbage: loss +3, grad x8
  int64_t logit_drift_step = -1;    // log_z accelerates upward, then the loss follows
  int64_t nan_step = -1;            // gradients turn NaN from here on
};

// The foundation demo: a bad batch at 6,000, a logit drift from 11,000, a NaN
// at 16,000.
Options DemoOptions();

std::vector<Row> Generate(const Options& options);

// A row as the engine's record; it borrows the row's shard and checkpoint,
// so the row must outlive it.
inline core::StepRecord ToRecord(const Row& row) {
  core::StepRecord r;
  r.step = row.step;
  r.Set(core::Signal::kLoss, row.loss).Set(core::Signal::kGradNorm, row.grad_norm);
  r.Set(core::Signal::kLogZ, row.log_z).Set(core::Signal::kNanFrac, row.nan_frac);
  r.shards = absl::MakeConstSpan(&row.shard, 1);
  r.checkpoint_uri = row.checkpoint;
  return r;
}

// CSV with the header step,loss,grad_norm,log_z,nan_frac,shard,checkpoint.
std::string ToCsv(const std::vector<Row>& rows);

}  // namespace trainwatch::synth

#endif  // TRAINWATCH_EXAMPLES_SYNTHETIC_SYNTHETIC_H_
