// The store's statement helper alone, on an in-memory database: typed binds
// and reads, reset and reuse, errors, and the transaction wrapper.

#include "store/row_readers.h"
#include "store/sql_statement.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "memory_db.h"

namespace trainwatch::server {
namespace {

using testing::MemoryDb;

constexpr char kTable[] = "CREATE TABLE t (i INTEGER, r REAL, s TEXT, b BLOB, sh TEXT)";

TEST_CASE("sql statement: binds each type and reads it back", "[server][sql]") {
  MemoryDb db;
  REQUIRE(db.Exec(kTable) == SQLITE_OK);
  SqlStatement insert(db.get(), "INSERT INTO t VALUES (?1, ?2, ?3, ?4, ?5)");
  REQUIRE(insert.status().ok());
  const std::string blob("a\0b", 3);
  insert.Bind(1, int64_t{1} << 40).Bind(2, 2.5).Bind(3, "text").BindBlob(4, blob);
  insert.BindShards(5, {3, 7, 9});
  REQUIRE(insert.Run().ok());
  insert.BindNull(1).Bind(2, std::nan("")).Bind(3, "").BindNull(4).BindShards(5, {});
  REQUIRE(insert.Run().ok());

  SqlStatement q(db.get(), "SELECT i, r, s, b, sh FROM t ORDER BY rowid");
  absl::Status st;
  REQUIRE(q.Next(&st));
  CHECK(q.Int(0) == int64_t{1} << 40);
  CHECK(q.Real(1) == 2.5);
  CHECK(q.Text(2) == "text");
  CHECK(q.Blob(3) == blob);  // the NUL survives
  CHECK(rows::ReadShards(q, 4) == std::vector<uint64_t>{3, 7, 9});
  REQUIRE(q.Next(&st));
  CHECK(q.IsNull(0));
  CHECK(q.IsNull(1));            // NaN is stored as NULL...
  CHECK(std::isnan(q.Real(1)));  // ...and NULL reads as NaN
  CHECK_FALSE(q.IsNull(2));
  CHECK(q.Blob(3).empty());
  CHECK(rows::ReadShards(q, 4).empty());
  CHECK_FALSE(q.Next(&st));
  CHECK(st.ok());
}

TEST_CASE("sql statement: run clears the bindings and reset rewinds a query", "[server][sql]") {
  MemoryDb db;
  REQUIRE(db.Exec(kTable) == SQLITE_OK);
  SqlStatement insert(db.get(), "INSERT INTO t (i) VALUES (?1)");
  REQUIRE(insert.Bind(1, int64_t{5}).Run().ok());
  REQUIRE(insert.Run().ok());  // nothing bound: NULL
  CHECK(db.Int("SELECT COUNT(*) FROM t WHERE i IS NULL") == 1);

  SqlStatement q(db.get(), "SELECT i FROM t WHERE i = ?1");
  q.Bind(1, int64_t{5});
  absl::Status st;
  REQUIRE(q.Next(&st));
  CHECK_FALSE(q.Next(&st));
  q.Reset();
  q.Bind(1, int64_t{5});
  REQUIRE(q.Next(&st));  // from the top again
  CHECK(q.Int(0) == 5);
}

TEST_CASE("sql statement: all - first and query int collect rows", "[server][sql]") {
  MemoryDb db;
  REQUIRE(db.Exec(kTable) == SQLITE_OK);
  SqlStatement insert(db.get(), "INSERT INTO t (i) VALUES (?1)");
  const std::vector<int64_t> values = {4, 2, 9};
  REQUIRE(insert.RunEach(values, [](SqlStatement& q, int64_t v) { q.Bind(1, v); }).ok());

  SqlStatement all(db.get(), "SELECT i FROM t ORDER BY i");
  auto rows = all.All([](const SqlStatement& q) { return q.Int(0); });
  REQUIRE(rows.ok());
  CHECK(*rows == std::vector<int64_t>{2, 4, 9});

  SqlStatement none(db.get(), "SELECT i FROM t WHERE i > 100");
  auto first = none.First([](const SqlStatement& q) { return q.Int(0); });
  REQUIRE(first.ok());
  CHECK_FALSE(first->has_value());

  SqlStatement max(db.get(), "SELECT MAX(i) FROM t");
  auto v = QueryInt(max);
  REQUIRE(v.ok());
  CHECK(*v == 9);
}

TEST_CASE("sql statement: bad sql is a prepare error everywhere", "[server][sql]") {
  MemoryDb db;
  SqlStatement q(db.get(), "SELEKT 1");
  REQUIRE_FALSE(q.status().ok());
  CHECK(std::string(q.status().message()).find("sqlite: prepare:") == 0);
  CHECK(std::string(q.status().message()).find("syntax error") != std::string::npos);
  q.Bind(1, int64_t{1});  // harmless
  CHECK(q.Run() == q.status());
  auto rows = q.All([](const SqlStatement& r) { return r.Int(0); });
  CHECK(rows.status() == q.status());
  const std::vector<int> one = {1};
  CHECK(q.RunEach(one, [](SqlStatement&, int) {}) == q.status());
}

TEST_CASE("sql statement: a failed step names the constraint", "[server][sql]") {
  MemoryDb db;
  REQUIRE(db.Exec("CREATE TABLE u (k INTEGER PRIMARY KEY)") == SQLITE_OK);
  SqlStatement insert(db.get(), "INSERT INTO u VALUES (?1)");
  REQUIRE(insert.Bind(1, int64_t{1}).Run().ok());
  absl::Status s = insert.Bind(1, int64_t{1}).Run();
  REQUIRE_FALSE(s.ok());
  CHECK(std::string(s.message()).find("sqlite: step:") == 0);
  CHECK(std::string(s.message()).find("UNIQUE") != std::string::npos);
  CHECK(insert.Bind(1, int64_t{2}).Run().ok());  // usable after the error
}

TEST_CASE("sql statement: a transaction commits or rolls back whole", "[server][sql]") {
  MemoryDb db;
  REQUIRE(db.Exec("CREATE TABLE u (k INTEGER PRIMARY KEY)") == SQLITE_OK);
  SqlStatement insert(db.get(), "INSERT INTO u VALUES (?1)");
  auto insert_all = [&](std::vector<int64_t> keys) {
    return InTransaction(db.get(), [&] {
      return insert.RunEach(keys, [](SqlStatement& q, int64_t k) { q.Bind(1, k); });
    });
  };
  REQUIRE(insert_all({1, 2}).ok());
  CHECK(db.Int("SELECT COUNT(*) FROM u") == 2);
  absl::Status s = insert_all({3, 1});  // 3 goes in, 1 fails: neither stays
  REQUIRE_FALSE(s.ok());
  CHECK(std::string(s.message()).find("UNIQUE") != std::string::npos);
  CHECK(db.Int("SELECT COUNT(*) FROM u") == 2);
  CHECK(db.Int("SELECT COUNT(*) FROM u WHERE k = 3") == 0);
  CHECK(sqlite3_get_autocommit(db.get()) != 0);  // no transaction left open
  CHECK(Exec(db.get(), "SELECT 1").ok());
  CHECK_FALSE(Exec(db.get(), "NOT SQL").ok());
}

TEST_CASE("sql statement: a cache keeps statements prepared - reset and unbound", "[server][sql]") {
  MemoryDb db;
  REQUIRE(db.Exec("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)") == SQLITE_OK);
  StatementCache cache(db.get());
  CHECK(StatementCache::Of(db.get()) == &cache);
  for (int i = 0; i < 100; ++i) {
    SqlStatement q(db.get(), "INSERT INTO t (k, v) VALUES (?1, ?2)");
    REQUIRE(q.Bind(1, int64_t{i}).Bind(2, "x").Run().ok());
  }
  CHECK(cache.prepared() == 1);
  CHECK(db.Int("SELECT COUNT(*) FROM t") == 100);
  {
    // Given back half read: the next user starts at the first row.
    SqlStatement q(db.get(), "SELECT k FROM t WHERE k >= ?1 ORDER BY k");
    q.Bind(1, int64_t{40});
    absl::Status st;
    REQUIRE(q.Next(&st));
    CHECK(q.Int(0) == 40);
  }
  {
    SqlStatement q(db.get(), "SELECT k FROM t WHERE k >= ?1 ORDER BY k");
    absl::Status st;
    // The old binding is gone: NULL matches nothing.
    CHECK_FALSE(q.Next(&st));
    CHECK(st.ok());
  }
  CHECK(cache.prepared() == 2);
  {
    // Two of the same text at once: the second is prepared anew.
    SqlStatement a(db.get(), "SELECT COUNT(*) FROM t");
    SqlStatement b(db.get(), "SELECT COUNT(*) FROM t");
    CHECK(QueryInt(a).value() == 100);
    CHECK(QueryInt(b).value() == 100);
  }
  CHECK(cache.prepared() == 4);
  {
    SqlStatement bad(db.get(), "NOT SQL");
    CHECK_FALSE(bad.status().ok());
  }
  // Batches of any size use the six texts of 32, 16, ... 1 rows.
  for (size_t n : {1, 7, 31, 32, 45, 63, 64, 100}) {
    std::vector<int64_t> keys;
    for (size_t i = 0; i < n; ++i) keys.push_back(1000 + static_cast<int64_t>(keys.size() + n * 1000));
    REQUIRE(InsertRows(db.get(), "INSERT INTO t (k, v) VALUES", 2, keys,
                       [](SqlStatement& q, int base, int64_t k) {
                         q.Bind(base + 1, k).Bind(base + 2, "y");
                       })
                .ok());
    CHECK(db.Int("SELECT COUNT(*) FROM t WHERE v = 'y' AND k >= " + std::to_string(1000 + n * 1000) +
                 " AND k < " + std::to_string(1000 + n * 1000 + n)) == static_cast<int64_t>(n));
  }
  CHECK(cache.prepared() == 4 + 6);
}

TEST_CASE("sql statement: without a cache every statement is its own", "[server][sql]") {
  MemoryDb db;
  CHECK(StatementCache::Of(db.get()) == nullptr);
  {
    StatementCache cache(db.get());
  }
  CHECK(StatementCache::Of(db.get()) == nullptr);
  SqlStatement q(db.get(), "SELECT 1");
  CHECK(QueryInt(q).value() == 1);
}

}  // namespace
}  // namespace trainwatch::server
