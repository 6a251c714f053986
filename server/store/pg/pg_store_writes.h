// What a batch (Store::Write) writes to PostgreSQL, table by table, inside
// the transaction PgStore::Write opened and fenced.
#ifndef TRAINWATCH_SERVER_STORE_PG_PG_STORE_WRITES_H_
#define TRAINWATCH_SERVER_STORE_PG_PG_STORE_WRITES_H_

#include "absl/status/status.h"
#include "store/pg/pg_connection.h"
#include "store/store.h"

namespace trainwatch::server::pg {

// Every table of `batch`, in the order the SQLite backend writes them (the
// steps before the attempt copies, so a copy also takes the old attempt's
// steps still in the batch); `kept`: engine snapshots kept per attempt.
absl::Status WriteTables(PgConnection& c, const WriteBatch& batch, int kept);

}  // namespace trainwatch::server::pg

#endif  // TRAINWATCH_SERVER_STORE_PG_PG_STORE_WRITES_H_
