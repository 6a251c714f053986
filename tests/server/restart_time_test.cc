// Issue 16: a restart serves in under a second whatever the history (8 runs
// x 500k steps stored). Held here in proportion on a smaller database, 8
// runs x 25k steps, which a full replay of every run (today's restart without
// snapshots, ~0.8 s here, more on a loaded machine) cannot meet: the server
// must be up within kAllowance of an empty database's start. The figure for
// the full size is bench/restart/restart_bench.sh's.

#include <chrono>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "server_fixture.h"
#include "store/store.h"
#include "test_util.h"
#include "testing/history_writer.h"
#include "testing/wait.h"
#include "trainwatch/v1/operator.grpc.pb.h"

namespace trainwatch::server {
namespace {

// Beyond an empty database's start: 8 snapshots to read and decode (~2 ms
// each) and slack for a busy 2-core machine.
constexpr double kAllowanceSeconds = 0.3;

double SecondsToServe(const std::string& db, int64_t snapshot_steps) {
  ServerOptions options;
  options.ingest.engine_snapshot_steps = snapshot_steps;
  const auto t0 = std::chrono::steady_clock::now();
  testing::Running r = testing::StartServer(db, core::SystemClock(), options);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(r.server->port() > 0);
  return s;
}

// 8 runs x 25k steps in `dir`, with engine snapshots every `snapshot_steps`.
std::string WriteDb(const testing::TempDir& dir, int64_t snapshot_steps) {
  const std::string db = dir.File("tw.db");
  auto store = Store::Open(db);
  REQUIRE(store.ok());
  testing::HistoryShape shape;
  shape.runs = 8;
  shape.steps = 25'000;
  shape.snapshot_steps = snapshot_steps;
  REQUIRE(testing::WriteHistory(store->get(), shape).ok());
  return db;
}

TEST_CASE("restart: 8 runs x 25k steps stored - serving within an empty start plus 0.3 s",
          "[server][snapshot][restart]") {
  testing::TempDir dir;
  const std::string db = WriteDb(dir, 10'000);
  testing::TempDir empty_dir;
  const double empty = SecondsToServe(empty_dir.File("tw.db"), 10'000);
  const double full = SecondsToServe(db, 10'000);
  INFO("empty database: " << empty << " s; 8 x 25k steps: " << full << " s");
  CHECK(full <= empty + kAllowanceSeconds);
}

// Snapshots off: every run's whole history is replayed (8 x 25k steps,
// ~0.8 s here), yet the port serves at once. The operator sees the stored
// runs marked rebuilding until the writer thread rebuilt them, then not.
TEST_CASE("restart: snapshots off - the port serves while runs rebuild and marks them rebuilding",
          "[server][snapshot][restart]") {
  testing::TempDir dir;
  const std::string db = WriteDb(dir, 0);
  ServerOptions options;
  options.ingest.engine_snapshot_steps = 0;
  testing::Running r = testing::StartServer(db, core::SystemClock(), options);
  auto stub = trainwatch::v1::OperatorService::NewStub(r.channel);
  grpc::ClientContext c1;
  trainwatch::v1::ListRunsResponse runs;
  REQUIRE(stub->ListRuns(&c1, trainwatch::v1::ListRunsRequest(), &runs).ok());
  const int64_t left = r.server->ingestor()->Stats().runs_rebuilding;
  REQUIRE(runs.runs_size() == 8);
  int rebuilding = 0;
  for (const auto& run : runs.runs()) {
    rebuilding += run.rebuilding();
    CHECK(run.latest_step() == 24'999);  // the stored figure meanwhile
  }
  INFO("runs marked rebuilding at the first ListRuns: " << rebuilding << ", left after: " << left);
  CHECK(rebuilding > 0);
  CHECK(left > 0);
  REQUIRE(testing::WaitUntil([&] { return r.server->ingestor()->Stats().runs_rebuilding == 0; },
                             std::chrono::seconds(60)));
  CHECK(r.server->ingestor()->Stats().runs_in_memory == 8);
  grpc::ClientContext c2;
  trainwatch::v1::GetRunStatusRequest req;
  req.set_run_id("run-0");
  trainwatch::v1::GetRunStatusResponse status;
  REQUIRE(stub->GetRunStatus(&c2, req, &status).ok());
  CHECK_FALSE(status.run().rebuilding());
  CHECK(status.run().latest_step() == 24'999);
}

}  // namespace
}  // namespace trainwatch::server
