// The store failing under the ingestor, with SQLite's own failures rather
// than a small filesystem: a full disk (the database quota, PRAGMA
// max_page_count, filled up by another connection), an I/O error (a VFS
// whose writes fail) and a write lock held past the busy timeout. In each,
// what the agent saw acknowledged is what the store holds after a restart,
// nothing twice, and a NaN sent while the store failed opens its tier 3
// incident once it works again.

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "ingest/ingest.h"
#include "store/store.h"
#include "test_util.h"
#include "testing/fake_clock.h"
#include "testing/wait.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;

constexpr char kRun[] = "run-durable";
constexpr int64_t kNanStep = 500;

double LossAt(int64_t s) {
  if (s == kNanStep) return std::numeric_limits<double>::quiet_NaN();
  return 2.5 + 0.01 * std::sin(static_cast<double>(s) * 1.7);
}

// What the ingestor tells the streams, as the streams would see it.
class RecordingListener : public IngestListener {
 public:
  void OnDurable(uint64_t stream, const std::string&, int32_t, int64_t step) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_.count(stream) > 0) acked_after_end_ = true;
    int64_t& d = durable_[stream];
    d = std::max(d, step);
  }
  void OnIncident(const IncidentRow&, IncidentChange) override {}
  void OnServerMessage(const std::string&, uint64_t, const std::string&) override {}
  void OnStreamFailed(uint64_t stream, const absl::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    ended_.insert(stream);
    last_failure_ = status;
  }

  int64_t durable(uint64_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = durable_.find(stream);
    return it == durable_.end() ? -1 : it->second;
  }
  bool ended(uint64_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_.count(stream) > 0;
  }
  size_t ended_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_.size();
  }
  bool acked_after_end() {
    std::lock_guard<std::mutex> lock(mu_);
    return acked_after_end_;
  }
  absl::Status last_failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_failure_;
  }

 private:
  std::mutex mu_;
  std::map<uint64_t, int64_t> durable_;
  std::set<uint64_t> ended_;
  bool acked_after_end_ = false;
  absl::Status last_failure_;
};

// The agent's transport as agent/src/sender.cc has it: records in step order
// on one stream; when the server ends it, a new stream, a Hello, and every
// record after the last acknowledged step again.
class ModelAgent {
 public:
  ModelAgent(Ingestor* ingestor, RecordingListener* listener)
      : ingestor_(ingestor), listener_(listener) {
    Connect();
  }
  void Send(int64_t step) {
    sent_ = step;
    Submit(step);
  }
  // Takes the acks; reconnects and re-sends if the stream was ended.
  void Pump() {
    durable_ = std::max(durable_, listener_->durable(stream_));
    if (!listener_->ended(stream_)) return;
    ++stream_;
    ++reconnects_;
    Connect();
    for (int64_t s = durable_ + 1; s <= sent_; ++s) Submit(s);
  }
  int64_t durable() const { return durable_; }
  int reconnects() const { return reconnects_; }

 private:
  void Connect() {
    IngestItem hello;
    hello.stream_id = stream_;
    hello.message = testing::Hello(kRun, 0, 1);
    ingestor_->Submit(std::move(hello));
  }
  void Submit(int64_t step) {
    IngestItem item;
    item.stream_id = stream_;
    item.message = testing::Step(kRun, 0, 1, step, LossAt(step), 1.0);
    ingestor_->Submit(std::move(item));
  }
  Ingestor* ingestor_;
  RecordingListener* listener_;
  uint64_t stream_ = 1;
  int64_t sent_ = -1;
  int64_t durable_ = -1;
  int reconnects_ = 0;
};

// A second connection to the database, as another process would have.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    REQUIRE(sqlite3_open(path.c_str(), &db_) == SQLITE_OK);
    sqlite3_busy_timeout(db_, 5000);
  }
  ~RawDb() { sqlite3_close(db_); }
  void Exec(const std::string& sql) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    INFO(sql << ": " << (err != nullptr ? err : ""));
    sqlite3_free(err);
    REQUIRE(rc == SQLITE_OK);
  }
  int64_t Int(const std::string& sql) {
    sqlite3_stmt* st = nullptr;
    REQUIRE(sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) == SQLITE_OK);
    int64_t v = -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
  }

 private:
  sqlite3* db_ = nullptr;
};

