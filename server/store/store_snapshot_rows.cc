#include "store/store_snapshot_rows.h"

#include "store/sql_statement.h"

namespace trainwatch::server::rows {

absl::Status InsertEngineSnapshots(sqlite3* db, const std::vector<EngineSnapshotRow>& rows,
                                   int kept) {
  if (rows.empty()) return absl::OkStatus();
  SqlStatement put(db,
                   "INSERT OR REPLACE INTO engine_snapshots (run_id, attempt, step, skipped, "
                   "overflows, written_ms, state) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  absl::Status st = put.RunEach(rows, [](SqlStatement& q, const EngineSnapshotRow& r) {
    q.Bind(1, r.run_id).Bind(2, r.attempt).Bind(3, r.step).Bind(4, r.skipped);
    q.Bind(5, r.overflows).Bind(6, r.written_ms).BindBlob(7, r.state);
  });
  if (!st.ok()) return st;
  // Older snapshots serve a rebuild to an earlier step (a resume, a
  // rollback); beyond a few they only cost space.
  SqlStatement prune(db,
                     "DELETE FROM engine_snapshots WHERE run_id = ?1 AND attempt = ?2 AND step < "
                     "(SELECT MIN(step) FROM (SELECT step FROM engine_snapshots WHERE run_id = ?1 "
                     "AND attempt = ?2 ORDER BY step DESC LIMIT ?3))");
  return prune.RunEach(rows, [kept](SqlStatement& q, const EngineSnapshotRow& r) {
    q.Bind(1, r.run_id).Bind(2, r.attempt).Bind(3, int64_t{kept});
  });
}

absl::StatusOr<std::optional<EngineSnapshotRow>> LatestEngineSnapshot(
    sqlite3* db, const std::string& run_id, int64_t attempt, int64_t max_step) {
  SqlStatement q(db,
                 "SELECT step, skipped, overflows, written_ms, state FROM engine_snapshots "
                 "WHERE run_id = ?1 AND attempt = ?2 AND step <= ?3 ORDER BY step DESC LIMIT 1");
  q.Bind(1, run_id).Bind(2, attempt).Bind(3, max_step);
  absl::StatusOr<std::vector<EngineSnapshotRow>> found = q.All([&](const SqlStatement& r) {
    return EngineSnapshotRow{run_id, attempt, r.Int(0), r.Int(1), r.Int(2), r.Int(3), r.Blob(4)};
  });
  if (!found.ok()) return found.status();
  if (found->empty()) return std::nullopt;
  return std::move(found->front());
}

}  // namespace trainwatch::server::rows
