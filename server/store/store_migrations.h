// The store's schema: the ordered migrations and the bookkeeping of how
// many ran (PRAGMA user_version). Private to trainwatch::server.

#ifndef TRAINWATCH_SERVER_STORE_MIGRATIONS_H_
#define TRAINWATCH_SERVER_STORE_MIGRATIONS_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"

struct sqlite3;

namespace trainwatch::server {

// The shipped migrations, oldest first.
absl::Span<const char* const> SchemaMigrations();

// Applies the migrations `db` has not run yet, each in its own transaction,
// and returns the version reached (migrations.size()). A database from a
// newer build (a higher version) is refused untouched. Tests pass a prefix
// of SchemaMigrations() to make a database of an older version.
absl::StatusOr<int> MigrateSchema(sqlite3* db,
                                  absl::Span<const char* const> migrations = SchemaMigrations());

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_STORE_MIGRATIONS_H_
