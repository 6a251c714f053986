#include "synthetic.h"

#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainwatch::synth {

Options DemoOptions() {
  Options o;
  o.steps = 18000;
  o.corrupt_batch_step = 6000;
  o.logit_drift_step = 11000;
  o.nan_step = 16000;
  return o;
}

std::vector<Row> Generate(const Options& o) {
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<double> unit(0.0, 1.0);
  std::vector<Row> rows;
  rows.reserve(static_cast<size_t>(o.steps));
  for (int64_t t = 0; t < o.steps; ++t) {
    Row r;
    r.step = t;
    r.shard = 100000 + static_cast<uint64_t>(t);
    const double td = static_cast<double>(t);
    r.loss = o.loss_floor + 1.8 * std::exp(-td / 3000.0) + o.loss_noise * unit(rng);
    r.grad_norm = (1.0 + 0.5 * std::exp(-td / 2000.0)) * std::exp(o.grad_noise * unit(rng));
    r.log_z = 5.0 + 3.0 * (1.0 - std::exp(-td / 5000.0)) + o.log_z_drift_per_1k * td / 1000.0 +
              o.log_z_noise * unit(rng);
    if (o.logit_drift_step >= 0 && t >= o.logit_drift_step) {
      // log_z accelerates: +8 over the first 2,000 steps; 1,600 steps in the
      // loss starts to diverge and the gradients grow.
      const double u = (td - static_cast<double>(o.logit_drift_step)) / 2000.0;
      r.log_z += u < 1.0 ? 8.0 * u * u : 8.0 + 2.0 * (u - 1.0);
      const double lag = td - static_cast<double>(o.logit_drift_step) - 1600.0;
      if (lag > 0) {
        r.loss += 0.004 * lag;
        r.grad_norm *= 1.8;
      }
    }
    if (t == o.corrupt_batch_step) {
      r.loss += 3.0;
      r.grad_norm *= 8.0;
    }
    if (o.nan_step >= 0 && t >= o.nan_step) {
      r.nan_frac = 3.0e-6;
      r.grad_norm = std::numeric_limits<double>::quiet_NaN();
      r.loss = std::numeric_limits<double>::quiet_NaN();
    }
    if (o.checkpoint_every > 0 && t > 0 && t % o.checkpoint_every == 0) {
      r.checkpoint = absl::StrFormat("ckpt://synthetic/step-%07d", t);
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

std::string ToCsv(const std::vector<Row>& rows) {
  std::string out = "step,loss,grad_norm,log_z,nan_frac,shard,checkpoint\n";
  out.reserve(rows.size() * 72);
  for (const Row& r : rows) {
    absl::StrAppendFormat(&out, "%d,%.6g,%.6g,%.6g,%.6g,%d,%s\n", r.step, r.loss, r.grad_norm,
                          r.log_z, r.nan_frac, r.shard, r.checkpoint);
  }
  return out;
}

}  // namespace trainwatch::synth
