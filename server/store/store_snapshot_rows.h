// Row code of the engine_snapshots table (migration 8): the rule-engine
// snapshots a rebuild starts from (server/ingest/engine_snapshots.cc). Runs on
// the connection it is given and takes no lock, as the other row files.
// Private to trainwatch::server.

#ifndef TRAINWATCH_SERVER_STORE_SNAPSHOT_ROWS_H_
#define TRAINWATCH_SERVER_STORE_SNAPSHOT_ROWS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/store.h"

struct sqlite3;

namespace trainwatch::server::rows {

// Writes each snapshot (a repeated (run, attempt, step) replaces the older
// one) and keeps only the newest `kept` of its (run, attempt); kept >= 1.
absl::Status InsertEngineSnapshots(sqlite3* db, const std::vector<EngineSnapshotRow>& rows,
                                   int kept);
// The attempt's newest snapshot at or before `max_step`, if any.
absl::StatusOr<std::optional<EngineSnapshotRow>> LatestEngineSnapshot(
    sqlite3* db, const std::string& run_id, int64_t attempt, int64_t max_step);

}  // namespace trainwatch::server::rows

#endif  // TRAINWATCH_SERVER_STORE_SNAPSHOT_ROWS_H_
