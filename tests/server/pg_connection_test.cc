// The PostgreSQL backend's libpq layer (server/store/pg/) against real
// PostgreSQL 15 clusters (tests/testing/pg_cluster.h): statements and their
// rows, errors, synchronous commits, the ack rule, and a failover to the
// promoted standby.

#include "store/pg/pg_connection.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "testing/pg_cluster.h"
#include "testing/wait.h"

namespace trainwatch::server {
namespace {

using Catch::Matchers::Contains;
using testing::PgCluster;
using testing::WaitUntil;
using Node = PgCluster::Node;
using namespace std::chrono_literals;

std::unique_ptr<PgCluster> StartCluster(bool with_standby) {
  absl::StatusOr<std::unique_ptr<PgCluster>> c = PgCluster::Start(with_standby);
  if (!c.ok()) FAIL(c.status().ToString());
  return std::move(*c);
}

std::unique_ptr<PgConnection> Connect(const std::string& conninfo,
                                      PgCommitCounters* counters = nullptr) {
  absl::StatusOr<std::unique_ptr<PgConnection>> c = PgConnection::Connect(conninfo, counters);
  if (!c.ok()) FAIL(c.status().ToString());
  return std::move(*c);
}

PgRows Exec(PgConnection& c, const std::string& sql, const std::vector<PgParam>& params = {}) {
  absl::StatusOr<PgRows> r = c.Execute(sql, params);
  if (!r.ok()) FAIL(sql << ": " << r.status().ToString());
  return std::move(*r);
}

// The first cell as an integer; -1 when the query fails or has no row.
int64_t Count(PgConnection& c, const std::string& sql) {
  absl::StatusOr<PgRows> r = c.Execute(sql);
  if (!r.ok() || r->rows() == 0) return -1;
  return r->Int(0, 0).value_or(-1);
}

#define REQUIRE_OK(expr)                 \
  do {                                   \
    const absl::Status status_ = (expr); \
    INFO(status_.ToString());            \
    REQUIRE(status_.ok());               \
  } while (false)

// A commit run on a thread of its own, since it blocks while the standby is
// paused. Leaving the scope (also when a REQUIRE fails) resumes the standby
// and joins; should the commit still hang, killing the primary ends it.
class BackgroundCommit {
 public:
  BackgroundCommit(PgCluster& cluster, std::function<absl::Status()> commit)
      : cluster_(cluster), thread_([this, commit = std::move(commit)] {
          result_ = commit();
          done_ = true;
        }) {}
  ~BackgroundCommit() {
    cluster_.Resume(Node::kStandby).IgnoreError();
    if (!WaitUntil([&] { return done_.load(); }, 30s)) cluster_.Kill(Node::kPrimary).IgnoreError();
    thread_.join();
  }
  bool done() const { return done_; }
  // REQUIRES: done()
  const absl::Status& result() const { return result_; }