// A busy timeout short enough for a test to outlast.
StoreOptions ShortBusyTimeout() {
  StoreOptions options;
  options.busy_timeout_ms = 20;
  return options;
}

// Streams 1,000 steps: 0..399 with the store working, 400..699 (the NaN at
// 500) after `fail()`, the rest after `restore()`; then checks the store
// against what the agent saw acknowledged, after a restart.
void StreamThroughFailure(const std::string& db, const StoreOptions& store_options,
                          const std::function<void()>& fail,
                          const std::function<void()>& restore) {
  testing::FakeClock clock;
  RecordingListener listener;
  int64_t acked = -1;
  {
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(db, store_options);
    REQUIRE(store.ok());
    Ingestor ingestor(store->get(), IngestOptions{}, &clock);
    REQUIRE(ingestor.Recover().ok());
    ingestor.SetListener(&listener);
    ingestor.Start();
    ModelAgent agent(&ingestor, &listener);
    auto stream = [&](int64_t first, int64_t last) {
      for (int64_t s = first; s <= last; ++s) {
        agent.Send(s);
        if (s % 50 == 49) {
          ingestor.Flush();
          agent.Pump();
        }
      }
    };
    stream(0, 399);
    ingestor.Flush();
    agent.Pump();
    REQUIRE(agent.durable() == 399);
    fail();
    stream(400, 699);
    ingestor.Flush();
    agent.Pump();
    // Nothing the store refused was acknowledged, and the agent was told.
    CHECK(ingestor.Stats().store_errors_total > 0);
    CHECK(agent.durable() < 699);
    CHECK(agent.reconnects() > 0);
    CHECK(listener.last_failure().code() == absl::StatusCode::kUnavailable);
    restore();
    stream(700, 999);
    REQUIRE(testing::WaitUntil(
        [&] {
          ingestor.Flush();
          agent.Pump();
          return agent.durable() == 999;
        },
        std::chrono::seconds(20)));
    ingestor.Stop();
    acked = agent.durable();
  }
  CHECK_FALSE(listener.acked_after_end());
  // A restart: what the store holds is what the agent saw acknowledged.
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(db);
  REQUIRE(store.ok());
  Ingestor recovered(store->get(), IngestOptions{}, &clock);
  REQUIRE(recovered.Recover().ok());
  const std::vector<RunView> snap = recovered.views().All();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].row.last_step == acked);
  RawDb raw(db);
  CHECK(raw.Int("SELECT COUNT(*) FROM steps WHERE run_id = 'run-durable'") == acked + 1);
  CHECK(raw.Int("SELECT COUNT(*) FROM steps WHERE late = 1") == 0);  // all evaluated in order
  IncidentFilter f;
  f.run_id = kRun;
  absl::StatusOr<std::vector<IncidentRow>> incidents = (*store)->ListIncidents(f);
  REQUIRE(incidents.ok());
  int nan_incidents = 0;
  for (const IncidentRow& inc : *incidents) {
    INFO("incident " << inc.public_id() << " tier " << inc.tier << ": " << inc.title);
    if (inc.tier == 3 && inc.detection_step == kNanStep) ++nan_incidents;
  }
  CHECK(nan_incidents == 1);
}

TEST_CASE("store failure: disk full (the database quota) - acked equals stored - the NaN opens",
          "[server][durability]") {
  testing::TempDir dir;
  const std::string db = dir.File("tw.db");
  StoreOptions options;
  options.max_bytes = 1 << 20;
  RawDb other(db);
  StreamThroughFailure(
      db, options,
      [&] {
        // Another writer fills the quota; the store can allocate no page.
        other.Exec("CREATE TABLE ballast(b BLOB)");
        other.Exec(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 64) "
            "INSERT INTO ballast SELECT randomblob(65536) FROM n");
      },
      [&] { other.Exec("DROP TABLE ballast"); });  // its pages are free for reuse
}

TEST_CASE("store failure: a write lock held past the busy timeout - acked equals stored",
          "[server][durability]") {
  testing::TempDir dir;
  const std::string db = dir.File("tw.db");
  RawDb other(db);
  StreamThroughFailure(
      db, ShortBusyTimeout(), [&] { other.Exec("BEGIN IMMEDIATE"); }, [&] { other.Exec("ROLLBACK"); });
}

// ---- an I/O error: the default VFS, its writes failing on demand

