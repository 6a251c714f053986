#include "store/store_decision_rows.h"

#include "absl/strings/str_cat.h"
#include "store/row_readers.h"
#include "store/sql_statement.h"

namespace trainwatch::server::rows {

namespace {



}  // namespace

absl::Status InsertDecisions(sqlite3* db, const std::vector<DecisionRow>& decisions) {
  if (decisions.empty()) return absl::OkStatus();
  SqlStatement q(db,
                 "INSERT INTO decisions (id, incident_id, run_id, actor, kind, comment, payload, "
                 "idempotency_key, at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
  return q.RunEach(decisions, [](SqlStatement& q, const DecisionRow& d) {
    q.Bind(1, d.id).Bind(2, d.incident_id).Bind(3, d.run_id).Bind(4, d.actor);
    q.Bind(5, d.kind).Bind(6, d.comment).BindBlob(7, d.payload);
    // NULL, not '': UNIQUE lets any number of NULLs through.
    if (d.idempotency_key.empty()) {
      q.BindNull(8);
    } else {
      q.Bind(8, d.idempotency_key);
    }
    q.Bind(9, d.at_ms);
  });
}

absl::StatusOr<std::optional<DecisionRow>> FindDecisionByKey(sqlite3* db, const std::string& key) {
  SqlStatement q(
      db, absl::StrCat("SELECT ", kDecisionColumns, " FROM decisions WHERE idempotency_key = ?1"));
  q.Bind(1, key);
  return q.First(ReadDecision<SqlStatement>);
}

absl::StatusOr<std::vector<DecisionRow>> DecisionsOfIncident(sqlite3* db, int64_t incident_id) {
  SqlStatement q(db, absl::StrCat("SELECT ", kDecisionColumns,
                                  " FROM decisions WHERE incident_id = ?1 ORDER BY id"));
  q.Bind(1, incident_id);
  return q.All(ReadDecision<SqlStatement>);
}

absl::StatusOr<int64_t> MaxDecisionId(sqlite3* db) {
  SqlStatement q(db, "SELECT COALESCE(MAX(id), 0) FROM decisions");
  return QueryInt(q);
}

absl::Status InsertCommands(sqlite3* db, const std::vector<CommandRow>& commands) {
  if (commands.empty()) return absl::OkStatus();
  SqlStatement q(db,
                 "INSERT OR IGNORE INTO commands (id, run_id, incident_id, kind, payload, "
                 "created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
  return q.RunEach(commands, [](SqlStatement& q, const CommandRow& c) {
    q.Bind(1, c.id).Bind(2, c.run_id).Bind(3, c.incident_id).Bind(4, c.kind);
    q.BindBlob(5, c.payload).Bind(6, c.created_ms);
  });
}

absl::StatusOr<std::optional<CommandRow>> LatestCommand(sqlite3* db, int64_t incident_id) {
  SqlStatement q(db,
                 "SELECT id, run_id, incident_id, kind, payload, created_ms FROM commands WHERE "
                 "incident_id = ?1 ORDER BY created_ms DESC, id DESC LIMIT 1");
  q.Bind(1, incident_id);
  return q.First([](const SqlStatement& r) {
    return CommandRow{r.Text(0), r.Text(1), r.Int(2), r.Text(3), r.Blob(4), r.Int(5)};
  });
}

absl::Status InsertCommandAcks(sqlite3* db, const std::vector<CommandAckRow>& acks) {
  if (acks.empty()) return absl::OkStatus();
  SqlStatement q(db,
                 "INSERT OR IGNORE INTO command_acks (command_id, run_id, rank, status, message, "
                 "resumed_step, at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  return q.RunEach(acks, [](SqlStatement& q, const CommandAckRow& a) {
    q.Bind(1, a.command_id).Bind(2, a.run_id).Bind(3, int64_t{a.rank});
    q.Bind(4, int64_t{a.status}).Bind(5, a.message).Bind(6, a.resumed_step).Bind(7, a.at_ms);
  });
}

absl::StatusOr<std::vector<CommandAckRow>> CommandAcks(sqlite3* db, const std::string& run_id,
                                                       const std::string& command_id) {
  SqlStatement q(db,
                 "SELECT command_id, run_id, rank, status, message, resumed_step, at_ms FROM "
                 "command_acks WHERE command_id = ?1 AND run_id = ?2 ORDER BY at_ms");
  q.Bind(1, command_id).Bind(2, run_id);
  return q.All([](const SqlStatement& r) {
    return CommandAckRow{
        r.Text(0), r.Text(1), static_cast<int32_t>(r.Int(2)), static_cast<int>(r.Int(3)), r.Text(4),
        r.Int(5),  r.Int(6)};
  });
}

absl::Status InsertQuarantines(sqlite3* db, const std::vector<QuarantineRow>& quarantines) {
  if (quarantines.empty()) return absl::OkStatus();
  SqlStatement q(db,
                 "INSERT INTO quarantined_shards (run_id, first_shard, last_shard, incident_id, "
                 "decision_id, created_ms, name) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  return q.RunEach(quarantines, [](SqlStatement& q, const QuarantineRow& r) {
    q.Bind(1, r.run_id).Bind(2, static_cast<int64_t>(r.first));
    q.Bind(3, static_cast<int64_t>(r.last)).Bind(4, r.incident_id).Bind(5, r.decision_id);
    q.Bind(6, r.created_ms);
    // NULL for a range, as in the rows from before names (migration 4).
    if (r.name.empty()) {
      q.BindNull(7);
    } else {
      q.Bind(7, r.name);
    }
  });
}

absl::StatusOr<std::vector<QuarantineRow>> Quarantines(sqlite3* db, const std::string& run_id) {
  SqlStatement q(db,
                 "SELECT first_shard, last_shard, incident_id, decision_id, created_ms, name FROM "
                 "quarantined_shards WHERE run_id = ?1 ORDER BY id");
  q.Bind(1, run_id);
  return q.All([&](const SqlStatement& r) { return ReadQuarantine(r, run_id); });
}

}  // namespace trainwatch::server::rows
