#include "store/store.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "store/pg/pg_store.h"
#include "store/sqlite_store.h"

namespace trainwatch::server {

void WriteBatch::clear() {
  runs.clear();
  steps.clear();
  rank_steps.clear();
  checkpoints.clear();
  events.clear();
  incidents.clear();
  command_acks.clear();
  decisions.clear();
  commands.clear();
  quarantines.clear();
  attempt_copies.clear();
  incarnations.clear();
  outbox.clear();
  engine_snapshots.clear();
}

bool Store::IsPostgres(const std::string& db) {
  if (absl::StartsWith(db, "postgresql://") || absl::StartsWith(db, "postgres://")) return true;
  // A libpq keyword string: "key=value" pairs. A file path may hold '=' too
  // ("runs/a=b.db"), so it takes a libpq connection keyword before the
  // first '=' to be one.
  const size_t eq = db.find('=');
  if (eq == std::string::npos) return false;
  absl::string_view key = absl::StripAsciiWhitespace(absl::string_view(db).substr(0, eq));
  for (absl::string_view known : {"host", "hostaddr", "port", "dbname", "user", "password",
                                  "service", "passfile", "sslmode", "application_name",
                                  "target_session_attrs", "connect_timeout", "options"}) {
    if (key == known) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& db,
                                                   const StoreOptions& options) {
  if (IsPostgres(db)) return PgStore::Open(db, options);
  return SqliteStore::Open(db, options);
}

}  // namespace trainwatch::server
