// Issue 16: rule-engine snapshots in the store, on the ingestor with a real
// store and a fake clock. A run's history is written twice, identically, to
// two databases, one with snapshots and one without; each is restarted and
// fed the same continuation, and every continuation step's stored decision
// and loss/EMA ratio, and every incident, must agree: a restart from a
// snapshot is a full replay, decision for decision. A damaged snapshot or
// one built under other rules is refused and the whole history replayed; a
// resume to an earlier step starts from an older snapshot.

#include <sqlite3.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "ingest/ingest.h"
#include "store/store.h"
#include "test_util.h"
#include "testing/fake_clock.h"
#include "testing/wait.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using testing::Step;

// A calm loss with a bad batch (a skip) and a lasting rise (a page) at the
// given steps.
double Loss(int64_t s, int64_t bad, int64_t rise) {
  double l = 2.5 + 0.02 * std::sin(0.37 * static_cast<double>(s)) - 1e-5 * s;
  if (s == bad) l += 3.0;
  if (s >= rise && s < rise + 400) l += 0.8;
  return l;
}
double Grad(int64_t s, int64_t bad) {
  return (s == bad ? 40.0 : 1.0) + 0.05 * std::cos(0.11 * static_cast<double>(s));
}

class NullListener : public IngestListener {
 public:
  void OnDurable(uint64_t, const std::string&, int32_t, int64_t) override {}
  void OnIncident(const IncidentRow&, IncidentChange) override {}
  void OnServerMessage(const std::string&, uint64_t, const std::string&) override {}
  void OnStreamFailed(uint64_t, const absl::Status&) override {}
};

// One database and the ingestor on it.
class Db {
 public:
  explicit Db(int64_t snapshot_steps) {
    options_.engine_snapshot_steps = snapshot_steps;
    auto s = Store::Open(dir_.File("tw.db"));
    REQUIRE(s.ok());
    store_ = *std::move(s);
  }
  ~Db() { Stop(); }
  void Start(const core::RuleConfig& rules = core::RuleConfig()) {
    Stop();
    IngestOptions o = options_;
    o.rules = rules;
    ingestor_ = std::make_unique<Ingestor>(store_.get(), o, &clock_);
    ingestor_->SetListener(&listener_);
    REQUIRE(ingestor_->Recover().ok());
    ingestor_->Start();
  }
  void Stop() {
    if (ingestor_) ingestor_->Stop();
    ingestor_.reset();
  }
  void Send(v1::AgentMessage m, uint64_t stream = 1) {
    IngestItem item;
    item.stream_id = stream;
    item.received_ms = clock_.NowMs();
    item.message = std::move(m);
    ingestor_->Submit(std::move(item));
  }
  void Train(const std::string& run, int64_t first, int64_t last, int64_t bad, int64_t rise,
             uint64_t stream = 1) {
    for (int64_t s = first; s <= last; ++s) {
      Send(Step(run, 0, 1, s, Loss(s, bad, rise), Grad(s, bad)), stream);
      if (s % 250 == 0) Send(testing::Checkpoint(run, s), stream);
    }
    ingestor_->Flush();
  }
  // Raw SQL on the database file, beside the store's connections.
  void Sql(const std::string& sql) {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(dir_.File("tw.db").c_str(), &db) == SQLITE_OK);
    char* err = nullptr;
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
    INFO(sql << ": " << (err ? err : ""));
    sqlite3_free(err);
    sqlite3_close(db);
    REQUIRE(rc == SQLITE_OK);
  }
  // What the continuation decided: each step's decision and ratio bits,
  // then each incident.
  std::string Decisions(const std::string& run, int64_t attempt, int64_t first) {
    std::string out;
    auto rows = store_->StepsBetween(run, attempt, first, 1 << 30);
    REQUIRE(rows.ok());
    for (const StepRow& r : *rows) {
      uint64_t bits;
      std::memcpy(&bits, &r.loss_ema_ratio, sizeof bits);
      absl::StrAppend(&out, r.step, ":", r.decision, ":", bits, " ");
    }
    IncidentFilter f;
    f.run_id = run;
    auto inc = store_->ListIncidents(f);
    REQUIRE(inc.ok());
    for (const IncidentRow& i : *inc) {
      absl::StrAppend(&out, "\n", i.id, " ", i.tier, " ", i.detection_step, " ", i.title);
    }
    return out;
  }
  IngestStats Stats() { return ingestor_->Stats(); }

  IngestOptions options_;
  testing::TempDir dir_;
  std::unique_ptr<Store> store_;
  testing::FakeClock clock_;
  NullListener listener_;
  std::unique_ptr<Ingestor> ingestor_;
};

constexpr int64_t kHistory = 3000;

