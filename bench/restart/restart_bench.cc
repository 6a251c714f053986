// Restart to serving with a long history stored (issue 16's goal: <= 1 s
// with 8 runs x 500k steps). Generates the history once, straight through
// the Store API (testing/history_writer.h: one transaction a run, each step
// judged by the engine, snapshots as trainwatchd writes them), then starts
// trainwatchd's Server on it again and again, alternating a full replay
// (--engine_snapshot_steps=0: snapshots ignored, as before them) and a
// start from the snapshots, and reports each side's median [min-max] and the
// ratio of the medians. Server::Start returns once every run is rebuilt and
// the port serves, so both times are "to serving" and "to all runs rebuilt".
//
//   restart_bench --runs=8 --steps=500000 --reps=5 [--dir=/tmp/x]

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "server.h"
#include "store.h"
#include "testing/history_writer.h"

ABSL_FLAG(int, runs, 8, "runs stored");
ABSL_FLAG(int64_t, steps, 500'000, "steps stored per run");
ABSL_FLAG(int, reps, 5, "restarts per side, alternating");
ABSL_FLAG(std::string, dir, "", "folder for the database (default: a new one under /tmp); an "
                                "existing tw.db there is reused as it is");

namespace {

double Start(const std::string& db, int64_t snapshot_steps) {
  trainwatch::server::ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.db_path = db;
  o.ingest.engine_snapshot_steps = snapshot_steps;
  const auto t0 = std::chrono::steady_clock::now();
  auto server = trainwatch::server::Server::Start(o, trainwatch::core::SystemClock());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!server.ok()) {
    std::fprintf(stderr, "restart_bench: %s\n", std::string(server.status().message()).c_str());
    std::exit(1);
  }
  return s;
}

void Report(const char* name, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::printf("%-28s median %.3f s [%.3f-%.3f] over %zu\n", name, v[v.size() / 2], v.front(),
              v.back(), v.size());
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    char tmpl[] = "/tmp/restart_bench.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return 1;
    dir = tmpl;
  }
  const std::string db = dir + "/tw.db";
  if (access(db.c_str(), F_OK) != 0) {
    trainwatch::testing::HistoryShape shape;
    shape.runs = absl::GetFlag(FLAGS_runs);
    shape.steps = absl::GetFlag(FLAGS_steps);
    const auto t0 = std::chrono::steady_clock::now();
    auto store = trainwatch::server::Store::Open(db);
    if (!store.ok()) return 1;
    if (auto st = trainwatch::testing::WriteHistory(store->get(), shape); !st.ok()) {
      std::fprintf(stderr, "restart_bench: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    std::printf("generated %d runs x %lld steps in %.1f s: %s\n", shape.runs,
                static_cast<long long>(shape.steps),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                db.c_str());
  }
  std::vector<double> full, snap;
  for (int i = 0; i < absl::GetFlag(FLAGS_reps); ++i) {
    full.push_back(Start(db, 0));
    snap.push_back(Start(db, 10'000));
  }
  Report("full replay (no snapshots)", full);
  Report("from engine snapshots", snap);
  std::sort(full.begin(), full.end());
  std::sort(snap.begin(), snap.end());
  char load[64] = "?";
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fgets(load, sizeof load, f) == nullptr) load[0] = '\0';
    std::fclose(f);
  }
  std::printf("ratio of medians: %.1fx faster; %ld cores, load average %s",
              full[full.size() / 2] / snap[snap.size() / 2], sysconf(_SC_NPROCESSORS_ONLN), load);
  return 0;
}
