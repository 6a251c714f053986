// Issue 17 end to end: a job watched without touching its code. The example
// PyTorch trainer runs with trainwatch detached (--no-agent: a JSON line per
// step on stdout), its stdout piped (a real pipe, through tee for the
// captured copy) into `twctl follow -`, with real trainwatchd, Debian's
// Prometheus and Alertmanager. Injected: a logit drift (tier 2: paged through
// Alertmanager, marked observed) and a NaN gradient (tier 3: an incident,
// observed; nothing halts the trainer). What trainwatchd stored equals what
// `twctl replay` of the captured log produces: the same steps and values,
// the same verdicts.

#include <sqlite3.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "stack.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/core/event.h"
#include "trainwatch/core/json.h"

namespace trainwatch::testing {
namespace {

// Short and fast: the rules of demo_rules.json scaled down so that the
// drift from step 200 pages within some 20 steps; the NaN at 260.
constexpr int kDriftFrom = 200, kNanAt = 260, kSteps = 262;
const char* const kRun = "followed-lm";
const char* const kRules =
    R"({"warmup_steps": 100, "ema_span_steps": 100, "median_window_steps": 300,
        "escalate_steps": 100, "tier1_confirm_steps": 50, "logz_bucket_steps": 25,
        "warn_logz_rising_steps": 125, "warn_grad_median_window_steps": 300})";

// A signal's value as both sides hold it: NaN for a JSON "nan" string, for
// SQLite's NULL (a NaN is stored as NULL) and for a missing key.
double JsonNumber(const core::JsonValue* v) {
  if (v == nullptr || v->type == core::JsonValue::Type::kNull) return std::nan("");
  if (v->type == core::JsonValue::Type::kString) return std::strtod(v->string.c_str(), nullptr);
  return v->number;
}

bool Same(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

struct Row {
  int64_t step;
  double loss, grad_norm, log_z, nan_frac, lr;
};

// The steps trainwatchd stored for the run, in order, read on a read-only
// connection of their own (doubles as doubles: no text round trip).
std::vector<Row> StoredSteps(const std::string& db_path, int64_t* attempts) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  const std::string sql =
      std::string("SELECT step, loss, grad_norm, log_z, nan_frac, lr, attempt FROM steps "
                  "WHERE run_id='") +
      kRun + "' ORDER BY attempt, step";
  REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK);
  std::vector<Row> rows;
  std::map<int64_t, bool> seen_attempts;
  auto col = [&](int i) {
    return sqlite3_column_type(st, i) == SQLITE_NULL ? std::nan("") : sqlite3_column_double(st, i);
  };
  while (sqlite3_step(st) == SQLITE_ROW) {
    rows.push_back({sqlite3_column_int64(st, 0), col(1), col(2), col(3), col(4), col(5)});
    seen_attempts[sqlite3_column_int64(st, 6)] = true;
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  *attempts = static_cast<int64_t>(seen_attempts.size());
  return rows;
}

// An event by what both the server and replay say of it.
using EventKey = std::tuple<int64_t, int, std::string, std::string, int64_t, int64_t>;

