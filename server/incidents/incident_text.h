// What an incident says of itself, wherever it is said: the page (pager/),
// the diagnostic summary (api/) and the write path that builds the page's
// text (ingest/) share these words, so that none of them includes another.
// Also the seam between ingest and the pager: IncidentOutbox.

#ifndef TRAINWATCH_SERVER_INCIDENTS_INCIDENT_TEXT_H_
#define TRAINWATCH_SERVER_INCIDENTS_INCIDENT_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "store/store.h"

namespace trainwatch::server {

// What a followed run's records, incidents and pages say of themselves
// (`twctl follow`, Hello.observed).
inline constexpr char kObservedNotEnforced[] = "observed, not enforced";

// The sentence pages and summaries add for an incident of a followed run:
// it is followed from its log, no automatic action was possible, and the
// recommended rollback is a restart by hand. Empty for any other incident.
std::string ObservedNote(const IncidentRow& incident);

// Resolved or dismissed.
bool IsClosed(IncidentState s);

// The state as pages and their receivers name it: "open", "rolling_back", ...
const char* StateText(IncidentState s);

// A page's paragraph: the incident's title, `detail` (what only the writer
// knows now, such as where a stalled run's ranks are; may be empty), the
// recommended checkpoint and actions, and a followed run's note.
std::string PageSummary(const IncidentRow& incident, const std::string& detail);

// Where an incident's change becomes pages: outbox rows written in the same
// batch as the change (the pager implements it). The write path holds one
// without knowing the pager.
class IncidentOutbox {
 public:
  virtual ~IncidentOutbox() = default;
  // Outbox rows for an incident's change; empty when nothing is paged.
  virtual std::vector<OutboxRow> Rows(const IncidentRow& incident, const std::string& summary,
                                      int64_t now_ms) const = 0;
  // Rows were committed: deliver them.
  virtual void Wake() = 0;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INCIDENTS_INCIDENT_TEXT_H_
