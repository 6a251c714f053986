// Row code of the pager's outbox: one row a page to deliver. Each function
// runs on the connection it is given and takes no lock. Private to
// trainwatch::server.

#ifndef TRAINWATCH_SERVER_STORE_OUTBOX_ROWS_H_
#define TRAINWATCH_SERVER_STORE_OUTBOX_ROWS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/store.h"

struct sqlite3;

namespace trainwatch::server::rows {

// New pages, pending; a repeated (incident, channel, kind) is ignored.
absl::Status InsertOutbox(sqlite3* db, const std::vector<OutboxRow>& pages);
// Pending pages whose next attempt is due, oldest first.
absl::StatusOr<std::vector<OutboxRow>> DueOutbox(sqlite3* db, int64_t now_ms, int limit);
absl::StatusOr<std::vector<OutboxRow>> OutboxOfIncident(sqlite3* db, int64_t incident_id);
// A delivery attempt's outcome; sent_ms is now_ms when sent, else 0.
absl::Status MarkOutbox(sqlite3* db, int64_t id, bool sent, int attempts, int64_t next_attempt_ms,
                        const std::string& error, int64_t now_ms);

}  // namespace trainwatch::server::rows

#endif  // TRAINWATCH_SERVER_STORE_OUTBOX_ROWS_H_