 private:
  PgCluster& cluster_;
  absl::Status result_;
  std::atomic<bool> done_{false};
  std::thread thread_;  // last: started once the rest is made
};

TEST_CASE("pg connection: inserts rows with parameters and reads them back", "[server][pg]") {
  auto cluster = StartCluster(/*with_standby=*/false);
  // The URI form; the reader uses keywords.
  auto writer = Connect(cluster->Uri(Node::kPrimary));
  auto reader = Connect(cluster->Conninfo(Node::kPrimary));
  Exec(*writer,
       "CREATE TABLE t (id bigint PRIMARY KEY, name text, score double precision, note text)");

  const std::string tricky = "it's \"quoted\"; DROP TABLE t; --";
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::string insert = "INSERT INTO t (id, name, score, note) VALUES ($1, $2, $3, $4)";
  CHECK(Exec(*writer, insert, {1, tricky, 2.5, nullptr}).affected() == 1);
  CHECK(Exec(*writer, insert, {int64_t{2}, "ünïcödé", 0.1, "x"}).affected() == 1);
  CHECK(Exec(*writer, insert, {kMax, "", -1e300, ""}).affected() == 1);

  PgRows rows = Exec(*reader, "SELECT id, name, score, note FROM t ORDER BY id");
  REQUIRE(rows.rows() == 3);
  REQUIRE(rows.columns() == 4);
  CHECK(rows.column_name(0) == "id");
  CHECK(rows.column_name(3) == "note");
  CHECK(rows.Int(0, 0) == 1);
  CHECK(rows.Text(0, 1) == tricky);  // a parameter is data, never SQL
  CHECK(rows.Text(0, 2) == "2.5");
  CHECK(rows.IsNull(0, 3));
  CHECK(rows.Text(1, 1) == "ünïcödé");
  CHECK(rows.Text(1, 2) == "0.1");  // the double came back exactly
  CHECK_FALSE(rows.IsNull(1, 3));
  CHECK(rows.Int(2, 0) == kMax);
  CHECK(rows.Text(2, 1).empty());
  CHECK_FALSE(rows.IsNull(2, 1));  // '' is not NULL
  CHECK(rows.Text(2, 2) == "-1e+300");
  CHECK_FALSE(rows.Int(0, 1).has_value());  // text is no integer

  PgRows one = Exec(*reader, "SELECT name FROM t WHERE id = $1", {2});
  REQUIRE(one.rows() == 1);
  CHECK(one.Text(0, 0) == "ünïcödé");
  CHECK(Exec(*reader, "SELECT name FROM t WHERE id = $1", {99}).rows() == 0);

  // A transaction's rows are seen by others only once committed, and never
  // when rolled back.
  REQUIRE_OK(writer->Begin());
  CHECK(writer->in_transaction());
  Exec(*writer, insert, {10, "rolled back", 0.0, nullptr});
  REQUIRE_OK(writer->Rollback());
  CHECK_FALSE(writer->in_transaction());
  REQUIRE_OK(writer->Begin());
  Exec(*writer, insert, {11, "committed", 0.0, nullptr});
  CHECK(Count(*reader, "SELECT count(*) FROM t WHERE id = 11") == 0);
  REQUIRE_OK(writer->Commit());
  CHECK(Count(*reader, "SELECT count(*) FROM t WHERE id IN (10, 11)") == 1);
  CHECK(Count(*reader, "SELECT max(id) FROM t WHERE id < 100") == 11);
  CHECK(writer->replication_doubts() == 0);
}

TEST_CASE("pg connection: a bad statement is a clear error and its transaction rolls back",
          "[server][pg]") {
  auto cluster = StartCluster(/*with_standby=*/false);
  auto conn = Connect(cluster->Conninfo(Node::kPrimary));
  Exec(*conn, "CREATE TABLE t (id bigint PRIMARY KEY)");

  absl::StatusOr<PgRows> r = conn->Execute("SELEC 1");
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(r.status().message()), Contains("syntax error") && Contains("42601"));
  r = conn->Execute("SELECT * FROM missing");
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(r.status().message()), Contains("\"missing\" does not exist"));
  r = conn->Execute("SELECT $1::bigint", {"not a number"});
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  Exec(*conn, "INSERT INTO t VALUES ($1)", {1});
  r = conn->Execute("INSERT INTO t VALUES ($1)", {1});
  CHECK(r.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK_THAT(std::string(r.status().message()), Contains("duplicate key"));

  // A failed statement dooms its transaction: COMMIT then rolls back, which
  // PostgreSQL reports as a success with the tag ROLLBACK.
  REQUIRE_OK(conn->Begin());
  Exec(*conn, "INSERT INTO t VALUES ($1)", {2});
  CHECK_FALSE(conn->Execute("INSERT INTO t VALUES ($1)", {1}).ok());
  const absl::Status commit = conn->Commit();
  CHECK(commit.code() == absl::StatusCode::kAborted);
  CHECK_THAT(std::string(commit.message()), Contains("rolled the transaction back"));
  CHECK_FALSE(conn->in_transaction());
  CHECK(Count(*conn, "SELECT count(*) FROM t") == 1);  // row 2 is not there

  CHECK(conn->Commit().code() == absl::StatusCode::kFailedPrecondition);  // none open
  REQUIRE_OK(conn->Begin());
  CHECK(conn->Begin().code() == absl::StatusCode::kFailedPrecondition);  // one open
  REQUIRE_OK(conn->Rollback());

  CHECK(conn->Execute("").status().code() == absl::StatusCode::kInvalidArgument);
  const auto bad = PgConnection::Connect("no_such_keyword=1");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()), Contains("no_such_keyword"));
}

// True once the process is gone (a zombie counts as gone).
bool ProcessGone(int pid) {
  return WaitUntil(
      [&] {
        std::string stat;
        if (FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r")) {
          char buf[512];
          stat.assign(buf, std::fread(buf, 1, sizeof(buf), f));
          std::fclose(f);
        }
        const size_t paren = stat.rfind(')');
        return paren == std::string::npos || stat.compare(paren, 3, ") Z") == 0;
      },
      10s);
}

