// What one trainwatch.v1.StepReport says about its step, in core types: the
// agent writes its records through it and the server reads them through it,
// so presence ("absent" vs "reported NaN") and the counts mean the same on
// both sides. The report's address (run, rank, world size, scope) is not
// part of it: that is routing, not the step.

#ifndef TRAINWATCH_WIRE_STEP_REPORT_H_
#define TRAINWATCH_WIRE_STEP_REPORT_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "trainwatch/core/rule_engine.h"
#include "trainwatch/core/step_record.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::wire {

// A view, like core::StepRecord: `shards` and the tensors' names point into
// the report it was read from (or the writer's data), which must outlive it.
struct ReportedStep : core::Step {
  absl::Span<const uint64_t> shards;
  std::vector<std::string> shard_names;  // copied: a proto's are not contiguous
  std::vector<core::TensorStat> tensors;
  bool update_skipped = false;
};

// The five health metrics: `values`' loss, grad_norm, log_z and nan_frac
// when present, and loss_ema_ratio unless NaN.
void MetricsToProto(const core::StepValues& values, double loss_ema_ratio,
                    trainwatch::v1::Metrics* m);
// Sets `values`' four metric signals that `m` has; returns loss_ema_ratio
// (NaN when absent).
double MetricsFromProto(const trainwatch::v1::Metrics& m, core::StepValues* values);

// Writes every field of `s` (always creating the metrics message); the
// verdict and the time are the caller's, for records that have them.
void StepToProto(const ReportedStep& s, trainwatch::v1::StepReport* r);
// Attention-logit p99s of several layers read as their maximum, a
// nonfinite one winning (it is itself a signal).
ReportedStep StepFromProto(const trainwatch::v1::StepReport& r);

// verdict, update_skipped aside: the skip rule and tier when not kContinue.
void VerdictToProto(const core::Verdict& v, trainwatch::v1::StepReport* r);
core::Verdict VerdictFromProto(const trainwatch::v1::StepReport& r);

}  // namespace trainwatch::wire

#endif  // TRAINWATCH_WIRE_STEP_REPORT_H_
