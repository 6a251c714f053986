// Restart with a long history stored (issue 16's goal: serving in <= 1 s
// with 8 runs x 500k steps, whatever the history). Generates the history
// once, straight through the Store API (testing/history_writer.h: one
// transaction a run, each step judged by the engine, snapshots as
// trainwatchd writes them), then starts trainwatchd's Server on it again and
// again, alternating a full replay (--engine_snapshot_steps=0: snapshots
// ignored, as before them) and a start from the snapshots. Two times each:
// to serving (Server::Start returns with the port open; runs are rebuilt
// after it, ingest.h "Restart") and to all runs rebuilt (runs_rebuilding
// reaches 0). Prints each side's median [min-max] and, for `make bench`
// (bench/run_all.py), one JSON line per figure: "restart to serving, ..."
// (judged <= 1 s, both sides; baseline: the same side's time to all runs
// rebuilt, which was the time to serving before the port opened first) and
// "restart to all runs rebuilt, ..." (baseline: the full replay's).
//
//   restart_bench --runs=8 --steps=500000 --reps=5 [--dir=/tmp/x] [--smoke]

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "daemon/server.h"
#include "store/store.h"
#include "testing/history_writer.h"
#include "testing/temp_dir.h"

ABSL_FLAG(int, runs, 8, "runs stored");
ABSL_FLAG(int64_t, steps, 500'000, "steps stored per run");
ABSL_FLAG(int, reps, 5, "restarts per side, alternating");
ABSL_FLAG(bool, smoke, false, "small sizes (8 runs x 20k steps, 3 reps) to check the bench runs");
ABSL_FLAG(std::string, dir, "",
          "folder for the database, kept (default: a new one under $TMPDIR, removed at the "
          "end); an existing tw.db there is reused as it is");

namespace {

struct Times {
  double serving = 0;
  double rebuilt = 0;
};

Times Start(const std::string& db, int64_t snapshot_steps) {
  trainwatch::server::ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.db_path = db;
  o.ingest.engine_snapshot_steps = snapshot_steps;
  const auto t0 = std::chrono::steady_clock::now();
  auto server = trainwatch::server::Server::Start(o, trainwatch::core::SystemClock());
  auto since = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  Times t;
  t.serving = since();
  if (!server.ok()) {
    std::fprintf(stderr, "restart_bench: %s\n", std::string(server.status().message()).c_str());
    std::exit(1);
  }
  while ((*server)->ingestor()->Stats().runs_rebuilding > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  t.rebuilt = since();
  return t;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A human line and a JSON line (run_all.py's fields).
void Report(const std::string& figure, std::vector<double> v, double baseline) {
  std::sort(v.begin(), v.end());
  const double med = v[v.size() / 2];
  std::printf("%-70s median %.3f s [%.3f-%.3f] over %zu\n", figure.c_str(), med, v.front(),
              v.back(), v.size());
  std::printf("{\"figure\": \"%s\", \"unit\": \"s\", \"value\": %.4f, \"baseline\": %.4f, "
              "\"ratio\": %.3f, \"median\": %.4f, \"min\": %.4f, \"max\": %.4f}\n",
              figure.c_str(), med, baseline, med > 0 ? baseline / med : 0.0, med, v.front(),
              v.back());
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string dir = absl::GetFlag(FLAGS_dir);
  // Without --dir, the generated history goes when the bench ends.
  std::optional<trainwatch::testing::ScopedTempDir> generated;
  if (dir.empty()) {
    generated.emplace("restart_bench.");
    dir = generated->path();
    if (dir.empty()) return 1;
  }
  const std::string db = dir + "/tw.db";
  const bool smoke = absl::GetFlag(FLAGS_smoke);
  if (access(db.c_str(), F_OK) != 0) {
    trainwatch::testing::HistoryShape shape;
    shape.runs = absl::GetFlag(FLAGS_runs);
    shape.steps = smoke ? 20'000 : absl::GetFlag(FLAGS_steps);
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
  // Serving and rebuilt times per side: [0] snapshots on, [1] off.
  std::vector<double> serving[2], rebuilt[2];
  const int reps = smoke ? 3 : absl::GetFlag(FLAGS_reps);
  for (int i = 0; i < reps; ++i) {
    for (int side : {1, 0}) {
      const Times t = Start(db, side == 0 ? 10'000 : 0);
      serving[side].push_back(t.serving);
      rebuilt[side].push_back(t.rebuilt);
    }
  }
  auto stored = trainwatch::server::Store::Open(db);
  if (!stored.ok()) return 1;
  auto runs = (*stored)->LoadRuns();
  if (!runs.ok() || runs->empty()) return 1;
  const std::string size = std::to_string(runs->size()) + " runs x " +
                           std::to_string((runs->front().last_step + 1) / 1000) + "k steps";
  const char* side_name[2] = {"snapshots on", "snapshots off (full replay)"};
  for (int side : {0, 1}) {
    Report("restart to serving, " + size + ", " + side_name[side], serving[side],
           Median(rebuilt[side]));
  }
  for (int side : {0, 1}) {
    Report("restart to all runs rebuilt, " + size + ", " + side_name[side], rebuilt[side],
           Median(rebuilt[1]));
  }
  char load[64] = "?";
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fgets(load, sizeof load, f) == nullptr) load[0] = '\0';
    std::fclose(f);
  }
  std::printf("all runs rebuilt, ratio of medians: %.1fx faster from snapshots; %ld cores, "
              "load average %s",
              Median(rebuilt[1]) / Median(rebuilt[0]), sysconf(_SC_NPROCESSORS_ONLN), load);
  return 0;
}