std::atomic<bool> g_fail_writes{false};
sqlite3_vfs* g_real_vfs = nullptr;

struct ShimFile {
  sqlite3_file base;
  sqlite3_file* real;  // allocated right after this struct
};

sqlite3_file* Real(sqlite3_file* f) { return reinterpret_cast<ShimFile*>(f)->real; }

int ShimClose(sqlite3_file* f) { return Real(f)->pMethods->xClose(Real(f)); }
int ShimRead(sqlite3_file* f, void* p, int n, sqlite3_int64 off) {
  return Real(f)->pMethods->xRead(Real(f), p, n, off);
}
int ShimWrite(sqlite3_file* f, const void* p, int n, sqlite3_int64 off) {
  if (g_fail_writes) return SQLITE_IOERR_WRITE;
  return Real(f)->pMethods->xWrite(Real(f), p, n, off);
}
int ShimTruncate(sqlite3_file* f, sqlite3_int64 size) {
  return Real(f)->pMethods->xTruncate(Real(f), size);
}
int ShimSync(sqlite3_file* f, int flags) {
  if (g_fail_writes) return SQLITE_IOERR_FSYNC;
  return Real(f)->pMethods->xSync(Real(f), flags);
}
int ShimFileSize(sqlite3_file* f, sqlite3_int64* size) {
  return Real(f)->pMethods->xFileSize(Real(f), size);
}
int ShimLock(sqlite3_file* f, int l) { return Real(f)->pMethods->xLock(Real(f), l); }
int ShimUnlock(sqlite3_file* f, int l) { return Real(f)->pMethods->xUnlock(Real(f), l); }
int ShimCheckReservedLock(sqlite3_file* f, int* out) {
  return Real(f)->pMethods->xCheckReservedLock(Real(f), out);
}
int ShimFileControl(sqlite3_file* f, int op, void* arg) {
  return Real(f)->pMethods->xFileControl(Real(f), op, arg);
}
int ShimSectorSize(sqlite3_file* f) { return Real(f)->pMethods->xSectorSize(Real(f)); }
int ShimDeviceCharacteristics(sqlite3_file* f) {
  return Real(f)->pMethods->xDeviceCharacteristics(Real(f));
}
int ShimShmMap(sqlite3_file* f, int pg, int pgsz, int extend, void volatile** pp) {
  return Real(f)->pMethods->xShmMap(Real(f), pg, pgsz, extend, pp);
}
int ShimShmLock(sqlite3_file* f, int offset, int n, int flags) {
  return Real(f)->pMethods->xShmLock(Real(f), offset, n, flags);
}
void ShimShmBarrier(sqlite3_file* f) { Real(f)->pMethods->xShmBarrier(Real(f)); }
int ShimShmUnmap(sqlite3_file* f, int del) { return Real(f)->pMethods->xShmUnmap(Real(f), del); }

const sqlite3_io_methods kShimMethods = {
    2,  // up to the shared-memory methods, which WAL needs; no mmap
    ShimClose, ShimRead, ShimWrite, ShimTruncate, ShimSync, ShimFileSize, ShimLock, ShimUnlock,
    ShimCheckReservedLock, ShimFileControl, ShimSectorSize, ShimDeviceCharacteristics,
    ShimShmMap, ShimShmLock, ShimShmBarrier, ShimShmUnmap, nullptr, nullptr};

int ShimOpen(sqlite3_vfs* vfs, const char* name, sqlite3_file* f, int flags, int* out) {
  auto* shim = reinterpret_cast<ShimFile*>(f);
  shim->real = reinterpret_cast<sqlite3_file*>(shim + 1);
  const int rc = g_real_vfs->xOpen(g_real_vfs, name, shim->real, flags, out);
  shim->base.pMethods = shim->real->pMethods != nullptr ? &kShimMethods : nullptr;
  return rc;
}

// Registered as the default VFS while it lives.
class FailingVfs {
 public:
  FailingVfs() {
    g_real_vfs = sqlite3_vfs_find(nullptr);
    REQUIRE(g_real_vfs != nullptr);
    vfs_ = *g_real_vfs;
    vfs_.zName = "trainwatch-failing";
    vfs_.szOsFile = static_cast<int>(sizeof(ShimFile)) + g_real_vfs->szOsFile;
    vfs_.xOpen = ShimOpen;
    REQUIRE(sqlite3_vfs_register(&vfs_, /*makeDflt=*/1) == SQLITE_OK);
  }
  ~FailingVfs() {
    g_fail_writes = false;
    sqlite3_vfs_unregister(&vfs_);
    sqlite3_vfs_register(g_real_vfs, /*makeDflt=*/1);
  }