TEST_CASE("pg connection: a dead server is a clear error", "[server][pg]") {
  auto cluster = StartCluster(/*with_standby=*/false);
  // Nothing listens on the standby's socket in a cluster without one.
  const auto none = PgConnection::Connect(cluster->Conninfo(Node::kStandby));
  CHECK(none.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(none.status().message()), Contains(".s.PGSQL.") && Contains("failed"));

  auto idle = Connect(cluster->Conninfo(Node::kPrimary));
  auto writing = Connect(cluster->Conninfo(Node::kPrimary));
  Exec(*idle, "CREATE TABLE t (id bigint)");
  REQUIRE_OK(writing->Begin());
  Exec(*writing, "INSERT INTO t VALUES (1)");
  REQUIRE_OK(cluster->Kill(Node::kPrimary));
  // Its backends exit once they notice the postmaster's death; until then
  // one might still take the COMMIT.
  REQUIRE(ProcessGone(writing->backend_pid()));
  REQUIRE(ProcessGone(idle->backend_pid()));

  const auto r = idle->Execute("SELECT 1");
  CHECK(r.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(r.status().message()), Contains("connection lost"));
  // A COMMIT whose answer never came may or may not have committed.
  const absl::Status commit = writing->Commit();
  CHECK(commit.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(commit.message()), Contains("outcome unknown"));
}

TEST_CASE("pg connection: a synchronous commit is on the standby when it returns", "[server][pg]") {
  auto cluster = StartCluster(/*with_standby=*/true);
  auto primary = Connect(cluster->Conninfo(Node::kPrimary));
  auto standby = Connect(cluster->Conninfo(Node::kStandby));
  PgRows sync = Exec(*primary, "SELECT application_name, sync_state FROM pg_stat_replication");
  REQUIRE(sync.rows() == 1);
  CHECK(sync.Text(0, 0) == PgCluster::kStandbyName);
  CHECK(sync.Text(0, 1) == "quorum");
  CHECK(Exec(*standby, "SELECT pg_is_in_recovery()").Text(0, 0) == "t");

  Exec(*primary, "CREATE TABLE t (id bigint PRIMARY KEY)");
  REQUIRE_OK(primary->Begin());
  for (int i = 1; i <= 3; ++i) Exec(*primary, "INSERT INTO t VALUES ($1)", {i});
  REQUIRE_OK(primary->Commit());
  Exec(*primary, "INSERT INTO t VALUES ($1)", {4});  // commits by itself
  // The commits waited for the standby's flush; its replay, which makes the
  // rows visible there, follows.
  CHECK(WaitUntil([&] { return Count(*standby, "SELECT count(*) FROM t") == 4; }, 20s, 20ms));
  CHECK(primary->replication_doubts() == 0);

  // The standby refuses writes: a failover's sign, so Unavailable.
  const auto write = standby->Execute("INSERT INTO t VALUES ($1)", {5});
  CHECK(write.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(write.status().message()), Contains("read-only"));
}

