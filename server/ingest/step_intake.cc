// A step report's way into its run (step_intake.h).

#include "ingest/step_intake.h"

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "trainwatch/wire/step_report.h"

namespace trainwatch::server {

using trainwatch::v1::StepReport;

void StepIntake::Take(RunState& run, const StepReport& r, uint64_t stream, int64_t now) {
  ++batch_->records;
  batch_->Ack(stream, r.run_id(), r.rank(), r.step());
  const bool rank_scope = r.scope() == trainwatch::v1::REPORT_SCOPE_RANK;
  if (!run.mode_known) {
    run.mode_known = true;
    run.rank_mode = rank_scope;
  }
  if (rank_scope) {
    // Durable on its own (dedup by run, attempt, step, rank in the store).
    batch_->rows.rank_steps.push_back(
        {run.row.run_id, run.row.attempt, r.rank(), r.step(), r.SerializeAsString()});
    if (!run.rank_mode) return;  // a rank-specific extra next to the global record
    if (r.step() <= run.row.last_step) {
      views_->Count(&IngestStats::duplicates_total);
      return;
    }
    if (r.rank() < 0 || r.rank() >= run.row.world_size) {
      LOG(WARNING) << "run " << run.row.run_id << ": rank " << r.rank()
                   << " outside world size " << run.row.world_size << "; record stored only";
      views_->Count(&IngestStats::rejected_total);
      return;
    }
    if (FarAhead(run, r.step(), /*rank_scope=*/true)) return;  // stored only
    if (!run.pending.try_emplace(r.step(), now).first->second.Add(r.rank(),
                                                                   wire::StepFromProto(r))) {
      views_->Count(&IngestStats::duplicates_total);
    }
    return;
  }
  const wire::ReportedStep rep = wire::StepFromProto(r);
  StepRow s = GlobalStep(rep);
  s.received_ms = now;
  if (r.step() <= run.row.last_step) {
    // Already evaluated: a re-send after a reconnect (ignored by the store)
    // or a record that arrived after later ones (stored, not evaluated).
    s.late = true;
    s.decision = rep.update_skipped ? static_cast<int>(core::Decision::kSkipUpdate) : 0;
    batch_->rows.steps.push_back({run.row.run_id, run.row.attempt, std::move(s)});
    views_->Count(&IngestStats::duplicates_total);
    return;
  }
  if (FarAhead(run, r.step(), /*rank_scope=*/false)) {
    s.late = true;  // stored, not evaluated
    s.decision = rep.update_skipped ? static_cast<int>(core::Decision::kSkipUpdate) : 0;
    batch_->rows.steps.push_back({run.row.run_id, run.row.attempt, std::move(s)});
    return;
  }
  Evaluate(run, std::move(s), now, rep.tensors);
  if (run.row.last_step == r.step()) rules_->RecordAgentVerdict(run, r, now);  // evaluated
}

bool StepIntake::FarAhead(RunState& run, int64_t step, bool rank_scope) {
  const int64_t base = std::max<int64_t>(run.row.last_step, 0);
  const int64_t bound = std::max<int64_t>(1, options_->max_step_jump);
  // Both differences are of non-negative numbers: no overflow.
  if (step - base <= bound) {
    // The run caught up with a refused step (or, with one record a step, a
    // normal record came after it): that step confirms nothing any more.
    if (run.far_step && (!rank_scope || *run.far_step <= base)) run.far_step.reset();
    return false;
  }
  if (run.far_step && step >= *run.far_step && step - *run.far_step <= bound &&
      (rank_scope || step > *run.far_step)) {
    return false;  // the run really jumped: a second record follows the first
  }
  LOG(WARNING) << "run " << run.row.run_id << ": step " << step << " is more than " << bound
               << " steps past step " << run.row.last_step
               << "; stored, not evaluated (a next record within " << bound
               << " steps of it confirms the jump)";
  run.far_step = step;
  views_->Count(&IngestStats::far_steps_total);
  return true;
}

void StepIntake::CompletePending(RunState& run, int64_t now, bool force) {
  while (!run.pending.empty()) {
    auto it = run.pending.begin();
    const StepAggregate& p = it->second;
    const bool complete = p.count() >= run.row.world_size;
    const bool timed_out = now - p.first_ms() >= options_->aggregation_timeout_ms;
    if (!complete && !timed_out && !force) break;
    StepRow s = p.Finish(it->first, run.row.world_size);
    s.received_ms = now;
    if (!s.missing_ranks.empty()) {
      ++run.missing_rank_steps_total;
      LOG(WARNING) << "run " << run.row.run_id << " step " << it->first
                   << " completed without ranks " << s.missing_ranks;
    }
    run.pending.erase(it);
    Evaluate(run, std::move(s), now);
  }
}

void StepIntake::Evaluate(RunState& run, StepRow s, int64_t now,
                          absl::Span<const core::TensorStat> tensors) {
  core::StepRecord rec = s.View();
  rec.tensors = tensors;
  if (absl::Status st = run.engine->Judge(rec, &run.out); !st.ok()) {
    LOG(WARNING) << "run " << run.row.run_id << ": " << st;
    return;
  }
  s.loss_ema_ratio = run.out.loss_ema_ratio;
  s.decision = static_cast<int>(run.out.verdict.decision);
  if (run.out.verdict.decision == core::Decision::kSkipUpdate) {
    // A followed run's trainer skipped nothing; the attempt's
    // count of tier 1 verdicts goes into its engine snapshots either way.
    ++(run.row.observed ? run.skips_recommended_total : run.skipped_total);
    ++run.attempt_skipped;
  }
  run.loss_scale_overflows_total += s.loss_scale_overflow();
  run.attempt_overflows += s.loss_scale_overflow();
  run.row.last_step = s.step;
  run.row_dirty = true;
  run.latest = s;
  run.has_latest = true;
  batch_->rows.steps.push_back({run.row.run_id, run.row.attempt, std::move(s)});
  snapshots_->MaybeSave(run, /*force=*/false, now);
  if (!run.out.events.empty()) {
    run.incidents.OnEvents(run.row.attempt, run.out.events, now, &batch_->ids,
                           batch_->sink());
  }
  run.incidents.OnEvaluated(run.row.last_step, now, batch_->sink());
}

}  // namespace trainwatch::server
