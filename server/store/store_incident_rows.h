// Row code of what the rule engine found: the incidents table (with the
// flagged_shards it names) and the events table. Each function runs on the
// connection it is given and takes no lock. Private to trainwatch::server.

#ifndef TRAINWATCH_SERVER_STORE_INCIDENT_ROWS_H_
#define TRAINWATCH_SERVER_STORE_INCIDENT_ROWS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/store.h"

struct sqlite3;

namespace trainwatch::server::rows {

// incidents: upserts by id, and flags each incident's shards (a flag, once
// written, stays).
absl::Status UpsertIncidents(sqlite3* db, const std::vector<IncidentRow>& incidents);
absl::StatusOr<std::vector<IncidentRow>> ListIncidents(sqlite3* db, const IncidentFilter& filter);
absl::StatusOr<std::optional<IncidentRow>> GetIncident(sqlite3* db, int64_t id);
absl::StatusOr<int64_t> MaxIncidentId(sqlite3* db);
// (shard, incident id), by shard.
absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> FlaggedShards(sqlite3* db,
                                                                        const std::string& run_id);

// events: appended, never updated.
absl::Status InsertEvents(sqlite3* db, const std::vector<EventRow>& events);
absl::StatusOr<std::vector<EventRow>> EventsOfIncident(sqlite3* db, int64_t incident_id);

}  // namespace trainwatch::server::rows

#endif  // TRAINWATCH_SERVER_STORE_INCIDENT_ROWS_H_
