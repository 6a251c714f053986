// The PostgreSQL backend's schema and its migrations. Private to
// trainwatch::server.

#ifndef TRAINWATCH_SERVER_STORE_PG_PG_MIGRATIONS_H_
#define TRAINWATCH_SERVER_STORE_PG_PG_MIGRATIONS_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "store/pg/pg_connection.h"

namespace trainwatch::server {

// Every migration, in order.
absl::Span<const char* const> PgSchemaMigrations();

// Brings the database to the newest schema in one transaction and returns
// its version (the migrations applied, as table schema_version records
// them, like SQLite's user_version). The table is locked while it runs, so
// two trainwatchd starting at once migrate one after the other.
// FailedPrecondition for a schema newer than this trainwatchd's.
absl::StatusOr<int> MigratePgSchema(PgConnection& conn,
                                    absl::Span<const char* const> migrations = PgSchemaMigrations());

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_STORE_PG_PG_MIGRATIONS_H_