std::vector<EventKey> StoredEvents(const std::string& db_path) {
  const std::string run = std::string("run_id='") + kRun + "'";
  std::vector<EventKey> out;
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  const std::string sql =
      "SELECT step, tier, action, kind, onset_step, checkpoint_step FROM events WHERE " + run +
      " ORDER BY id";
  REQUIRE(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK);
  while (sqlite3_step(st) == SQLITE_ROW) {
    out.emplace_back(
        sqlite3_column_int64(st, 0), sqlite3_column_int(st, 1),
        std::string(core::ActionName(static_cast<core::Action>(sqlite3_column_int(st, 2)))),
        std::string(core::EventKindName(static_cast<core::EventKind>(sqlite3_column_int(st, 3)))),
        sqlite3_column_int64(st, 4), sqlite3_column_int64(st, 5));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

// The public id ("I-N") of the run's one incident of `tier`; "" when none.
std::string IncidentOfTier(const Trainwatchd& daemon, int tier) {
  const int64_t id = QueryInt(daemon.db(), std::string("SELECT id FROM incidents WHERE run_id='") +
                                               kRun + "' AND tier=" + std::to_string(tier));
  return id < 0 ? "" : "I-" + std::to_string(id);
}

TEST_CASE("follow e2e: the detached trainer's log piped to twctl follow pages as observed",
          "[integration][follow]") {
  TempDir dir;
  const std::string root = PROJECT_SOURCE_DIR;
  const std::string rules = dir.File("rules.json");
  std::ofstream(rules) << kRules;
  HttpReceiver hook;
  Alertmanager am(dir, hook.port());
  const std::string pager =
      am.WritePagerConfig(dir, "http://127.0.0.1:3000/d/trainwatch/trainwatch");
  // A followed job announces no rules: the server's --rules judge it.
  Trainwatchd daemon(dir, rules, pager);
  Prometheus prom(dir, daemon.metrics_port(), root + "/deploy/prometheus/trainwatch-rules.yml");

  const std::string captured = dir.File("captured.jsonl");
  const std::string pipeline =
      "set -o pipefail; /usr/bin/python3 -u " + root +
      "/examples/torch/train_lm.py --no-agent --steps " + std::to_string(kSteps) +
      " --drift-from " + std::to_string(kDriftFrom) + " --drift-rate 0.1 --nan-at " +
      std::to_string(kNanAt) + " --checkpoint-every 50 --checkpoint-dir " +
      dir.File("checkpoints") + " 2>" + dir.File("trainer.err") + " | tee " + captured + " | " +
      TWCTL_PATH + " follow - --run " + kRun + " --server " + daemon.address() +
      " --status-interval 0";
  const std::string follow_log = dir.File("follow.log");
  // No PYTHONPATH: the detached trainer does not need trainwatch installed.
  Child job({"bash", "-c", pipeline}, follow_log,
            {{"OMP_NUM_THREADS", "1"}, {"PYTHONDONTWRITEBYTECODE", "1"}});
  int code = -1;
  const bool exited = WaitUntil([&] { return (code = job.Wait(0)) != -1; },
                                std::chrono::minutes(3), std::chrono::milliseconds(200));
  INFO("twctl follow:\n" << ReadFile(follow_log) << "trainer stderr:\n"
                         << ReadFile(dir.File("trainer.err")));
  REQUIRE(exited);
  // Every stage succeeded: the trainer ran to its end (nothing halted it),
  // and follow had every record acknowledged and no line rejected.
  REQUIRE(code == 0);
  CHECK(ReadFile(follow_log).find("every record acknowledged") != std::string::npos);

  // The drift: a tier 2 incident, paged through Alertmanager as observed.
  const std::string drift = IncidentOfTier(daemon, 2);
  REQUIRE(!drift.empty());
  REQUIRE(WaitUntil([&] { return PagedFiring(hook, drift); }, std::chrono::seconds(30),
                    std::chrono::milliseconds(100)));
  for (const core::JsonValue& a : FiringAlerts(hook, drift)) {
    CHECK(a.Find("labels")->Find("run")->string == kRun);
    const core::JsonValue* ann = a.Find("annotations");
    CHECK(ann->Find("summary")->string.find("(observed, not enforced)") != std::string::npos);
    REQUIRE(ann->Find("observed") != nullptr);
    CHECK(ann->Find("observed")->string.find("No automatic action was possible") !=
          std::string::npos);
    const std::string& d = ann->Find("description")->string;
    CHECK(d.find("logit drift") != std::string::npos);
    CHECK(d.find("roll back to checkpoint step") != std::string::npos);
  }

  // The NaN: a tier 3 incident, observed, with nothing halted.
  const std::string nan = IncidentOfTier(daemon, 3);
  REQUIRE(!nan.empty());
  {
    std::string show;
    const int rc = RunCommand(std::string(TWCTL_PATH) + " incident show " + nan + " --server " +
                                  daemon.address(),
                              "", &show);
    INFO(show);
    CHECK(rc == 0);
    CHECK(show.find("(observed, not enforced)") != std::string::npos);
    CHECK(show.find("No automatic action was possible") != std::string::npos);
  }
  // Prometheus scraped the run as observed.
  CHECK(WaitUntil(
      [&] {
        return prom.Query(std::string("trainwatch_run_observed{run=\"") + kRun + "\"}")
                   .find("\"1\"]") != std::string::npos;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(200)));

  // What was stored equals the captured log, value for value...
  const std::string log = ReadFile(captured);
  std::vector<Row> logged;
  {
    std::istringstream lines(log);
    for (std::string l; std::getline(lines, l);) {
      auto v = core::ParseJson(l, "captured");
      INFO(l);
      REQUIRE(v.ok());
      logged.push_back({static_cast<int64_t>(v->Find("step")->number), JsonNumber(v->Find("loss")),
                        JsonNumber(v->Find("grad_norm")), JsonNumber(v->Find("log_z")),
                        JsonNumber(v->Find("nan_frac")), JsonNumber(v->Find("lr"))});
    }
  }
  REQUIRE(logged.size() == static_cast<size_t>(kSteps));
  int64_t attempts = 0;
  const std::vector<Row> stored = StoredSteps(daemon.db(), &attempts);
  CHECK(attempts == 1);
  REQUIRE(stored.size() == logged.size());
  for (size_t i = 0; i < stored.size(); ++i) {
    INFO("step " << logged[i].step);
    CHECK(stored[i].step == logged[i].step);
    CHECK(Same(stored[i].loss, logged[i].loss));
    CHECK(Same(stored[i].grad_norm, logged[i].grad_norm));
    CHECK(Same(stored[i].log_z, logged[i].log_z));
    CHECK(Same(stored[i].nan_frac, logged[i].nan_frac));
    CHECK(Same(stored[i].lr, logged[i].lr));
  }

  // ... and verdict for verdict with replay of the same log under the same
  // rules.
  std::string replayed;
  const int rc = RunCommand(std::string(TWCTL_PATH) + " replay " + captured + " --config " +
                                rules + " -o json 2>" +
                                dir.File("replay.err"),
                            "", &replayed);
  INFO(replayed << ReadFile(dir.File("replay.err")));
  REQUIRE(rc == 0);
  std::vector<EventKey> expected;
  std::istringstream lines(replayed);
  for (std::string l; std::getline(lines, l);) {
    auto e = core::ParseJson(l, "replay");
    REQUIRE(e.ok());
    const core::JsonValue* ckpt = e->Find("recommended_checkpoint_step");
    expected.emplace_back(static_cast<int64_t>(e->Find("step")->number),
                          static_cast<int>(e->Find("tier")->number), e->Find("action")->string,
                          e->Find("kind")->string, static_cast<int64_t>(e->Find("onset_step")->number),
                          ckpt->type == core::JsonValue::Type::kNull
                              ? -1
                              : static_cast<int64_t>(ckpt->number));
  }
  const std::vector<EventKey> events = StoredEvents(daemon.db());
  CHECK(events == expected);
  // The replay saw the drift and the NaN where the server did.
  bool tier2 = false, tier3 = false;
  for (const EventKey& e : expected) {
    tier2 |= std::get<1>(e) == 2 && std::get<0>(e) > kDriftFrom && std::get<0>(e) < kNanAt;
    tier3 |= std::get<1>(e) == 3 && std::get<0>(e) == kNanAt;
  }
  CHECK(tier2);
  CHECK(tier3);
}

}  // namespace
}  // namespace trainwatch::testing
