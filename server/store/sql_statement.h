// The store's one way to talk to SQLite: a prepared statement that owns its
// sqlite3_stmt, typed binds and column reads, and the transaction wrapper
// every multi-statement write goes through. Private to trainwatch::server.
//
// A statement whose prepare failed stays usable: binds do nothing and every
// step reports the prepare error, so a caller checks one status, not two.

#ifndef TRAINWATCH_SERVER_SQL_STATEMENT_H_
#define TRAINWATCH_SERVER_SQL_STATEMENT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct sqlite3;
struct sqlite3_stmt;

namespace trainwatch::server {

// "sqlite: <what>: <the connection's last error>".
absl::Status SqlError(sqlite3* db, absl::string_view what);

// Runs SQL text that returns no rows (pragmas, DDL, BEGIN/COMMIT).
absl::Status Exec(sqlite3* db, const char* sql);

// BEGIN IMMEDIATE, `body`, COMMIT; rolls back when `body` or the commit
// fails and returns that error. IMMEDIATE takes the write lock up front, so
// a batch never fails half way for want of it.
absl::Status InTransaction(sqlite3* db, absl::FunctionRef<absl::Status()> body);

// Statements kept prepared between uses on one connection. Parsing a
// 32-row INSERT costs more than running it, and the store's writer runs the
// same few statements at every commit, where parsing them was a large part
// of its CPU. While a cache is attached to a connection, a SqlStatement on
// it takes a free statement of the same text from the cache, and on
// destruction gives it back reset, its bindings cleared. At most
// kMaxStatements are kept; one more is simply finalized.
// Not thread-safe: like its connection, used by one thread at a time. The
// attachment itself is looked up under a lock, from any thread.
class StatementCache {
 public:
  static constexpr size_t kMaxStatements = 64;

  // Attaches to `db` until destroyed; destroy it before closing `db`.
  explicit StatementCache(sqlite3* db);
  ~StatementCache();
  StatementCache(const StatementCache&) = delete;
  StatementCache& operator=(const StatementCache&) = delete;

  // The cache attached to `db`, or nullptr.
  static StatementCache* Of(sqlite3* db);

  // A free prepared statement of this text, or nullptr.
  sqlite3_stmt* Take(const std::string& sql);
  // Back from a SqlStatement, reset and unbound.
  void Give(std::string sql, sqlite3_stmt* stmt);
  // Statements prepared on behalf of the cache's connection, over its life.
  int64_t prepared() const { return prepared_; }
  void CountPrepare() { ++prepared_; }

 private:
  sqlite3* db_;
  absl::flat_hash_map<std::string, std::vector<sqlite3_stmt*>> free_;
  size_t kept_ = 0;
  int64_t prepared_ = 0;
};

class SqlStatement {
 public:
  SqlStatement(sqlite3* db, const std::string& sql);
  ~SqlStatement();
  SqlStatement(const SqlStatement&) = delete;
  SqlStatement& operator=(const SqlStatement&) = delete;

  // The prepare's outcome.
  const absl::Status& status() const { return status_; }

  // Positional binds, from 1.
  SqlStatement& Bind(int i, int64_t v);
  SqlStatement& Bind(int i, double v);             // NaN binds NULL (SQLite would anyway)
  SqlStatement& Bind(int i, absl::string_view v);  // TEXT
  SqlStatement& BindBlob(int i, absl::string_view v);
  // TEXT and BLOB without SQLite's copy: the bytes must stay unchanged until
  // the statement's next Run() or Reset() (a row of the batch being written).
  SqlStatement& BindUncopied(int i, absl::string_view v);
  SqlStatement& BindBlobUncopied(int i, absl::string_view v);
  SqlStatement& BindNull(int i);
  // A shard list, as the TEXT "3;7;9".
  SqlStatement& BindShards(int i, const std::vector<uint64_t>& shards);
  // Shard names, as a JSON array of strings; NULL when there are none.
  SqlStatement& BindShardNames(int i, const std::vector<std::string>& names);

