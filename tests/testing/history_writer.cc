#include "testing/history_writer.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainwatch/core/rule_engine.h"

namespace trainwatch::testing {

absl::Status WriteHistory(server::Store* store, const HistoryShape& shape) {
  const core::RuleConfig rules;
  for (int run = 0; run < shape.runs; ++run) {
    server::WriteBatch batch;
    server::RunRow row;
    row.run_id = absl::StrCat("run-", run);
    row.created_ms = row.last_seen_ms = 1;
    core::RuleEngine engine(rules);
    core::StepOutcome out;
    int64_t skipped = 0, last_snapshot = -1;
    auto snapshot = [&](int64_t step) {
      batch.engine_snapshots.push_back(
          {row.run_id, 0, step, skipped, 0, 1, engine.SaveState()});
      last_snapshot = step;
    };
    batch.steps.reserve(static_cast<size_t>(shape.steps));
    for (int64_t s = 0; s < shape.steps; ++s) {
      server::WriteBatch::Step w;
      w.run_id = row.run_id;
      w.step.step = s;
      const double x = static_cast<double>(s + 1000 * run);
      w.step.Set(core::Signal::kLoss, 2.0 + 1.0 / std::sqrt(1.0 + s / 100.0) +
                                          0.02 * std::sin(0.37 * x));
      w.step.Set(core::Signal::kGradNorm, 1.0 + 0.1 * std::cos(0.11 * x));
      w.step.Set(core::Signal::kLogZ, 8.0 + 0.01 * std::sin(0.05 * x));
      w.step.Set(core::Signal::kNanFrac, 0.0);
      w.step.received_ms = 1;
      if (absl::Status st = engine.Judge(w.step.View(), &out); !st.ok()) return st;
      w.step.loss_ema_ratio = out.loss_ema_ratio;
      w.step.decision = static_cast<int>(out.verdict.decision);
      skipped += out.verdict.decision == core::Decision::kSkipUpdate;
      batch.steps.push_back(std::move(w));
      if (shape.snapshot_steps > 0 && s - last_snapshot >= shape.snapshot_steps) snapshot(s);
    }
    if (shape.snapshot_steps > 0 && last_snapshot < shape.steps - 1) snapshot(shape.steps - 1);
    row.last_step = shape.steps - 1;
    batch.runs.push_back(row);
    if (absl::Status st = store->Write(batch); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace trainwatch::testing
