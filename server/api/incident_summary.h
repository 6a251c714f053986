// The diagnostic summary of an incident, as `twctl incident show` and the
// pages present it: the rules that fired, the curves around the onset, the
// grad-norm percentiles before it, the shards and the tensors involved, and
// the recommended actions with the command that approves them.
//
// Pure: the operator service reads the rows and passes them in.

#ifndef TRAINWATCH_SERVER_INCIDENT_SUMMARY_H_
#define TRAINWATCH_SERVER_INCIDENT_SUMMARY_H_

#include <cstdint>

#include "absl/types/span.h"
#include "store/store.h"
#include "trainwatch/v1/operator.pb.h"

namespace trainwatch::server {

struct SummaryInputs {
  const IncidentRow& incident;
  absl::Span<const EventRow> events;  // the incident's, in order
  // The incident's attempt, from 5,000 steps before the onset to detection.
  absl::Span<const StepRow> steps;
  // The ranks' own reports at the onset (tier 3: which tensors, which ranks).
  absl::Span<const RankStepRow> onset_ranks;
  int64_t steps_before_onset = 0;  // the rules' shard_steps_before_onset
  int64_t now_ms = 0;
};

void BuildSummary(const SummaryInputs& in, trainwatch::v1::DiagnosticSummary* summary);

// The attempt an incident happened in: the run's current one, unless the
// incident's rollback has since started a new one.
int64_t IncidentAttempt(const IncidentRow& incident, int64_t current_attempt);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INCIDENT_SUMMARY_H_
