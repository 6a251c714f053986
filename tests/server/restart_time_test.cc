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
#include "store.h"
#include "test_util.h"
#include "testing/history_writer.h"

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

TEST_CASE("restart: 8 runs x 25k steps stored - serving within an empty start plus 0.3 s",
          "[server][snapshot][restart]") {
  testing::TempDir dir;
  const std::string db = dir.File("tw.db");
  {
    auto store = Store::Open(db);
    REQUIRE(store.ok());
    testing::HistoryShape shape;
    shape.runs = 8;
    shape.steps = 25'000;
    REQUIRE(testing::WriteHistory(store->get(), shape).ok());
  }
  testing::TempDir empty_dir;
  const double empty = SecondsToServe(empty_dir.File("tw.db"), 10'000);
  const double full = SecondsToServe(db, 10'000);
  INFO("empty database: " << empty << " s; 8 x 25k steps: " << full << " s");
  CHECK(full <= empty + kAllowanceSeconds);
}

}  // namespace
}  // namespace trainwatch::server
