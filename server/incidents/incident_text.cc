#include "incidents/incident_text.h"

#include "absl/strings/str_cat.h"

namespace trainwatch::server {

std::string ObservedNote(const IncidentRow& incident) {
  if (!incident.observed) return "";
  return absl::StrCat(
      "The job is followed from its log (twctl follow): ", kObservedNotEnforced,
      ". No automatic action was possible: no update was skipped and the trainer was not "
      "halted. An approved rollback is a manual restart of the trainer from the recommended "
      "checkpoint, with the quarantined shards left out of its data.");
}

bool IsClosed(IncidentState s) {
  return s == IncidentState::kResolved || s == IncidentState::kDismissed;
}

const char* StateText(IncidentState s) {
  switch (s) {
    case IncidentState::kOpen: return "open";
    case IncidentState::kAcknowledged: return "acknowledged";
    case IncidentState::kAwaitingDecision: return "awaiting_decision";
    case IncidentState::kRollingBack: return "rolling_back";
    case IncidentState::kResolved: return "resolved";
    case IncidentState::kDismissed: return "dismissed";
  }
  return "unknown";
}

std::string PageSummary(const IncidentRow& incident, const std::string& detail) {
  std::string summary = incident.title;
  if (!detail.empty()) absl::StrAppend(&summary, ". ", detail);
  if (incident.recommended_checkpoint_step >= 0) {
    absl::StrAppend(&summary, " Recommended: roll back to checkpoint step ",
                    incident.recommended_checkpoint_step, ".");
  }
  for (const core::RecommendedAction& a : incident.actions) absl::StrAppend(&summary, " ", a.text, ".");
  if (incident.observed) absl::StrAppend(&summary, " ", ObservedNote(incident));
  return summary;
}

}  // namespace trainwatch::server