TEST_CASE("pg connection: a commit whose wait for the standby was cancelled is refused",
          "[server][pg][ack]") {
  auto cluster = StartCluster(/*with_standby=*/true);
  PgCommitCounters counters;
  auto writer = Connect(cluster->Conninfo(Node::kPrimary), &counters);
  auto admin = Connect(cluster->Conninfo(Node::kPrimary));
  Exec(*writer, "CREATE TABLE t (id bigint PRIMARY KEY)");

  // Blocks `commit` on the paused standby, cancels its wait from `admin`,
  // and returns what the writer's commit returned.
  const auto cancelled_commit = [&](std::function<absl::Status()> commit) {
    REQUIRE_OK(cluster->Pause(Node::kStandby));
    BackgroundCommit background(*cluster, std::move(commit));
    const std::string waiting =
        "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'";
    REQUIRE(WaitUntil(
        [&] {
          absl::StatusOr<PgRows> r = admin->Execute(waiting, {writer->backend_pid()});
          return r.ok() && r->Int(0, 0) == 1;
        },
        30s, 20ms));
    CHECK_FALSE(background.done());
    PgRows cancel = Exec(*admin, "SELECT pg_cancel_backend($1)", {writer->backend_pid()});
    CHECK(cancel.Text(0, 0) == "t");
    REQUIRE(WaitUntil([&] { return background.done(); }, 30s));
    return background.result();
  };

  // A transaction's COMMIT: PostgreSQL reports success (the row is
  // committed on the primary) with the WARNING; the layer refuses it.
  REQUIRE_OK(writer->Begin());
  Exec(*writer, "INSERT INTO t VALUES ($1)", {1});
  const absl::Status commit = cancelled_commit([&] { return writer->Commit(); });
  CHECK(commit.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(commit.message()),
             Contains("replication doubt") && Contains("canceling wait for synchronous"));
  CHECK(writer->replication_doubts() == 1);
  CHECK(counters.replication_doubts() == 1);
  CHECK_FALSE(writer->in_transaction());
  CHECK(Count(*admin, "SELECT count(*) FROM t WHERE id = 1") == 1);

  // A statement that commits by itself is held to the same rule.
  const absl::Status autocommit =
      cancelled_commit([&] { return writer->Execute("INSERT INTO t VALUES ($1)", {2}).status(); });
  CHECK(autocommit.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(autocommit.message()), Contains("replication doubt"));
  CHECK(writer->replication_doubts() == 2);
  CHECK(counters.replication_doubts() == 2);
  CHECK(Count(*admin, "SELECT count(*) FROM t") == 2);

  // The standby back, the doubtful rows reach it, and commits are OK again.
  REQUIRE_OK(cluster->Resume(Node::kStandby));
  REQUIRE_OK(writer->Begin());
  Exec(*writer, "INSERT INTO t VALUES ($1)", {3});
  REQUIRE_OK(writer->Commit());
  auto standby = Connect(cluster->Conninfo(Node::kStandby));
  CHECK(WaitUntil([&] { return Count(*standby, "SELECT count(*) FROM t") == 3; }, 20s, 20ms));
  CHECK(counters.replication_doubts() == 2);
}

TEST_CASE("pg connection: after kill -9 of the primary the promoted standby has every commit",
          "[server][pg][failover]") {
  auto cluster = StartCluster(/*with_standby=*/true);
  const std::string conninfo = cluster->MultiHostConninfo();
  auto conn = Connect(conninfo);
  CHECK(Exec(*conn, "SELECT pg_is_in_recovery()").Text(0, 0) == "f");  // it chose the primary
  Exec(*conn, "CREATE TABLE steps (step bigint PRIMARY KEY, payload text)");
  const std::string batch =
      "INSERT INTO steps SELECT s, 'step ' || s FROM generate_series($1::bigint, $2::bigint) s";
  int64_t acknowledged = 0;
  for (int b = 0; b < 20; ++b) {
    REQUIRE_OK(conn->Begin());
    CHECK(Exec(*conn, batch, {acknowledged + 1, acknowledged + 10}).affected() == 10);
    REQUIRE_OK(conn->Commit());
    acknowledged += 10;
  }

  REQUIRE_OK(cluster->Kill(Node::kPrimary));
  REQUIRE(ProcessGone(conn->backend_pid()));
  CHECK(conn->Execute("SELECT 1").status().code() == absl::StatusCode::kUnavailable);
  // Until the promotion no node takes writes, and read-write refuses them all.
  const auto before = PgConnection::Connect(conninfo);
  CHECK(before.status().code() == absl::StatusCode::kUnavailable);

  REQUIRE_OK(cluster->Promote(Node::kStandby));
  std::unique_ptr<PgConnection> again;
  REQUIRE(WaitUntil(
      [&] {
        auto c = PgConnection::Connect(conninfo);
        if (c.ok()) again = std::move(*c);
        return c.ok();
      },
      30s, 50ms));
  CHECK(Exec(*again, "SELECT pg_is_in_recovery()").Text(0, 0) == "f");
  PgRows seen = Exec(*again, "SELECT count(*), min(step), max(step) FROM steps");
  CHECK(seen.Int(0, 0) == acknowledged);
  CHECK(seen.Int(0, 1) == 1);
  CHECK(seen.Int(0, 2) == acknowledged);
  // It takes writes: no commit waits for the standby it no longer has.
  REQUIRE_OK(again->Begin());
  Exec(*again, batch, {acknowledged + 1, acknowledged + 10});
  REQUIRE_OK(again->Commit());
  CHECK(Count(*again, "SELECT count(*) FROM steps") == acknowledged + 10);
  CHECK(again->replication_doubts() == 0);
}

}  // namespace
}  // namespace trainwatch::server
