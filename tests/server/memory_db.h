// An in-memory SQLite database for the store's unit tests, closed on
// destruction; optionally migrated to the shipped schema.

#ifndef TRAINWATCH_TESTS_SERVER_MEMORY_DB_H_
#define TRAINWATCH_TESTS_SERVER_MEMORY_DB_H_

#include <sqlite3.h>

#include <cstdint>
#include <string>

namespace trainwatch::testing {

class MemoryDb {
 public:
  MemoryDb() { sqlite3_open(":memory:", &db_); }
  ~MemoryDb() { sqlite3_close(db_); }
  MemoryDb(const MemoryDb&) = delete;
  MemoryDb& operator=(const MemoryDb&) = delete;
  sqlite3* get() const { return db_; }

  // Runs SQL text, returning sqlite3_exec's code.
  int Exec(const std::string& sql) const {
    return sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
  }
  // The first column of the first row as an integer (-1 when no row).
  int64_t Int(const std::string& sql) const {
    sqlite3_stmt* stmt = nullptr;
    int64_t v = -1;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) == SQLITE_OK &&
        sqlite3_step(stmt) == SQLITE_ROW) {
      v = sqlite3_column_int64(stmt, 0);
    }
    sqlite3_finalize(stmt);
    return v;
  }

 private:
  sqlite3* db_ = nullptr;
};

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_SERVER_MEMORY_DB_H_