TEST_CASE("engine snapshots: a restart from a snapshot decides as a full replay",
          "[server][snapshot]") {
  Db with(700), without(0);
  for (Db* db : {&with, &without}) {
    db->Start();
    db->Train("r", 0, kHistory - 1, /*bad=*/1500, /*rise=*/2900);
    db->Stop();  // a clean shutdown: `with` snapshots step 2999
  }
  core::RuleConfig rules;
  int64_t loaded = 1, refused = 0;
  SECTION("the shutdown's snapshot: nothing left to replay") {}
  SECTION("an older snapshot and the steps after it (as after a crash)") {
    with.Sql("DELETE FROM engine_snapshots WHERE step = 2999");
  }
  SECTION("a damaged snapshot is refused: the whole history is replayed") {
    with.Sql("UPDATE engine_snapshots SET state = substr(state, 1, 100) || x'00' || "
             "substr(state, 102) WHERE step = 2999");
    loaded = 0;
    refused = 1;
  }
  SECTION("a snapshot built under other rules is refused") {
    // A run keeps the rules it was judged by (run_rules.rules_json), whatever the
    // server's --rules of the day: the run's own record changes here.
    rules.tier1_grad_ratio += 0.5;
    for (Db* db : {&with, &without}) {
      db->Sql("UPDATE run_rules SET rules_json = '" + core::RuleConfigToJson(rules) + "'");
    }
    loaded = 0;
    refused = 1;
  }
  for (Db* db : {&with, &without}) {
    db->Start(rules);
    db->Train("r", kHistory, kHistory + 599, /*bad=*/kHistory + 300, /*rise=*/kHistory + 100);
  }
  CHECK(with.Stats().engine_snapshots_loaded_total == loaded);
  CHECK(with.Stats().engine_snapshots_refused_total == refused);
  CHECK(without.Stats().engine_snapshots_loaded_total == 0);
  const std::string a = with.Decisions("r", 0, kHistory);
  const std::string b = without.Decisions("r", 0, kHistory);
  CHECK(a == b);
  // The comparison saw decisions: a skip after the restart, and incidents.
  CHECK(a.find(absl::StrCat(kHistory + 300, ":", static_cast<int>(core::Decision::kSkipUpdate),
                            ":")) != std::string::npos);
  CHECK(a.find('\n') != std::string::npos);
}

TEST_CASE("engine snapshots: written every N steps and kept to the newest few",
          "[server][snapshot]") {
  Db db(500);
  db.Start();
  db.Train("r", 0, 2999, 1500, 100000);
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(db.dir_.File("tw.db").c_str(), &raw) == SQLITE_OK);
  auto steps = [&] {
    std::vector<int64_t> out;
    sqlite3_stmt* q = nullptr;
    REQUIRE(sqlite3_prepare_v2(raw, "SELECT step FROM engine_snapshots ORDER BY step", -1, &q,
                               nullptr) == SQLITE_OK);
    while (sqlite3_step(q) == SQLITE_ROW) out.push_back(sqlite3_column_int64(q, 0));
    sqlite3_finalize(q);
    return out;
  };
  // Snapshots at 499, 999, ..., 2999, of which the default keeps 3.
  CHECK(steps() == std::vector<int64_t>{1999, 2499, 2999});
  db.Train("r", 3000, 3100, 1500, 100000);
  db.Stop();  // the clean shutdown's snapshot
  CHECK(steps() == std::vector<int64_t>{2499, 2999, 3100});
  sqlite3_close(raw);
}

TEST_CASE("engine snapshots: a forced one waits for a tenth of the interval - a short run replays",
          "[server][snapshot]") {
  // Interval 700: a shutdown snapshots a run that evaluated 70 steps or more
  // since its last snapshot, and not one that evaluated fewer.
  Db with(700), without(0);
  for (Db* db : {&with, &without}) {
    db->Start();
    db->Train("short", 0, 68, 100000, 100000);
    db->Train("long", 0, 69, 100000, 100000, /*stream=*/2);
    db->Stop();
  }
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open(with.dir_.File("tw.db").c_str(), &raw) == SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  REQUIRE(sqlite3_prepare_v2(raw, "SELECT run_id, step FROM engine_snapshots ORDER BY run_id", -1,
                             &q, nullptr) == SQLITE_OK);
  std::vector<std::string> rows;
  while (sqlite3_step(q) == SQLITE_ROW) {
    rows.push_back(absl::StrCat(reinterpret_cast<const char*>(sqlite3_column_text(q, 0)), "@",
                                sqlite3_column_int64(q, 1)));
  }
  sqlite3_finalize(q);
  sqlite3_close(raw);
  CHECK(rows == std::vector<std::string>{"long@69"});
  // After the restart the short run is rebuilt by replaying its 69 steps,
  // the long one from its snapshot, and both decide as a full replay.
  for (Db* db : {&with, &without}) {
    db->Start();
    db->Train("short", 69, 1800, /*bad=*/1500, /*rise=*/100000);
    db->Train("long", 70, 1800, /*bad=*/1600, /*rise=*/100000, /*stream=*/2);
  }
  CHECK(with.Stats().engine_snapshots_loaded_total == 1);
  for (const char* run : {"short", "long"}) {
    INFO(run);
    const std::string a = with.Decisions(run, 0, 0);
    CHECK(a == without.Decisions(run, 0, 0));
    CHECK(a.find(absl::StrCat(":", static_cast<int>(core::Decision::kSkipUpdate), ":")) !=
          std::string::npos);
  }
}

