// The PostgreSQL backend's tools (pg_store.cc, pg_store_writes.cc): values
// to and from PostgreSQL's text format, one row of a result read by column
// (Cells, a cursor for row_readers.h), and the queries and batched inserts
// built on PgConnection.
#ifndef TRAINWATCH_SERVER_STORE_PG_PG_VALUES_H_
#define TRAINWATCH_SERVER_STORE_PG_PG_VALUES_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "store/pg/pg_connection.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server::pg {

using Params = std::vector<PgParam>;

// ---- values to and from PostgreSQL's text format

// bytea in its hex input format: serialized messages hold any byte.
inline PgParam Bytes(absl::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\\x";
  out.reserve(2 + 2 * bytes.size());
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return PgParam(out);
}

inline int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

inline PgParam Bool(bool v) { return PgParam(v ? "true" : "false"); }

// The same texts as the SQLite backend's (sql_statement.h): "3;7;9", and a
// JSON array of names, NULL when there are none.
inline PgParam ShardsText(const std::vector<uint64_t>& shards) {
  return PgParam(absl::StrJoin(shards, ";"));
}

inline PgParam ShardNamesText(const std::vector<std::string>& names) {
  if (names.empty()) return PgParam();
  std::string json;
  core::AppendJsonStrings(&json, names);
  return PgParam(json);
}

inline PgParam OrNull(bool present, PgParam value) { return present ? value : PgParam(); }

// Text an agent chose freely (a command acknowledgement's message and id):
// PostgreSQL's text holds no NUL byte, which valid UTF-8 may carry, and a
// batch failing on one would fail at every retry, every run's records in it
// with it. A NUL is stored as U+FFFD instead.
inline PgParam AgentText(absl::string_view text) {
  if (text.find('\0') == absl::string_view::npos) return PgParam(text);
  return PgParam(absl::StrReplaceAll(text, {{absl::string_view("\0", 1), "\xef\xbf\xbd"}}));
}

// One row of a result, read by column.
class Cells {
 public:
  Cells(const PgRows& rows, int row) : rows_(rows), row_(row) {}

  bool IsNull(int col) const { return rows_.IsNull(row_, col); }
  int64_t Int(int col) const { return rows_.Int(row_, col).value_or(0); }
  std::string Text(int col) const { return rows_.Text(row_, col); }
  // NULL reads as NaN, as in the SQLite backend.
  double Real(int col) const {
    double v = std::numeric_limits<double>::quiet_NaN();
    if (!IsNull(col) && !absl::SimpleAtod(Text(col), &v)) {
      v = std::numeric_limits<double>::quiet_NaN();
    }
    return v;
  }
  bool Bool(int col) const {
    const std::string t = Text(col);
    return t == "t" || t == "true";
  }
  // bytea arrives hex-encoded ("\x0a1b").
  std::string Blob(int col) const {
    const std::string t = Text(col);
    std::string out;
    if (t.size() < 2 || t[0] != '\\' || t[1] != 'x') return out;
    out.reserve((t.size() - 2) / 2);
    for (size_t i = 2; i + 1 < t.size(); i += 2) {
      const int hi = HexDigit(t[i]);
      const int lo = HexDigit(t[i + 1]);
      if (hi < 0 || lo < 0) break;
      out.push_back(static_cast<char>(hi * 16 + lo));
    }
    return out;
  }

 private:
  const PgRows& rows_;
  int row_;
};

// Runs a query and makes a value of each row with read(Cells).
template <typename Read>
auto Query(PgConnection& c, absl::string_view sql, const Params& params, Read read)
    -> absl::StatusOr<std::vector<decltype(read(std::declval<const Cells&>()))>> {
  absl::StatusOr<PgRows> rows = c.Execute(sql, params);
  if (!rows.ok()) return rows.status();
  std::vector<decltype(read(std::declval<const Cells&>()))> out;
  out.reserve(static_cast<size_t>(rows->rows()));
  for (int i = 0; i < rows->rows(); ++i) out.push_back(read(Cells(*rows, i)));
  return out;
}

template <typename Read>
auto QueryFirst(PgConnection& c, absl::string_view sql, const Params& params, Read read)
    -> absl::StatusOr<std::optional<decltype(read(std::declval<const Cells&>()))>> {
  absl::StatusOr<PgRows> rows = c.Execute(sql, params);
  if (!rows.ok()) return rows.status();
  if (rows->rows() == 0) return std::nullopt;
  return read(Cells(*rows, 0));
}

inline absl::StatusOr<int64_t> QueryInt(PgConnection& c, absl::string_view sql,
                                        const Params& params) {
  absl::StatusOr<PgRows> rows = c.Execute(sql, params);
  if (!rows.ok()) return rows.status();
  if (rows->rows() == 0) return 0;
  return rows->Int(0, 0).value_or(0);
}

inline absl::Status Run(PgConnection& c, absl::string_view sql, const Params& params) {
  return c.Execute(sql, params).status();
}

// Appends one element to a PostgreSQL array literal: quoted, so that any
// text (commas, braces, quotes, a bytea's backslash) stays one element.
inline void AppendArrayElement(std::string* array, const PgParam& value) {
  if (array->size() > 1) array->push_back(',');
  if (value.is_null()) {
    array->append("NULL");
    return;
  }
  array->push_back('"');
  for (char ch : value.text()) {
    if (ch == '"' || ch == '\\') array->push_back('\\');
    array->push_back(ch);
  }
  array->push_back('"');
}

// Inserts `rows` in statements of up to kRowsPerStatement: `head` is the
// INSERT up to its column list, `types` the type of each column, and
// fill(row, &params) appends a row's values. Each column goes as one array
// parameter, and the rows come out of unnest() in the batch's order: a
// statement of a few parameters, where a VALUES list of one placeholder per
// value cost PostgreSQL more to parse and plan than the rows' inserts
// (../shared/HA.md measured unnest ahead of multi-row VALUES too).
template <typename Row, typename Fill>
absl::Status InsertRows(PgConnection& c, absl::string_view head,
                        const std::vector<const char*>& types, const std::vector<Row>& rows,
                        Fill fill, absl::string_view tail) {
  constexpr size_t kRowsPerStatement = 5000;
  const size_t width = types.size();
  std::string sql = absl::StrCat(head, " SELECT * FROM unnest(");
  for (size_t k = 0; k < width; ++k) {
    absl::StrAppend(&sql, k == 0 ? "" : ", ", "$", k + 1, "::", types[k], "[]");
  }
  absl::StrAppend(&sql, ")", tail.empty() ? "" : " ", tail);
  Params row;
  std::vector<std::string> arrays(width);
  for (size_t first = 0; first < rows.size(); first += kRowsPerStatement) {
    const size_t n = std::min(kRowsPerStatement, rows.size() - first);
    for (std::string& a : arrays) a.assign("{");
    for (size_t r = 0; r < n; ++r) {
      row.clear();
      fill(rows[first + r], &row);
      for (size_t k = 0; k < width; ++k) AppendArrayElement(&arrays[k], row[k]);
    }
    Params params;
    params.reserve(width);
    for (std::string& a : arrays) params.emplace_back(a + "}");
    if (absl::Status s = Run(c, sql, params); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace trainwatch::server::pg

#endif  // TRAINWATCH_SERVER_STORE_PG_PG_VALUES_H_