  // Steps once and resets (for writes; a row, if any, is dropped).
  absl::Status Run();
  // Run() for a statement whose every parameter is bound again before its
  // next run (InsertRows): the bindings are left to be overwritten, not
  // cleared one by one first (a 32-row insert of steps has 736).
  absl::Status RunRebinding();
  // Steps to the next row: true while rows remain; sets *st on error. After
  // the last row, Reset() before reusing the statement.
  bool Next(absl::Status* st);
  // Rewinds the statement and clears its bindings.
  void Reset();

  // Column reads of the current row, from 0.
  int64_t Int(int col) const;
  double Real(int col) const;  // NULL reads as NaN
  bool IsNull(int col) const;
  bool Bool(int col) const { return Int(col) != 0; }
  std::string Text(int col) const;
  std::string Blob(int col) const;
  // BindShards' and BindShardNames' columns are read by rows::ReadShards
  // and ReadShardNames (row_readers.h), for both backends.

  // Every row, each made by read(*this).
  template <typename Read>
  auto All(Read read) -> absl::StatusOr<std::vector<decltype(read(*this))>> {
    std::vector<decltype(read(*this))> out;
    absl::Status st;
    while (Next(&st)) out.push_back(read(*this));
    if (!st.ok()) return st;
    return out;
  }
  // The first row, if any.
  template <typename Read>
  auto First(Read read) -> absl::StatusOr<std::optional<decltype(read(*this))>> {
    std::optional<decltype(read(*this))> out;
    absl::Status st;
    if (Next(&st)) out = read(*this);
    if (!st.ok()) return st;
    return out;
  }
  // Binds each row with bind(*this, row) and runs it; stops at the first error.
  template <typename Row, typename BindRow>
  absl::Status RunEach(const std::vector<Row>& rows, BindRow bind) {
    if (!status_.ok()) return status_;
    for (const Row& row : rows) {
      bind(*this, row);
      if (absl::Status s = Run(); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  absl::Status status_;
  StatementCache* cache_;  // the connection's, or nullptr
  std::string sql_;        // the text, kept only to give the statement back
};

// Inserts `rows` many to a statement: `head` is the statement up to VALUES
// ("INSERT OR IGNORE INTO t (a, b) VALUES"), `width` the parameters of one
// row, and bind(q, base, row) binds a row's parameters base + 1 ..
// base + width. One step then writes up to kRowsPerInsert rows: a step, its
// cursor and its reset cost as much as the row's own b-tree insert (the
// per-record tables, rows::InsertSteps and InsertRankSteps, spent half their
// time there one row a step). `tail` follows the VALUES list.
// OR IGNORE applies row by row, within one statement as across statements.
inline constexpr size_t kRowsPerInsert = 32;
std::string InsertSql(absl::string_view head, int width, size_t rows, absl::string_view tail);

template <typename Row, typename BindRow>
absl::Status InsertRows(sqlite3* db, absl::string_view head, int width,
                        const std::vector<Row>& rows, BindRow bind, absl::string_view tail = "") {
  if (rows.empty()) return absl::OkStatus();
  // Statements of 32, 16, 8, 4, 2 and 1 rows: whatever the batch's size,
  // one of six texts per table, which a StatementCache keeps prepared.
  size_t first = 0;
  for (size_t n = kRowsPerInsert; n > 0 && first < rows.size(); n /= 2) {
    const size_t count = (rows.size() - first) / n;
    if (count == 0) continue;
    SqlStatement q(db, InsertSql(head, width, n, tail));
    for (size_t c = 0; c < count; ++c, first += n) {
      for (size_t k = 0; k < n; ++k) bind(q, static_cast<int>(k) * width, rows[first + k]);
      if (absl::Status s = q.RunRebinding(); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// A single integer result (COUNT, MAX, a pragma); 0 when there is no row.
absl::StatusOr<int64_t> QueryInt(SqlStatement& q);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_SQL_STATEMENT_H_