TEST_CASE("engine snapshots: a resume before the newest snapshot starts from an older one",
          "[server][snapshot]") {
  Db with(700), without(0);
  for (Db* db : {&with, &without}) {
    db->Start();
    v1::AgentMessage hello = testing::Hello("r", 0, 1);
    hello.mutable_hello()->set_incarnation_id("job-1");
    db->Send(hello);
    db->Train("r", 0, kHistory - 1, 1500, 100000);
    // The job restarts from its checkpoint at 2500: a new attempt, its
    // engine rebuilt to 2500 (from the snapshot at 2099 in `with`).
    v1::AgentMessage again = testing::Hello("r", 0, 1);
    again.mutable_hello()->set_incarnation_id("job-2");
    again.mutable_hello()->set_resume_step(2500);
    db->Send(again, 2);
    db->Train("r", 2501, 2900, /*bad=*/2700, /*rise=*/2600, 2);
  }
  CHECK(with.Stats().engine_snapshots_loaded_total == 1);
  CHECK(with.Stats().resumes_total == 1);
  const std::string a = with.Decisions("r", 1, 2501);
  CHECK(a == without.Decisions("r", 1, 2501));
  CHECK(a.find(absl::StrCat("2700:", static_cast<int>(core::Decision::kSkipUpdate), ":")) !=
        std::string::npos);
}

// A restart rebuilds runs after the ingestor starts (snapshots off here: a
// full replay each). An agent's records for a run not yet rebuilt, queued
// before the writer thread even started, rebuild that run first: every
// decision and incident is the one a fully rebuilt server gives.
TEST_CASE(
    "engine snapshots: an early agent on a run not yet rebuilt is judged as after a full rebuild",
    "[server][snapshot][restart]") {
  constexpr int64_t kHistory = 3000;
  Db lazy(0), ref(0);
  for (Db* db : {&lazy, &ref}) {
    db->Start();
    for (const char* run : {"r0", "r1", "r2", "r3"}) {
      db->Train(run, 0, kHistory - 1, /*bad=*/1500, /*rise=*/2900);
    }
    db->Stop();
  }
  ref.Start();
  REQUIRE(testing::WaitUntil([&] { return ref.Stats().runs_rebuilding == 0; },
                             std::chrono::seconds(30)));
  ref.Train("r3", kHistory, kHistory + 599, /*bad=*/kHistory + 300, /*rise=*/kHistory + 100);

  lazy.ingestor_ = std::make_unique<Ingestor>(lazy.store_.get(), lazy.options_, &lazy.clock_);
  lazy.ingestor_->SetListener(&lazy.listener_);
  REQUIRE(lazy.ingestor_->Recover().ok());
  // Nothing rebuilt yet; the operator sees the stored runs, marked.
  CHECK(lazy.Stats().runs_rebuilding == 4);
  CHECK(lazy.Stats().runs_in_memory == 0);
  for (const RunView& s : lazy.ingestor_->views().All()) {
    CHECK(s.rebuilding);
    CHECK(s.row.last_step == kHistory - 1);
  }
  for (int64_t s = kHistory; s <= kHistory + 599; ++s) {
    lazy.Send(Step("r3", 0, 1, s, Loss(s, kHistory + 300, kHistory + 100),
                   Grad(s, kHistory + 300)));
  }
  lazy.ingestor_->Start();
  lazy.ingestor_->Flush();
  REQUIRE(testing::WaitUntil([&] { return lazy.Stats().runs_rebuilding == 0; },
                             std::chrono::seconds(30)));
  CHECK(lazy.Stats().runs_in_memory == 4);
  for (const RunView& s : lazy.ingestor_->views().All()) CHECK_FALSE(s.rebuilding);
  const std::string a = lazy.Decisions("r3", 0, kHistory);
  const std::string b = ref.Decisions("r3", 0, kHistory);
  CHECK(a.find(":1:") != std::string::npos);  // the continuation's bad batch was skipped
  CHECK(a == b);
}

}  // namespace
}  // namespace trainwatch::server
