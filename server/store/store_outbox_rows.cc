#include "store/store_outbox_rows.h"

#include "absl/strings/str_cat.h"
#include "store/row_readers.h"
#include "store/sql_statement.h"

namespace trainwatch::server::rows {

namespace {



}  // namespace

absl::Status InsertOutbox(sqlite3* db, const std::vector<OutboxRow>& pages) {
  if (pages.empty()) return absl::OkStatus();
  SqlStatement q(db,
                 "INSERT OR IGNORE INTO outbox (incident_id, channel, kind, payload, state, "
                 "attempts, next_attempt_ms, created_ms) VALUES (?1, ?2, ?3, ?4, 'pending', 0, "
                 "?5, ?6)");
  return q.RunEach(pages, [](SqlStatement& q, const OutboxRow& o) {
    q.Bind(1, o.incident_id).Bind(2, o.channel).Bind(3, o.kind).BindBlob(4, o.payload);
    q.Bind(5, o.next_attempt_ms).Bind(6, o.created_ms);
  });
}

absl::StatusOr<std::vector<OutboxRow>> DueOutbox(sqlite3* db, int64_t now_ms, int limit) {
  SqlStatement q(db, absl::StrCat("SELECT ", kOutboxColumns,
                                  " FROM outbox WHERE state = 'pending' AND next_attempt_ms <= ?1 "
                                  "ORDER BY id LIMIT ?2"));
  q.Bind(1, now_ms).Bind(2, int64_t{limit});
  return q.All(ReadOutbox<SqlStatement>);
}

absl::StatusOr<std::vector<OutboxRow>> OutboxOfIncident(sqlite3* db, int64_t incident_id) {
  SqlStatement q(db, absl::StrCat("SELECT ", kOutboxColumns,
                                  " FROM outbox WHERE incident_id = ?1 ORDER BY id"));
  q.Bind(1, incident_id);
  return q.All(ReadOutbox<SqlStatement>);
}

absl::Status MarkOutbox(sqlite3* db, int64_t id, bool sent, int attempts, int64_t next_attempt_ms,
                        const std::string& error, int64_t now_ms) {
  SqlStatement q(db,
                 "UPDATE outbox SET state = ?2, attempts = ?3, next_attempt_ms = ?4, "
                 "last_error = ?5, sent_ms = ?6 WHERE id = ?1");
  q.Bind(1, id).Bind(2, absl::string_view(sent ? "sent" : "pending")).Bind(3, int64_t{attempts});
  q.Bind(4, next_attempt_ms).Bind(5, error).Bind(6, sent ? now_ms : int64_t{0});
  return q.Run();
}

}  // namespace trainwatch::server::rows
