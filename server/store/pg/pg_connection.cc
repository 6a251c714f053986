#include "store/pg/pg_connection.h"

#include <libpq-fe.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/log.h"

namespace trainwatch::server {

namespace {

// What syncrep.c raises when a commit's wait for the standby is cancelled.
// The text is matched in English; ERRCODE_WARNING, the code it carries, is
// matched too, so a server whose lc_messages translates the text is still
// caught. Refusing a commit that some other generic WARNING accompanied costs
// a retry of an idempotent write; acknowledging a doubtful one may lose it.
constexpr char kSyncRepMessage[] = "canceling wait for synchronous replication";
constexpr char kSyncRepDetail[] = "might not have been replicated";
constexpr char kGenericWarningState[] = "01000";

std::string Field(const PGresult* r, int field) {
  const char* v = PQresultErrorField(r, field);
  return v != nullptr ? std::string(v) : std::string();
}

// libpq's own messages end with a newline and may span lines.
std::string ConnError(const PGconn* conn) {
  std::string msg = PQerrorMessage(conn);
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  return msg.empty() ? std::string("no message") : msg;
}

// A failed statement's status: the server's message and SQLSTATE, with the
// code a caller acts on (reconnect, retry, fix the SQL).
absl::Status ResultError(const PGconn* conn, const PGresult* r, absl::string_view what) {
  if (r == nullptr || PQstatus(conn) == CONNECTION_BAD) {
    return absl::UnavailableError(
        absl::StrCat("pg: ", what, ": connection lost: ", ConnError(conn)));
  }
  if (PQresultStatus(r) == PGRES_EMPTY_QUERY) {
    return absl::InvalidArgumentError(absl::StrCat("pg: ", what, ": empty statement"));
  }
  const std::string state = Field(r, PG_DIAG_SQLSTATE);
  std::string msg = Field(r, PG_DIAG_MESSAGE_PRIMARY);
  if (msg.empty()) msg = absl::StrCat(PQresStatus(PQresultStatus(r)), ": ", ConnError(conn));
  if (const std::string detail = Field(r, PG_DIAG_MESSAGE_DETAIL); !detail.empty()) {
    absl::StrAppend(&msg, " (", detail, ")");
  }
  const std::string text = absl::StrCat("pg: ", what, ": ", msg, " [SQLSTATE ", state, "]");
  // Class 08: connection exceptions; 57P0x: the server is shutting down or
  // starting; 25006: a write reached a standby (a failover happened).
  if (absl::StartsWith(state, "08") || absl::StartsWith(state, "57P") || state == "25006") {
    return absl::UnavailableError(text);
  }
  if (state == "40001" || state == "40P01") return absl::AbortedError(text);
  if (state == "23505") return absl::AlreadyExistsError(text);
  // Class 42: syntax, undefined objects, access rules; class 22: bad data.
  if (absl::StartsWith(state, "42") || absl::StartsWith(state, "22")) {
    return absl::InvalidArgumentError(text);
  }
  return absl::FailedPreconditionError(text);
}

}  // namespace

PgParam::PgParam(int64_t v) : text_(absl::StrCat(v)) {}

PgParam::PgParam(double v) {
  if (std::isnan(v)) {
    text_ = "NaN";
  } else if (std::isinf(v)) {
    text_ = v > 0 ? "Infinity" : "-Infinity";
  } else {
    text_ = absl::StrFormat("%.17g", v);
  }
}

PgRows::PgRows(PgRows&& other) noexcept : result_(std::exchange(other.result_, nullptr)) {}

PgRows& PgRows::operator=(PgRows&& other) noexcept {
  if (this != &other) {
    PQclear(result_);
    result_ = std::exchange(other.result_, nullptr);
  }
  return *this;
}

PgRows::~PgRows() { PQclear(result_); }

int PgRows::rows() const { return result_ != nullptr ? PQntuples(result_) : 0; }
int PgRows::columns() const { return result_ != nullptr ? PQnfields(result_) : 0; }

std::string PgRows::column_name(int col) const {
  const char* name = PQfname(result_, col);
  return name != nullptr ? std::string(name) : std::string();
}

int64_t PgRows::affected() const {
  int64_t n = 0;
  if (result_ == nullptr || !absl::SimpleAtoi(PQcmdTuples(result_), &n)) return 0;
  return n;
}

bool PgRows::IsNull(int row, int col) const { return PQgetisnull(result_, row, col) != 0; }

std::string PgRows::Text(int row, int col) const {
  return std::string(PQgetvalue(result_, row, col),
                     static_cast<size_t>(PQgetlength(result_, row, col)));
}

std::optional<int64_t> PgRows::Int(int row, int col) const {
  int64_t v = 0;
  if (IsNull(row, col) || !absl::SimpleAtoi(Text(row, col), &v)) return std::nullopt;
  return v;
}

absl::StatusOr<std::unique_ptr<PgConnection>> PgConnection::Connect(const std::string& conninfo,
                                                                    PgCommitCounters* counters) {
  // Parsed first so that a typo is InvalidArgument, not "unavailable". The
  // conninfo itself never appears in a message: it may hold a password.
  char* parse_error = nullptr;
  PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &parse_error);
  if (options == nullptr) {
    std::string msg = parse_error != nullptr ? parse_error : "out of memory";
    PQfreemem(parse_error);
    while (!msg.empty() && msg.back() == '\n') msg.pop_back();
    return absl::InvalidArgumentError(absl::StrCat("pg: bad conninfo: ", msg));
  }
  PQconninfoFree(options);

