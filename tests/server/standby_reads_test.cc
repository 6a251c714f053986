// A standby replica's reads (api/standby_reads.h): what the owner writes to
// the store, seen by the standby's views at its next refresh, and each
// incident change told once to the listener, as the owner's writer tells
// its own. The owner's writes are made here through a Store of their own
// on the same database, as another process's would be, so each refresh has
// one known change to find.

#include "api/standby_reads.h"

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "store/store.h"
#include "test_util.h"
#include "testing/fake_clock.h"
#include "testing/wait.h"

namespace trainwatch::server {
namespace {

using testing::TempDir;

// What the listener was told, in order.
class Told : public IngestListener {
 public:
  void OnDurable(uint64_t, const std::string&, int32_t, int64_t) override {}
  void OnIncident(const IncidentRow& incident, IncidentChange change) override {
    changes.emplace_back(incident.id, change);
    states.push_back(incident.state);
  }
  void OnServerMessage(const std::string&, uint64_t, const std::string&) override {}
  void OnStreamFailed(uint64_t, const absl::Status&) override {}
  bool IsStreamOpen(uint64_t) override { return false; }

  std::vector<std::pair<int64_t, IncidentChange>> changes;
  std::vector<IncidentState> states;
};

// The owner's writes: a run row with its steps up to `last`, as its writer
// upserts them with every batch.
void WriteSteps(Store& store, const std::string& run, int64_t first, int64_t last) {
  WriteBatch b;
  RunRow row;
  row.run_id = run;
  row.last_step = last;
  row.created_ms = 1000;
  row.last_seen_ms = 1000 + last;
  b.runs.push_back(row);
  for (int64_t s = first; s <= last; ++s) {
    StepRow step;
    step.step = s;
    step.Set(core::Signal::kLoss, 2.5);
    step.received_ms = 1000 + s;
    b.steps.push_back({run, 0, step});
  }
  REQUIRE(store.Write(b).ok());
}

IncidentRow Incident(int64_t id, const std::string& run, int tier) {
  IncidentRow inc;
  inc.id = id;
  inc.run_id = run;
  inc.episode = static_cast<uint64_t>(id);
  inc.tier = tier;
  inc.state = tier == 2 ? IncidentState::kAwaitingDecision : IncidentState::kOpen;
  inc.title = "tier " + std::to_string(tier);
  inc.opened_ms = inc.updated_ms = 5000 + id;
  return inc;
}

void WriteIncident(Store& store, const IncidentRow& inc) {
  WriteBatch b;
  b.incidents.push_back(inc);
  REQUIRE(store.Write(b).ok());
}

int64_t LatestStep(const StandbyReads& reads, const std::string& run) {
  const std::optional<RunView> v = reads.views().Get(run);
  return v.has_value() && v->has_latest ? v->latest.step : -1;
}

TEST_CASE("standby reads: the owner's writes reach the views - each incident change told once",
          "[server][standby]") {
  TempDir dir;
  auto store = Store::Open(dir.File("tw.db"));
  REQUIRE(store.ok());
  auto owner_store = Store::Open(dir.File("tw.db"));
  REQUIRE(owner_store.ok());
  Store& owner = **owner_store;
  testing::FakeClock clock;
  Told told;
  StandbyReads reads(store->get(), &told, &clock, 1000);
  CHECK(reads.as_of_ms() == 0);

  WriteSteps(owner, "run-a", 0, 9);
  IncidentRow drift = Incident(1, "run-a", 2);
  WriteIncident(owner, drift);
  clock.AdvanceMs(500);
  REQUIRE(reads.Refresh().ok());
  CHECK(reads.as_of_ms() == clock.NowMs());
  CHECK(LatestStep(reads, "run-a") == 9);
  CHECK(reads.views().Get("run-a")->open_incidents[2] == 1);
  // What was there at the first refresh is not news: a watcher gets it as
  // its snapshot.
  CHECK(told.changes.empty());

  // New steps, a new run with a new incident.
  WriteSteps(owner, "run-a", 10, 19);
  WriteSteps(owner, "run-b", 0, 4);
  WriteIncident(owner, Incident(2, "run-b", 3));
  REQUIRE(reads.Refresh().ok());
  CHECK(LatestStep(reads, "run-a") == 19);
  CHECK(LatestStep(reads, "run-b") == 4);
  CHECK(reads.views().Get("run-b")->open_incidents[3] == 1);
  REQUIRE(told.changes.size() == 1);
  CHECK(told.changes[0] == std::make_pair(int64_t{2}, IncidentChange::kOpened));

  // Nothing written: nothing told.
  REQUIRE(reads.Refresh().ok());
  CHECK(told.changes.size() == 1);

  // New evidence on the open incident (its state unchanged), then its
  // dismissal, each found once, and the run's open count follows.
  drift.updated_ms += 100;
  drift.title = "tier 2, more evidence";
  WriteIncident(owner, drift);
  REQUIRE(reads.Refresh().ok());
  REQUIRE(told.changes.size() == 2);
  CHECK(told.changes[1] == std::make_pair(int64_t{1}, IncidentChange::kUpdated));
  drift.state = IncidentState::kDismissed;
  drift.updated_ms += 100;
  drift.closed_ms = drift.updated_ms;
  WriteIncident(owner, drift);
  REQUIRE(reads.Refresh().ok());
  REQUIRE(told.changes.size() == 3);
  CHECK(told.changes[2] == std::make_pair(int64_t{1}, IncidentChange::kStateChanged));
  CHECK(told.states[2] == IncidentState::kDismissed);
  CHECK(reads.views().Get("run-a")->open_incidents[2] == 0);
  CHECK(reads.views().Get("run-a")->incidents_total[2] == 1);
  REQUIRE(reads.Refresh().ok());
  CHECK(told.changes.size() == 3);
}

TEST_CASE("standby reads: an owner writing throughout - every incident told opened once and closed",
          "[server][standby]") {
  TempDir dir;
  auto store = Store::Open(dir.File("tw.db"));
  REQUIRE(store.ok());
  // Commits without fsync, many per refresh, so that some land between a
  // refresh's reads.
  StoreOptions fast;
  fast.synchronous = StoreOptions::Synchronous::kNormal;
  auto owner = Store::Open(dir.File("tw.db"), fast);
  REQUIRE(owner.ok());
  testing::FakeClock clock;
  Told told;
  StandbyReads reads(store->get(), &told, &clock, 1000);
  REQUIRE(reads.Refresh().ok());  // before the first incident: each is news
  // The owner opens incidents and closes each a few later while the
  // standby refreshes as fast as it can, so that writes land between a
  // refresh's reads.
  constexpr int64_t kIncidents = 2000;
  constexpr int64_t kLag = 3;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int64_t id = 1; id <= kIncidents; ++id) {
      WriteIncident(**owner, Incident(id, "run-a", 2));
      if (id > kLag) {
        IncidentRow closed = Incident(id - kLag, "run-a", 2);
        closed.state = IncidentState::kDismissed;
        closed.updated_ms = closed.closed_ms = 9000 + id;
        WriteIncident(**owner, closed);
      }
    }
    done = true;
  });
  int refreshes = 0;
  while (!done) {
    REQUIRE(reads.Refresh().ok());
    ++refreshes;
  }
  writer.join();
  REQUIRE(reads.Refresh().ok());
  REQUIRE(reads.Refresh().ok());
  INFO(refreshes << " refreshes while the owner wrote");
  std::map<int64_t, int> opened;
  std::map<int64_t, IncidentState> last;
  for (size_t i = 0; i < told.changes.size(); ++i) {
    const auto& [id, change] = told.changes[i];
    if (change == IncidentChange::kOpened) opened[id]++;
    last[id] = told.states[i];
  }
  for (int64_t id = 1; id <= kIncidents; ++id) {
    INFO("incident " << id);
    CHECK(opened[id] == 1);
    CHECK(last[id] == (id <= kIncidents - kLag ? IncidentState::kDismissed
                                               : IncidentState::kAwaitingDecision));
  }
}

TEST_CASE("standby reads: the thread refreshes until stopped", "[server][standby]") {
  TempDir dir;
  auto store = Store::Open(dir.File("tw.db"));
  REQUIRE(store.ok());
  auto owner = Store::Open(dir.File("tw.db"));
  REQUIRE(owner.ok());
  testing::FakeClock clock;
  Told told;
  StandbyReads reads(store->get(), &told, &clock, 20);
  reads.Start();
  WriteSteps(**owner, "run-a", 0, 9);
  CHECK(testing::WaitUntil([&] { return LatestStep(reads, "run-a") == 9; },
                           std::chrono::seconds(30)));
  reads.Stop();
  WriteSteps(**owner, "run-a", 10, 19);
  // Stopped: the views stay as they were.
  CHECK(testing::HoldsFor([&] { return LatestStep(reads, "run-a") == 9; },
                          std::chrono::milliseconds(200)));
}

}  // namespace
}  // namespace trainwatch::server
