#include "store/store_incident_rows.h"

#include "absl/strings/str_cat.h"
#include "trainwatch/core/json.h"
#include "store/row_readers.h"
#include "store/sql_statement.h"

namespace trainwatch::server::rows {

namespace {



}  // namespace

absl::Status UpsertIncidents(sqlite3* db, const std::vector<IncidentRow>& incidents) {
  if (incidents.empty()) return absl::OkStatus();
  SqlStatement q(db, absl::StrCat("INSERT OR REPLACE INTO incidents (", kIncidentColumns,
                                  ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
                                  "?13, ?14, ?15, ?16, ?17, ?18)"));
  SqlStatement flag(db,
                    "INSERT OR IGNORE INTO flagged_shards (run_id, shard, incident_id) "
                    "VALUES (?1, ?2, ?3)");
  if (!q.status().ok()) return q.status();
  if (!flag.status().ok()) return flag.status();
  for (const IncidentRow& r : incidents) {
    q.Bind(1, r.id).Bind(2, r.run_id).Bind(3, static_cast<int64_t>(r.episode));
    q.Bind(4, int64_t{r.tier}).Bind(5, int64_t{static_cast<int>(r.state)});
    q.Bind(6, int64_t{static_cast<int>(r.kind)}).Bind(7, r.title).Bind(8, r.onset_step);
    q.Bind(9, r.detection_step).Bind(10, r.recommended_checkpoint_step);
    q.Bind(11, r.recommended_checkpoint_uri).BindShards(12, r.shards);
    std::string actions;
    core::AppendRecommendedActionsJson(&actions, r.actions);
    q.Bind(13, actions).Bind(14, r.opened_ms).Bind(15, r.updated_ms);
    q.Bind(16, r.closed_ms).BindShardNames(17, r.shard_names);
    q.Bind(18, int64_t{r.observed});
    if (absl::Status s = q.Run(); !s.ok()) return s;
    absl::Status s = flag.RunEach(r.shards, [&](SqlStatement& f, uint64_t shard) {
      f.Bind(1, r.run_id).Bind(2, static_cast<int64_t>(shard)).Bind(3, r.id);
    });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<IncidentRow>> ListIncidents(sqlite3* db, const IncidentFilter& f) {
  SqlStatement q(db, absl::StrCat("SELECT ", kIncidentColumns,
                                  " FROM incidents WHERE (?1 = '' OR run_id = ?1) AND "
                                  "(?2 = 0 OR state NOT IN (5, 6)) AND (?3 < 0 OR tier = ?3) AND "
                                  "id > ?4 ORDER BY id LIMIT ?5"));
  q.Bind(1, f.run_id).Bind(2, int64_t{f.open_only}).Bind(3, int64_t{f.tier});
  q.Bind(4, f.after_id).Bind(5, int64_t{f.limit});
  absl::Status bad;
  auto rows = q.All([&bad](const SqlStatement& s) { return ReadIncident(s, &bad); });
  if (!bad.ok()) return bad;
  return rows;
}

absl::StatusOr<std::optional<IncidentRow>> GetIncident(sqlite3* db, int64_t id) {
  SqlStatement q(db, absl::StrCat("SELECT ", kIncidentColumns, " FROM incidents WHERE id = ?1"));
  q.Bind(1, id);
  absl::Status bad;
  auto row = q.First([&bad](const SqlStatement& s) { return ReadIncident(s, &bad); });
  if (!bad.ok()) return bad;
  return row;
}

absl::StatusOr<int64_t> MaxIncidentId(sqlite3* db) {
  SqlStatement q(db, "SELECT COALESCE(MAX(id), 0) FROM incidents");
  return QueryInt(q);
}

absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> FlaggedShards(sqlite3* db,
                                                                        const std::string& run_id) {
  SqlStatement q(db,
                 "SELECT shard, incident_id FROM flagged_shards WHERE run_id = ?1 ORDER BY shard");
  q.Bind(1, run_id);
  return q.All([](const SqlStatement& r) {
    return std::pair<uint64_t, int64_t>(static_cast<uint64_t>(r.Int(0)), r.Int(1));
  });
}

absl::Status InsertEvents(sqlite3* db, const std::vector<EventRow>& events) {
  if (events.empty()) return absl::OkStatus();
  SqlStatement q(db,
                 "INSERT INTO events (run_id, incident_id, episode, step, onset_step, tier, "
                 "action, kind, reason, shards, checkpoint_step, created_ms) "
                 "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)");
  return q.RunEach(events, [](SqlStatement& q, const EventRow& r) {
    const core::Event& e = r.event;
    q.Bind(1, r.run_id).Bind(2, r.incident_id).Bind(3, static_cast<int64_t>(e.episode));
    q.Bind(4, e.step).Bind(5, e.onset_step).Bind(6, int64_t{e.tier});
    q.Bind(7, int64_t{static_cast<int>(e.action)}).Bind(8, int64_t{static_cast<int>(e.kind)});
    q.Bind(9, e.reason).BindShards(10, e.shards);
    q.Bind(11, e.recommended_checkpoint_step).Bind(12, r.created_ms);
  });
}

absl::StatusOr<std::vector<EventRow>> EventsOfIncident(sqlite3* db, int64_t incident_id) {
  SqlStatement q(db, absl::StrCat("SELECT ", kEventColumns,
                                   " FROM events WHERE incident_id = ?1 ORDER BY id"));
  q.Bind(1, incident_id);
  return q.All([&](const SqlStatement& q) { return ReadEvent(q, incident_id); });
}

}  // namespace trainwatch::server::rows