 private:
  sqlite3_vfs vfs_;
};

TEST_CASE("store failure: an I/O error on every write - acked equals stored - the NaN opens",
          "[server][durability]") {
  testing::TempDir dir;
  FailingVfs vfs;
  StreamThroughFailure(
      dir.File("tw.db"), StoreOptions{}, [] { g_fail_writes = true; },
      [] { g_fail_writes = false; });
}

TEST_CASE("store failure: the quota - full is a clear error - a negative one is refused",
          "[server][durability]") {
  testing::TempDir dir;
  const std::string db = dir.File("tw.db");
  StoreOptions options;
  options.max_bytes = 1;  // no page beyond the file's size
  // A new database has no room for its schema.
  const absl::Status fresh = Store::Open(db, options).status();
  INFO(fresh);
  CHECK(absl::StrContains(fresh.message(), "database or disk is full"));
  REQUIRE(Store::Open(db).ok());  // migrated, without the quota
  {
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(db, options);
    REQUIRE(store.ok());
    WriteBatch b;
    for (int64_t s = 0; s < 2000; ++s) {
      WriteBatch::Step row;
      row.run_id = kRun;
      row.step.step = s;
      b.steps.push_back(row);
    }
    const absl::Status st = (*store)->Write(b);
    CHECK(absl::StrContains(st.message(), "database or disk is full"));
  }
  StoreOptions negative;
  negative.max_bytes = -1;
  CHECK(Store::Open(db, negative).status().code() == absl::StatusCode::kInvalidArgument);
  std::string out;
  const int rc = testing::RunCommand(std::string(TRAINWATCHD_PATH) + " --db " + db +
                                         " --db_max_bytes=-5 --listen 127.0.0.1:0",
                                     "", &out);
  CHECK(rc == 2);
  CHECK(out.find("--db_max_bytes must be in [0, ") != std::string::npos);
}

// A decision queued while the store fails is answered with an error, and
// the incident's state in memory is the store's.
TEST_CASE("store failure: a decision that cannot be recorded is refused - not applied",
          "[server][durability]") {
  testing::TempDir dir;
  const std::string db = dir.File("tw.db");
  testing::FakeClock clock;
  RecordingListener listener;
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(db, ShortBusyTimeout());
  REQUIRE(store.ok());
  Ingestor ingestor(store->get(), IngestOptions{}, &clock);
  ingestor.SetListener(&listener);
  ingestor.Start();
  ModelAgent agent(&ingestor, &listener);
  for (int64_t s = 0; s <= 600; ++s) agent.Send(s);
  ingestor.Flush();
  IncidentFilter f;
  f.run_id = kRun;
  absl::StatusOr<std::vector<IncidentRow>> incidents = (*store)->ListIncidents(f);
  REQUIRE(incidents.ok());
  REQUIRE_FALSE(incidents->empty());
  const IncidentRow opened = incidents->front();
  RawDb other(db);
  other.Exec("BEGIN IMMEDIATE");
  auto decide = [&](const std::string& comment) {
    ApprovalRequest r;
    r.incident_id = opened.id;
    r.approve = false;
    r.actor = "alice";
    r.comment = comment;
    std::atomic<bool> answered{false};
    ApprovalOutcome outcome;
    ingestor.SubmitApproval(r, [&](ApprovalOutcome out) {
      outcome = std::move(out);
      answered = true;
    });
    REQUIRE(testing::WaitUntil([&] { return answered.load(); }, std::chrono::seconds(10)));
    return outcome;
  };
  const ApprovalOutcome refused = decide("store locked");
  CHECK(refused.status.code() == absl::StatusCode::kUnavailable);
  other.Exec("ROLLBACK");
  // Not dismissed in memory either: the same decision, now recorded, is
  // taken as the first one (not refused as "already dismissed").
  const ApprovalOutcome taken = decide("store back");
  INFO(taken.status);
  CHECK(taken.status.ok());
  CHECK(taken.state == IncidentState::kDismissed);
  ingestor.Stop();
}

}  // namespace
}  // namespace trainwatch::server