  PGconn* conn = PQconnectdb(conninfo.c_str());
  if (conn == nullptr) return absl::ResourceExhaustedError("pg: connect: out of memory");
  if (PQstatus(conn) != CONNECTION_OK) {
    absl::Status s = absl::UnavailableError(absl::StrCat("pg: connect: ", ConnError(conn)));
    PQfinish(conn);
    return s;
  }
  // The store's text is UTF-8 whatever the server's default.
  if (PQsetClientEncoding(conn, "UTF8") != 0) {
    absl::Status s =
        absl::FailedPreconditionError(absl::StrCat("pg: set client encoding: ", ConnError(conn)));
    PQfinish(conn);
    return s;
  }
  return std::unique_ptr<PgConnection>(new PgConnection(conn, counters));
}

PgConnection::PgConnection(PGconn* conn, PgCommitCounters* counters)
    : conn_(conn), counters_(counters), backend_pid_(PQbackendPID(conn)) {
  PQsetNoticeReceiver(conn_, &PgConnection::OnNotice, this);
}

PgConnection::~PgConnection() { PQfinish(conn_); }

void PgConnection::OnNotice(void* self, const PGresult* notice) {
  auto* c = static_cast<PgConnection*>(self);
  const std::string severity = Field(notice, PG_DIAG_SEVERITY_NONLOCALIZED);
  const std::string message = Field(notice, PG_DIAG_MESSAGE_PRIMARY);
  const std::string detail = Field(notice, PG_DIAG_MESSAGE_DETAIL);
  if (severity != "WARNING") return;  // NOTICE and below: "skipping", hints
  if (absl::StrContains(message, kSyncRepMessage) || absl::StrContains(detail, kSyncRepDetail) ||
      Field(notice, PG_DIAG_SQLSTATE) == kGenericWarningState) {
    c->replication_warning_ = true;
    c->replication_warning_text_ =
        detail.empty() ? message : absl::StrCat(message, " (", detail, ")");
    return;
  }
  LOG(WARNING) << "pg: server warning: " << message;
}

absl::StatusOr<PgRows> PgConnection::Run(absl::string_view sql, const std::vector<PgParam>& params,
                                         absl::string_view what) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const PgParam& p : params) values.push_back(p.is_null() ? nullptr : p.text().c_str());
  const std::string text(sql);
  replication_warning_ = false;
  PgRows rows(PQexecParams(conn_, text.c_str(), static_cast<int>(values.size()), nullptr,
                           values.data(), nullptr, nullptr, /*resultFormat=*/0));
  const ExecStatusType status =
      rows.result_ != nullptr ? PQresultStatus(rows.result_) : PGRES_FATAL_ERROR;
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    return ResultError(conn_, rows.result_, what);
  }
  // Checked after a success on purpose: that is the case PostgreSQL reports
  // as a commit and this layer must not.
  if (replication_warning_) {
    replication_doubts_.fetch_add(1, std::memory_order_relaxed);
    if (counters_ != nullptr) counters_->CountReplicationDoubt();
    return absl::UnavailableError(
        absl::StrCat("pg: ", what,
                     ": replication doubt: committed on the primary but maybe not on the standby; "
                     "do not acknowledge it: ",
                     replication_warning_text_));
  }
  return rows;
}

absl::StatusOr<PgRows> PgConnection::Execute(absl::string_view sql,
                                             const std::vector<PgParam>& params) {
  return Run(sql, params, "statement");
}

bool PgConnection::in_transaction() const {
  const PGTransactionStatusType t = PQtransactionStatus(conn_);
  return t == PQTRANS_INTRANS || t == PQTRANS_INERROR || t == PQTRANS_ACTIVE;
}

absl::Status PgConnection::Begin() {
  if (in_transaction()) return absl::FailedPreconditionError("pg: begin: a transaction is open");
  return Run("BEGIN", {}, "begin").status();
}

absl::Status PgConnection::Commit() {
  if (!in_transaction()) return absl::FailedPreconditionError("pg: commit: no transaction is open");
  absl::StatusOr<PgRows> r = Run("COMMIT", {}, "commit");
  if (!r.ok()) {
    if (PQstatus(conn_) == CONNECTION_BAD) {
      return absl::UnavailableError(
          absl::StrCat("pg: commit: outcome unknown: the connection was lost: ", ConnError(conn_)));
    }
    return r.status();
  }
  // COMMIT of a transaction in which a statement failed succeeds as a
  // ROLLBACK: nothing of it is stored.
  if (std::strcmp(PQcmdStatus(r->result_), "ROLLBACK") == 0) {
    return absl::AbortedError(
        "pg: commit: the server rolled the transaction back (a statement in it had failed)");
  }
  return absl::OkStatus();
}

absl::Status PgConnection::Rollback() {
  if (!in_transaction()) return absl::OkStatus();
  return Run("ROLLBACK", {}, "rollback").status();
}

}  // namespace trainwatch::server
