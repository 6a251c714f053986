// The PostgreSQL backend's one way to talk to the server: a libpq connection
// that owns its PGconn, runs parameterized statements ($1, $2, ... in text
// format) and returns their rows, and begins and commits transactions.
// Private to trainwatch::server.
//
// The ack rule. When a commit's wait for the synchronous standby is
// cancelled (a cancel request, a statement_timeout, a terminated backend),
// PostgreSQL still reports the COMMIT as a success and only raises the
// WARNING "canceling wait for synchronous replication" (syncrep.c): the
// transaction is committed on the primary but may be missing from the
// standby, so a failover may lose it. A PgConnection listens for that
// warning and turns such a success into absl::UnavailableError naming
// "replication doubt": whatever returns OK here is on two machines, and the
// caller acknowledges nothing else. For the same reason this layer puts no
// timeout and no cancel on any statement: a commit waits as long as the
// standby takes.

#ifndef TRAINWATCH_SERVER_STORE_PG_PG_CONNECTION_H_
#define TRAINWATCH_SERVER_STORE_PG_PG_CONNECTION_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

struct pg_conn;
struct pg_result;

namespace trainwatch::server {

// Commits refused by the ack rule, counted across every connection that
// shares the object (a store's, over reconnects), read at scrape time.
// Thread-safe.
class PgCommitCounters {
 public:
  void CountReplicationDoubt() { replication_doubts_.fetch_add(1, std::memory_order_relaxed); }
  int64_t replication_doubts() const { return replication_doubts_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> replication_doubts_{0};
};

// One statement parameter, sent in text format: PostgreSQL parses it as its
// placeholder's type, so "42" fills a bigint. Default-constructed or from
// nullptr it is NULL.
class PgParam {
 public:
  PgParam() = default;
  PgParam(std::nullptr_t) {}  // NOLINT(runtime/explicit): NULL reads naturally
  PgParam(absl::string_view text) : text_(std::string(text)) {}  // NOLINT
  PgParam(const char* text) : text_(std::string(text)) {}        // NOLINT
  PgParam(const std::string& text) : text_(text) {}              // NOLINT
  PgParam(int64_t v);                                            // NOLINT
  PgParam(int v) : PgParam(static_cast<int64_t>(v)) {}           // NOLINT
  // Shortest text that reads back as the same double; NaN and the
  // infinities in PostgreSQL's spelling.
  PgParam(double v);  // NOLINT

  bool is_null() const { return !text_.has_value(); }
  const std::string& text() const { return *text_; }  // REQUIRES: !is_null()

 private:
  std::optional<std::string> text_;
};

// A statement's result: its rows in text format (owned PGresult), and how
// many rows a write touched.
class PgRows {
 public:
  PgRows(PgRows&&) noexcept;
  PgRows& operator=(PgRows&&) noexcept;
  ~PgRows();

  int rows() const;
  int columns() const;
  std::string column_name(int col) const;
  // Rows an INSERT/UPDATE/DELETE touched (its command tag's count), else 0.
  int64_t affected() const;

  // Cell reads, rows and columns from 0. REQUIRES: in range.
  bool IsNull(int row, int col) const;
  std::string Text(int row, int col) const;  // NULL reads as ""
  // The cell as an integer; nullopt for NULL or text that is not one.
  std::optional<int64_t> Int(int row, int col) const;

 private:
  friend class PgConnection;
  explicit PgRows(pg_result* result) : result_(result) {}
  pg_result* result_;
};

// One connection. Not thread-safe: used by one thread at a time, like a
// SqlStatement's sqlite3; backend_pid() and the counters may be read from
// any thread.
class PgConnection {
 public:
  // Connects with a conninfo: a URI ("postgresql://user@host/db",
  // "postgresql:///db?host=/run/dir&port=5433") or keywords ("host=a,b
  // port=5432,5433 dbname=x target_session_attrs=read-write", which reaches
  // whichever listed server is the primary). `counters`, when set, must
  // outlive the connection. UnavailableError when no server answers.
  static absl::StatusOr<std::unique_ptr<PgConnection>> Connect(
      const std::string& conninfo, PgCommitCounters* counters = nullptr);
  ~PgConnection();
  PgConnection(const PgConnection&) = delete;
  PgConnection& operator=(const PgConnection&) = delete;

  // Runs one statement with $N placeholders filled from `params` and returns
  // its rows (none for a write). Outside a transaction the statement commits
  // by itself, so the ack rule applies to it as to Commit(). Errors:
  // UnavailableError when the connection is lost (the statement may or may
  // not have run) or the ack rule refused it; otherwise a status naming the
  // server's message and SQLSTATE (InvalidArgument for SQL the server could
  // not parse or plan, AlreadyExists for a unique violation, Aborted for a
  // serialization failure or deadlock, FailedPrecondition for the rest).
  absl::StatusOr<PgRows> Execute(absl::string_view sql, const std::vector<PgParam>& params = {});

  // BEGIN. FailedPrecondition if a transaction is already open.
  absl::Status Begin();
  // COMMIT. OK only when the transaction is committed and, where the server
  // replicates synchronously, on the standby too. UnavailableError naming
  // "replication doubt" under the ack rule (the transaction is committed on
  // the primary: do not acknowledge it, and do not count it lost either);
  // UnavailableError naming "outcome unknown" when the connection was lost
  // during the COMMIT; AbortedError when the server rolled the transaction
  // back instead (a statement in it had failed). The transaction is over
  // whatever the result.
  absl::Status Commit();
  // ROLLBACK; OK when no transaction is open.
  absl::Status Rollback();

  // True between Begin() and the end of its transaction.
  bool in_transaction() const;
  // The server process serving this connection (pg_stat_activity.pid).
  int backend_pid() const { return backend_pid_; }
  // Statements or commits this connection refused under the ack rule.
  int64_t replication_doubts() const { return replication_doubts_.load(std::memory_order_relaxed); }

 private:
  PgConnection(pg_conn* conn, PgCommitCounters* counters);
  // libpq's notice receiver: flags the sync-replication warning.
  static void OnNotice(void* self, const pg_result* notice);
  // Sends one statement and checks its result and the ack rule.
  absl::StatusOr<PgRows> Run(absl::string_view sql, const std::vector<PgParam>& params,
                             absl::string_view what);

  pg_conn* conn_;
  PgCommitCounters* counters_;  // may be null
  int backend_pid_;
  // Set by OnNotice during the statement in flight; cleared before each.
  bool replication_warning_ = false;
  std::string replication_warning_text_;
  std::atomic<int64_t> replication_doubts_{0};
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_STORE_PG_PG_CONNECTION_H_
