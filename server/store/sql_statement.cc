#include "store/sql_statement.h"

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/base/const_init.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server {

absl::Status SqlError(sqlite3* db, absl::string_view what) {
  return absl::InternalError(absl::StrCat("sqlite: ", what, ": ", sqlite3_errmsg(db)));
}

absl::Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status s = absl::InternalError(absl::StrCat("sqlite: ", err ? err : "exec failed"));
    sqlite3_free(err);
    return s;
  }
  return absl::OkStatus();
}

absl::Status InTransaction(sqlite3* db, absl::FunctionRef<absl::Status()> body) {
  if (absl::Status s = Exec(db, "BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status s = body();
  if (s.ok()) s = Exec(db, "COMMIT");
  if (!s.ok()) Exec(db, "ROLLBACK").IgnoreError();
  return s;
}

namespace {

absl::Mutex attached_mu(absl::kConstInit);
// Few connections ever have a cache (one per store): a list, not a map.
std::vector<std::pair<sqlite3*, StatementCache*>>& Attached()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(attached_mu) {
  static auto* attached = new std::vector<std::pair<sqlite3*, StatementCache*>>();
  return *attached;
}

}  // namespace

StatementCache::StatementCache(sqlite3* db) : db_(db) {
  absl::MutexLock lock(&attached_mu);
  Attached().emplace_back(db, this);
}

StatementCache::~StatementCache() {
  {
    absl::MutexLock lock(&attached_mu);
    auto& a = Attached();
    a.erase(std::remove(a.begin(), a.end(), std::make_pair(db_, this)), a.end());
  }
  for (auto& [sql, stmts] : free_) {
    for (sqlite3_stmt* stmt : stmts) sqlite3_finalize(stmt);
  }
}

StatementCache* StatementCache::Of(sqlite3* db) {
  absl::MutexLock lock(&attached_mu);
  for (const auto& [d, cache] : Attached()) {
    if (d == db) return cache;
  }
  return nullptr;
}

sqlite3_stmt* StatementCache::Take(const std::string& sql) {
  auto it = free_.find(sql);
  if (it == free_.end() || it->second.empty()) return nullptr;
  sqlite3_stmt* stmt = it->second.back();
  it->second.pop_back();
  --kept_;
  return stmt;
}

void StatementCache::Give(std::string sql, sqlite3_stmt* stmt) {
  if (kept_ >= kMaxStatements) {
    sqlite3_finalize(stmt);
    return;
  }
  free_[std::move(sql)].push_back(stmt);
  ++kept_;
}

SqlStatement::SqlStatement(sqlite3* db, const std::string& sql)
    : db_(db), cache_(StatementCache::Of(db)) {
  if (cache_ != nullptr) {
    stmt_ = cache_->Take(sql);
    if (stmt_ != nullptr) {
      sql_ = sql;
      return;
    }
  }
  // PERSISTENT: a statement that will be kept tells SQLite not to take its
  // memory from the connection's small lookaside pool.
  const unsigned flags = cache_ != nullptr ? SQLITE_PREPARE_PERSISTENT : 0;
  if (sqlite3_prepare_v3(db, sql.c_str(), -1, flags, &stmt_, nullptr) != SQLITE_OK) {
    status_ = SqlError(db, "prepare");
    return;
  }
  if (cache_ != nullptr) {
    cache_->CountPrepare();
    sql_ = sql;
  }
}

SqlStatement::~SqlStatement() {
  if (cache_ != nullptr && stmt_ != nullptr && status_.ok()) {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    cache_->Give(std::move(sql_), stmt_);
    return;
  }
  sqlite3_finalize(stmt_);
}

SqlStatement& SqlStatement::Bind(int i, int64_t v) {
  sqlite3_bind_int64(stmt_, i, v);
  return *this;
}

SqlStatement& SqlStatement::Bind(int i, double v) {
  if (std::isnan(v)) return BindNull(i);
  sqlite3_bind_double(stmt_, i, v);
  return *this;
}

SqlStatement& SqlStatement::Bind(int i, absl::string_view v) {
  sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}

SqlStatement& SqlStatement::BindBlob(int i, absl::string_view v) {
  sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}

SqlStatement& SqlStatement::BindUncopied(int i, absl::string_view v) {
  sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
  return *this;
}

SqlStatement& SqlStatement::BindBlobUncopied(int i, absl::string_view v) {
  sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
  return *this;
}

SqlStatement& SqlStatement::BindNull(int i) {
  sqlite3_bind_null(stmt_, i);
  return *this;
}

SqlStatement& SqlStatement::BindShards(int i, const std::vector<uint64_t>& shards) {
  // Most steps name no shard: their "" needs no string built and copied.
  if (shards.empty()) return BindUncopied(i, "");
  // Written on the stack, for SQLite's one copy: a step's few shards need
  // no string of their own (a long list falls back to one).
  char text[256];
  char* end = text;
  for (size_t k = 0; k < shards.size(); ++k) {
    if (end + absl::numbers_internal::kFastToBufferSize + 1 > text + sizeof(text)) {
      return Bind(i, absl::StrJoin(shards, ";"));
    }
    if (k > 0) *end++ = ';';
    end = absl::numbers_internal::FastIntToBuffer(shards[k], end);
  }
  return Bind(i, absl::string_view(text, static_cast<size_t>(end - text)));
}

SqlStatement& SqlStatement::BindShardNames(int i, const std::vector<std::string>& names) {
  if (names.empty()) return BindNull(i);
  std::string json;
  core::AppendJsonStrings(&json, names);
  return Bind(i, json);
}

absl::Status SqlStatement::Run() {
  absl::Status s = RunRebinding();
  if (status_.ok()) sqlite3_clear_bindings(stmt_);
  return s;
}

absl::Status SqlStatement::RunRebinding() {
  if (!status_.ok()) return status_;
  const int rc = sqlite3_step(stmt_);
  sqlite3_reset(stmt_);
  return rc == SQLITE_DONE || rc == SQLITE_ROW ? absl::OkStatus() : SqlError(db_, "step");
}

bool SqlStatement::Next(absl::Status* st) {
  if (!status_.ok()) {
    *st = status_;
    return false;
  }
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc != SQLITE_DONE) *st = SqlError(db_, "query");
  return false;
}

void SqlStatement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

int64_t SqlStatement::Int(int col) const { return sqlite3_column_int64(stmt_, col); }

double SqlStatement::Real(int col) const {
  return IsNull(col) ? std::numeric_limits<double>::quiet_NaN() : sqlite3_column_double(stmt_, col);
}

bool SqlStatement::IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

std::string SqlStatement::Text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col))
           : std::string();
}

std::string SqlStatement::Blob(int col) const {
  const void* p = sqlite3_column_blob(stmt_, col);
  return p ? std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, col))
           : std::string();
}

std::string InsertSql(absl::string_view head, int width, size_t rows, absl::string_view tail) {
  std::string one = "(";
  for (int i = 0; i < width; ++i) absl::StrAppend(&one, i == 0 ? "?" : ", ?");
  one += ")";
  std::string sql(head);
  for (size_t r = 0; r < rows; ++r) absl::StrAppend(&sql, r == 0 ? " " : ", ", one);
  if (!tail.empty()) absl::StrAppend(&sql, " ", tail);
  return sql;
}

absl::StatusOr<int64_t> QueryInt(SqlStatement& q) {
  absl::StatusOr<std::optional<int64_t>> v =
      q.First([](const SqlStatement& r) { return r.Int(0); });
  if (!v.ok()) return v.status();
  return v->value_or(0);
}

}  // namespace trainwatch::server
