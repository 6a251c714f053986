// Fenced run ownership (store/pg/shard_leases.h) against a real PostgreSQL:
// one owner per shard, a takeover only after expiry and at a new epoch, the
// old owner's writes refused by the epoch check, a takeover waiting for the
// owner's write in flight, self-fencing on the owner's own clock, and leases
// that survive a failover of the database.
#include "store/pg/shard_leases.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "store/pg/pg_connection.h"
#include "testing/fake_clock.h"
#include "testing/pg_cluster.h"
#include "testing/wait.h"

namespace trainwatch::server {
namespace {

using Catch::Matchers::Contains;
using testing::FakeClock;
using testing::PgCluster;
using testing::WaitUntil;
using Node = PgCluster::Node;
using namespace std::chrono_literals;

constexpr int kShards = 8;

std::unique_ptr<PgCluster> StartCluster(bool with_standby = false) {
  auto c = PgCluster::Start(with_standby);
  if (!c.ok()) FAIL(c.status().ToString());
  return std::move(*c);
}

std::unique_ptr<PgConnection> Connect(const std::string& conninfo) {
  auto c = PgConnection::Connect(conninfo);
  if (!c.ok()) FAIL(c.status().ToString());
  return std::move(*c);
}

// A replica's leases, on a clock the test moves. A lease of a minute: no
// lease in these tests expires by itself, however loaded the machine;
// expiry is made by the test (Expire) where a case needs it.
std::unique_ptr<ShardLeases> Leases(const std::string& conninfo, const std::string& holder,
                                    FakeClock* clock, int64_t lease_ms = 60'000) {
  ShardLeaseOptions o;
  o.holder = holder;
  o.shards = kShards;
  o.lease_ms = lease_ms;
  o.margin_ms = 1'000;
  auto l = ShardLeases::Open(conninfo, o, clock);
  if (!l.ok()) FAIL(l.status().ToString());
  return std::move(*l);
}

int Acquire(ShardLeases& l) {
  auto n = l.AcquireAll();
  if (!n.ok()) FAIL(n.status().ToString());
  return *n;
}

// Every lease expired by the database's clock, as if its owner had stopped
// renewing a lease ago.
void Expire(PgConnection& admin) {
  REQUIRE(admin.Execute("UPDATE shard_lease SET expires_at_ms = 0").ok());
}

std::vector<int> AllShards() {
  std::vector<int> all;
  for (int s = 0; s < kShards; ++s) all.push_back(s);
  return all;
}

// One fenced write by `l`'s holder: the epoch check, a row, the commit.
absl::Status FencedWrite(ShardLeases& l, PgConnection& conn, int64_t value) {
  if (absl::Status s = conn.Begin(); !s.ok()) return s;
  if (absl::Status s = l.CheckFence(conn, AllShards()); !s.ok()) {
    conn.Rollback().IgnoreError();
    return s;
  }
  if (auto r = conn.Execute("INSERT INTO written VALUES ($1)", {value}); !r.ok()) {
    conn.Rollback().IgnoreError();
    return r.status();
  }
  return conn.Commit();
}

// Two replicas' leases on one database, each on a clock of its own, an
// admin connection, and a table the owner writes to through its fence.
struct TwoReplicas {
  TwoReplicas() : pg(StartCluster()), admin(Connect(pg->Conninfo(Node::kPrimary))) {
    REQUIRE(admin->Execute("CREATE TABLE written (v bigint)").ok());
    a = Leases(pg->Conninfo(Node::kPrimary), "replica-a", &clock_a);
    b = Leases(pg->Conninfo(Node::kPrimary), "replica-b", &clock_b);
  }
  std::unique_ptr<PgCluster> pg;
  std::unique_ptr<PgConnection> admin;
  FakeClock clock_a, clock_b;
  std::unique_ptr<ShardLeases> a, b;
};

TEST_CASE_METHOD(TwoReplicas,
                 "shard leases: one holder takes every shard and another stands by",
                 "[server][pg][lease]") {
  CHECK(Acquire(*a) == kShards);
  CHECK(Acquire(*b) == 0);
  for (int s = 0; s < kShards; ++s) {
    CHECK(a->epoch(s) == 1);
    CHECK(a->MayAcknowledge(s));
    CHECK_FALSE(b->MayAcknowledge(s));
  }
  // Renewing keeps the epoch: the owner's writes in flight stay valid.
  CHECK(Acquire(*a) == kShards);
  CHECK(a->epoch(3) == 1);
  CHECK(Acquire(*b) == 0);
  CHECK(b->owned() == 0);
  CHECK_FALSE(a->MayAcknowledge(kShards));  // out of range is never ours
  // Whom the standby names as the owner.
  auto holders = b->Holders();
  REQUIRE(holders.ok());
  CHECK(*holders == std::vector<std::string>{"replica-a"});
}

TEST_CASE_METHOD(TwoReplicas,
                 "shard leases: an expired lease is taken at a new epoch and fences the old owner",
                 "[server][pg][lease]") {
  auto a_writer = Connect(pg->Conninfo(Node::kPrimary));
  REQUIRE(Acquire(*a) == kShards);
  REQUIRE(FencedWrite(*a, *a_writer, 1).ok());

  Expire(*admin);
  // Expired by the database's clock: nobody is the owner until a takeover.
  auto holders = a->Holders();
  REQUIRE(holders.ok());
  CHECK(holders->empty());
  CHECK(Acquire(*b) == kShards);
  CHECK(b->epoch(0) == 2);
  holders = a->Holders();
  REQUIRE(holders.ok());
  CHECK(*holders == std::vector<std::string>{"replica-b"});
  // A's local deadline has not passed (its clock did not move), so only the
  // epoch in the database stops it: the write is refused, naming the owner.
  REQUIRE(a->MayAcknowledge(0));
  const absl::Status refused = FencedWrite(*a, *a_writer, 2);
  CHECK(absl::IsAborted(refused));
  CHECK_THAT(std::string(refused.message()), Contains("replica-b"));
  // A cannot take it back while B's lease runs, and then owns nothing.
  CHECK(Acquire(*a) == 0);
  CHECK_FALSE(a->MayAcknowledge(0));
  auto b_writer = Connect(pg->Conninfo(Node::kPrimary));
  CHECK(FencedWrite(*b, *b_writer, 3).ok());
  auto rows = admin->Execute("SELECT v FROM written ORDER BY v");
  REQUIRE(rows.ok());
  REQUIRE(rows->rows() == 2);
  CHECK(rows->Int(0, 0) == 1);
  CHECK(rows->Int(1, 0) == 3);
}

TEST_CASE_METHOD(TwoReplicas,
                 "shard leases: a takeover waits for the owner's write in flight",
                 "[server][pg][lease]") {
  auto a_writer = Connect(pg->Conninfo(Node::kPrimary));
  REQUIRE(Acquire(*a) == kShards);
  Expire(*admin);  // A's lease has run out by the database's clock ...

  // ... but A's transaction checked its epoch first: it holds the rows
  // FOR SHARE, and B's takeover must wait for its commit.
  REQUIRE(a_writer->Begin().ok());
  REQUIRE(a->CheckFence(*a_writer, AllShards()).ok());
  std::atomic<int> b_owned{-1};
  std::thread takeover([&] {
    auto n = b->AcquireAll();
    b_owned = n.ok() ? *n : -2;
  });
  const bool b_waits = WaitUntil(
      [&] {
        auto r = admin->Execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'");
        return r.ok() && r->Int(0, 0).value_or(0) >= 1;
      },
      30s);
  CHECK(b_waits);
  CHECK(b_owned == -1);
  REQUIRE(a_writer->Execute("INSERT INTO written VALUES (1)").ok());
  CHECK(a_writer->Commit().ok());
  takeover.join();
  CHECK(b_owned == kShards);
  CHECK(b->epoch(5) == 2);
  // A's next write sees the new epoch.
  CHECK(absl::IsAborted(FencedWrite(*a, *a_writer, 2)));
  auto count = admin->Execute("SELECT count(*) FROM written");
  REQUIRE(count.ok());
  CHECK(count->Int(0, 0) == 1);
}

TEST_CASE("shard leases: the owner fences itself on its own clock before the lease expires",
          "[server][pg][lease]") {
  auto pg = StartCluster();
  FakeClock clock;
  auto a = Leases(pg->Conninfo(Node::kPrimary), "replica-a", &clock, /*lease_ms=*/10'000);
  auto writer = Connect(pg->Conninfo(Node::kPrimary));
  REQUIRE(Acquire(*a) == kShards);
  // The deadline is the renewal's send time + lease - margin (9 s): paused
  // or cut off, the owner stops acknowledging a second before anyone may
  // take over, without a word from the database.
  clock.AdvanceMs(8'999);
  CHECK(a->MayAcknowledge(0));
  clock.AdvanceMs(1);
  CHECK_FALSE(a->MayAcknowledge(0));
  CHECK(a->owned() == kShards);  // still ours in the table, but fenced
  REQUIRE(writer->Begin().ok());
  const absl::Status fenced = a->CheckFence(*writer, {0});
  CHECK(absl::IsAborted(fenced));
  CHECK_THAT(std::string(fenced.message()), Contains("lapsed"));
  REQUIRE(writer->Rollback().ok());
  // A renewal that succeeds starts a new deadline from its own send time.
  CHECK(Acquire(*a) == kShards);
  CHECK(a->MayAcknowledge(0));
  CHECK(a->epoch(0) == 1);
}

TEST_CASE("shard leases: a restarted replica waits out its previous lease",
          "[server][pg][lease]") {
  auto pg = StartCluster();
  auto admin = Connect(pg->Conninfo(Node::kPrimary));
  FakeClock clock;
  auto before = Leases(pg->Conninfo(Node::kPrimary), "replica-a", &clock);
  REQUIRE(Acquire(*before) == kShards);
  // The same name in a new process: the old one may still be writing, so
  // its lease is not taken over by name.
  auto after = Leases(pg->Conninfo(Node::kPrimary), "replica-a", &clock);
  CHECK(Acquire(*after) == 0);
  Expire(*admin);
  CHECK(Acquire(*after) == kShards);
  CHECK(after->epoch(0) == 2);
}

TEST_CASE_METHOD(TwoReplicas,
                 "shard leases: a release lets the standby take over at once",
                 "[server][pg][lease]") {
  REQUIRE(Acquire(*a) == kShards);
  REQUIRE(a->Release().ok());
  CHECK_FALSE(a->MayAcknowledge(0));
  CHECK(a->owned() == 0);
  CHECK(Acquire(*b) == kShards);
  CHECK(b->epoch(7) == 2);
}

TEST_CASE("shard leases: every replica must agree on the shard count",
          "[server][pg][lease]") {
  auto pg = StartCluster();
  FakeClock clock;
  auto a = Leases(pg->Conninfo(Node::kPrimary), "replica-a", &clock);
  ShardLeaseOptions other;
  other.holder = "replica-b";
  other.shards = kShards * 2;
  auto b = ShardLeases::Open(pg->Conninfo(Node::kPrimary), other, &clock);
  REQUIRE_FALSE(b.ok());
  CHECK_THAT(std::string(b.status().message()), Contains("has 8 shards"));
  other.shards = kShards;
  other.holder = "";
  CHECK(absl::IsInvalidArgument(
      ShardLeases::Open(pg->Conninfo(Node::kPrimary), other, &clock).status()));
}

TEST_CASE("shard leases: a run's shard is a stable hash of its id", "[server][lease]") {
  // FNV-1a 64 of "run-a": fixed across versions and replicas, since two
  // replicas that disagreed would both own a run.
  CHECK(ShardLeases::ShardOf("run-a", 64) == 44);
  CHECK(ShardLeases::ShardOf("run-a", 8) == 4);
  std::set<int> seen;
  for (int i = 0; i < 1000; ++i) {
    const int s = ShardLeases::ShardOf("run-" + std::to_string(i), kShards);
    REQUIRE(s >= 0);
    REQUIRE(s < kShards);
    seen.insert(s);
  }
  CHECK(seen.size() == kShards);
}

TEST_CASE("shard leases: ownership survives a failover of the database",
          "[server][pg][lease]") {
  auto pg = StartCluster(/*with_standby=*/true);
  FakeClock clock_a, clock_b;
  auto a = Leases(pg->MultiHostConninfo(), "replica-a", &clock_a);
  REQUIRE(Acquire(*a) == kShards);
  // The lease rows were committed synchronously: the promoted standby has
  // them, where an advisory lock would have vanished with the primary.
  REQUIRE(pg->Kill(Node::kPrimary).ok());
  REQUIRE(pg->Promote(Node::kStandby).ok());
  // The owner reconnects to the new primary and keeps its shards at the
  // same epoch: only the database failed over, not the ownership.
  REQUIRE(a->Reconnect().ok());
  CHECK(Acquire(*a) == kShards);
  CHECK(a->epoch(0) == 1);
  auto b = Leases(pg->MultiHostConninfo(), "replica-b", &clock_b);
  CHECK(Acquire(*b) == 0);
  auto admin = Connect(pg->Conninfo(Node::kStandby));
  auto rows = admin->Execute("SELECT DISTINCT holder, epoch FROM shard_lease");
  REQUIRE(rows.ok());
  REQUIRE(rows->rows() == 1);
  CHECK(rows->Text(0, 0) == "replica-a");
  CHECK(rows->Int(0, 1) == 1);
}

}  // namespace
}  // namespace trainwatch::server
