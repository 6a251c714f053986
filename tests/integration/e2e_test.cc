// The whole story with real components only, as `make demo` tells it: the
// example PyTorch trainer (Debian's torch, CPU) with the agent attached,
// trainwatchd, Debian's Prometheus scraping it with the alert rules loaded,
// Debian's Alertmanager delivering pages to a webhook receiver, and twctl as
// the on-call engineer. Injected: a corrupted batch at step 400 (tier 1), a
// logit drift from step 600 with z-loss off (tier 2, rollback approved) and a
// NaN gradient at step 1300 (tier 3).

#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "stack.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/core/json.h"

namespace trainwatch::testing {
namespace {

constexpr int kCorruptAt = 400, kDriftFrom = 600, kNanAt = 1300, kSteps = 1400;
const char* const kRun = "e2e-lm";

// Read-only queries on trainwatchd's database while it runs (WAL).
class Db {
 public:
  explicit Db(const std::string& path) {
    REQUIRE(sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  }
  ~Db() { sqlite3_close(db_); }
  // Rows of the query, each column as text ("" for NULL).
  std::vector<std::vector<std::string>> Rows(const std::string& sql) {
    sqlite3_stmt* st = nullptr;
    INFO(sql);
    REQUIRE(sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) == SQLITE_OK);
    std::vector<std::vector<std::string>> rows;
    while (sqlite3_step(st) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int i = 0; i < sqlite3_column_count(st); ++i) {
        const unsigned char* t = sqlite3_column_text(st, i);
        row.emplace_back(t == nullptr ? "" : reinterpret_cast<const char*>(t));
      }
      rows.push_back(std::move(row));
    }
    sqlite3_finalize(st);
    return rows;
  }
  double Number(const std::string& sql) {
    auto rows = Rows(sql);
    REQUIRE(rows.size() == 1);
    INFO(sql);
    REQUIRE(!rows[0][0].empty());
    return std::atof(rows[0][0].c_str());
  }

 private:
  sqlite3* db_ = nullptr;
};

std::string Trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

bool IsNumber(const std::string& s) {
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

// The operands of a PromQL expression's top-level comparisons and set
// operators (`a > 2 and b == 0` -> a, b), numeric literals left out: an
// alert condition is empty while it does not hold, its operands must not be.
std::vector<std::string> Operands(const std::string& e) {
  std::vector<std::string> parts;
  int depth = 0;
  bool quoted = false;
  size_t start = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    const char c = e[i];
    if (quoted) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        quoted = false;
      continue;
    }
    if (c == '"') quoted = true;
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == ']' || c == '}') --depth;
    if (depth != 0 || quoted) continue;
    size_t len = 0;
    for (const char* op : {"==", "!=", ">=", "<="}) {
      if (e.compare(i, 2, op) == 0) len = 2;
    }
    if (len == 0 && (c == '>' || c == '<')) len = 1;
    for (const char* w : {"and", "or", "unless"}) {
      const size_t n = std::strlen(w);
      if (len == 0 && e.compare(i, n, w) == 0 && i > 0 &&
          std::isspace(static_cast<unsigned char>(e[i - 1])) && i + n < e.size() &&
          std::isspace(static_cast<unsigned char>(e[i + n]))) {
        len = n;
      }
    }
    if (len == 0) continue;
    parts.push_back(Trim(e.substr(start, i - start)));
    i += len - 1;
    start = i + 1;
  }
  parts.push_back(Trim(e.substr(start)));
  std::vector<std::string> out;
  for (std::string p : parts) {
    if (p.rfind("bool ", 0) == 0) p = Trim(p.substr(5));
    if (!IsNumber(p)) out.push_back(p);
  }
  return out;
}

// The `expr:` of every rule in a Prometheus rule file (inline, or a folded
// block of more-indented lines).
std::vector<std::string> RuleExpressions(const std::string& path, int* alerts) {
  std::vector<std::string> lines;
  std::istringstream in(ReadFile(path));
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::vector<std::string> out;
  *alerts = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string t = Trim(lines[i]);
    if (t.rfind("- alert:", 0) == 0) ++*alerts;
    if (t.rfind("expr:", 0) != 0) continue;
    std::string rest = Trim(t.substr(5));
    if (rest == ">" || rest == "|" || rest == ">-" || rest == "|-") {
      const size_t indent = lines[i].find_first_not_of(' ');
      rest.clear();
      while (i + 1 < lines.size() && lines[i + 1].find_first_not_of(' ') > indent &&
             !Trim(lines[i + 1]).empty()) {
        rest += " " + Trim(lines[++i]);
      }
    }
    out.push_back(Trim(rest));
  }
  return out;
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) {
    s.replace(p, from.size(), to);
  }
  return s;
}

// The series a Prometheus query returned (empty on any error).
size_t SeriesCount(const Prometheus& prom, const std::string& expr) {
  auto v = core::ParseJson(prom.Query(expr), "prometheus");
  if (!v.ok() || v->Find("status") == nullptr || v->Find("status")->string != "success") {
    return 0;
  }
  return v->Find("data")->Find("result")->array.size();
}

// When Prometheus last scraped (its least recent target, in Unix seconds);
// 0 on any error.
double LastScrapeS(const Prometheus& prom) {
  auto v = core::ParseJson(prom.Query("min(timestamp(up))"), "prometheus");
  if (!v.ok() || v->Find("data") == nullptr || v->Find("data")->Find("result") == nullptr) return 0;
  const auto& result = v->Find("data")->Find("result")->array;
  if (result.size() != 1 || result[0].Find("value") == nullptr) return 0;
  return std::stod(result[0].Find("value")->array[1].string);
}

TEST_CASE("e2e: the example trainer through tiers 1 and 2 and 3 with real components",
          "[integration][e2e]") {
  TempDir dir;
  HttpReceiver hook;
  Alertmanager am(dir, hook.port());
  const std::string pager =
      am.WritePagerConfig(dir, "http://127.0.0.1:3000/d/trainwatch/trainwatch");
  const std::string root = PROJECT_SOURCE_DIR;
  const std::string rules = root + "/examples/torch/demo_rules.json";
  const std::string alert_rules = root + "/deploy/prometheus/trainwatch-rules.yml";
  Trainwatchd daemon(dir, rules, pager);
  Prometheus prom(dir, daemon.metrics_port(), alert_rules);

  const std::string trainer_log = dir.File("trainer.log");
  Child trainer(
      {"/usr/bin/python3", "-u", root + "/examples/torch/train_lm.py", "--steps",
       std::to_string(kSteps), "--corrupt-at", std::to_string(kCorruptAt), "--drift-from",
       std::to_string(kDriftFrom), "--nan-at", std::to_string(kNanAt), "--server", daemon.address(),
       "--run-id", kRun, "--rules", ReadFile(rules), "--checkpoint-dir", dir.File("checkpoints")},
      trainer_log,
      {{"PYTHONPATH", PYTHON_PACKAGE_DIR},
       {"OMP_NUM_THREADS", "1"},
       {"PYTHONDONTWRITEBYTECODE", "1"},
       {"TRAINWATCH_HEARTBEAT_MS", "250"}});

  // The liveness series (docs/hangs.md) exist while the run's agents are
  // heard from, and end with the job: each must have had data during it.
  const std::vector<std::string> live_metrics = {
      "trainwatch_run_seconds_since_step", "trainwatch_run_stall_bound_seconds",
      "trainwatch_run_stalled",           "trainwatch_run_ranks_lost",
      "trainwatch_run_step_seconds",      "trainwatch_rank_step_time_ratio",
      "trainwatch_run_goodput_ratio"};
  std::set<std::string> live_seen;
  auto sample_live = [&] {
    for (const std::string& m : live_metrics) {
      if (live_seen.count(m) == 0 && SeriesCount(prom, m + "{run=\"" + kRun + "\"}") > 0) {
        live_seen.insert(m);
      }
    }
  };

  // The on-call engineer: paged for a tier 2 incident awaiting a decision,
  // approves the recommended rollback with twctl. Approving before the page
  // arrives would let the incident resolve inside Alertmanager's group_wait,
  // and the only notification would be "resolved".
  const std::string twctl = std::string("TRAINWATCH_SERVER=") + daemon.address() + " " + TWCTL_PATH;
  std::string incident;
  std::string awaiting;
  int code = -1;
  auto approve_until_exit = [&] {
    sample_live();
    code = trainer.Wait(0);
    if (code != -1 || !incident.empty()) return code != -1;
    if (!awaiting.empty()) {
      if (!PagedFiring(hook, awaiting)) return false;
      incident = awaiting;
      std::string out;
      const int rc = RunCommand(twctl + " rollback approve " + incident +
                                    " --yes --comment 'logit drift: roll back with z-loss'",
                                "", &out);
      INFO(out);
      REQUIRE(rc == 0);
      return false;
    }
    std::string out;
    REQUIRE(RunCommand(twctl + " incidents --run " + kRun + " -o json", "", &out) == 0);
    auto v = core::ParseJson(out, "twctl");
    REQUIRE(v.ok());
    for (const core::JsonValue& inc : v->Find("incidents")->array) {
      if (inc.Find("tier")->string == "TIER_LOGIT_DRIFT" &&
          inc.Find("state")->string == "INCIDENT_STATE_AWAITING_DECISION") {
        awaiting = inc.Find("incident_id")->string;
      }
    }
    return false;
  };
  // Each poll may start twctl: a process of its own, so not too often.
  const bool exited =
      WaitUntil(approve_until_exit, std::chrono::minutes(10), std::chrono::milliseconds(300));
  const std::string log = ReadFile(trainer_log);
  INFO("trainer output:\n" << log);
  REQUIRE(exited);
  // Tier 3 halted the run at the NaN; nothing else stopped it.
  REQUIRE(code == 3);
  REQUIRE(!incident.empty());
  CHECK(log.find("step " + std::to_string(kCorruptAt) + " loss") != std::string::npos);
  CHECK(log.find("halted at step " + std::to_string(kNanAt)) != std::string::npos);

  Db db(daemon.db());
  const std::string run = std::string("run_id='") + kRun + "'";

  {  // tier 1: the corrupted batch was skipped and its shards are in SQLite
    // The example's loader reads shards 2s and 2s+1 at step s.
    const std::string a = std::to_string(2 * kCorruptAt), b = std::to_string(2 * kCorruptAt + 1);
    auto skip = db.Rows("SELECT shards, incident_id FROM events WHERE " + run +
                        " AND action=2 AND step=" + std::to_string(kCorruptAt));
    REQUIRE(skip.size() == 1);
    CHECK(skip[0][0] == a + ";" + b);
    CHECK(db.Number("SELECT count(*) FROM flagged_shards WHERE " + run +
                    " AND incident_id=" + skip[0][1] + " AND shard IN (" + a + "," + b + ")") == 2);
    CHECK(db.Number("SELECT decision FROM steps WHERE " + run +
                    " AND step=" + std::to_string(kCorruptAt) + " ORDER BY attempt LIMIT 1") == 1);
  }

  const std::string iid = incident.substr(incident.find('-') + 1);
  auto inc = db.Rows(
      "SELECT onset_step, detection_step, checkpoint_step, tier, state FROM "
      "incidents WHERE id=" +
      iid);
  REQUIRE(inc.size() == 1);
  const int onset = std::atoi(inc[0][0].c_str()), detected = std::atoi(inc[0][1].c_str());
  const int checkpoint = std::atoi(inc[0][2].c_str());

  {  // tier 2: the drift paged through Alertmanager and the rollback completed
    CHECK(inc[0][3] == "2");
    CHECK(onset >= kDriftFrom - 100);
    CHECK(onset <= kDriftFrom);
    CHECK(detected > kDriftFrom);
    CHECK(checkpoint <= onset);
    CHECK(checkpoint >= onset - 100);
    // The page, as Alertmanager delivered it to the webhook.
    const std::vector<core::JsonValue> pages = FiringAlerts(hook, incident);
    CHECK(!pages.empty());
    for (const core::JsonValue& a : pages) {
      CHECK(a.Find("labels")->Find("run")->string == kRun);
      CHECK(a.Find("annotations")->Find("summary")->string.find(incident) != std::string::npos);
      const std::string& d = a.Find("annotations")->Find("description")->string;
      CHECK(d.find("logit drift") != std::string::npos);
      CHECK(d.find("roll back to checkpoint step " + std::to_string(checkpoint)) !=
            std::string::npos);
      CHECK(d.find("z-loss") != std::string::npos);
    }
    // Every rank applied the rollback, to the recommended checkpoint, with
    // the shards quarantined and z-loss on.
    auto acks =
        db.Rows("SELECT resumed_step, message FROM command_acks WHERE " + run + " AND status=2");
    REQUIRE(acks.size() == 1);
    CHECK(std::atoi(acks[0][0].c_str()) == checkpoint);
    CHECK(acks[0][1].find("z-loss 0.0001") != std::string::npos);
    // And skipped its own batches from just after the checkpoint to the
    // detection (each rank maps the steps to its own data).
    CHECK(acks[0][1].find("skipped the batches of steps " + std::to_string(checkpoint + 1) +
                          ".." + std::to_string(detected)) != std::string::npos);
    CHECK(db.Number("SELECT count(*) FROM quarantined_shards WHERE incident_id=" + iid) >= 1);
    CHECK(db.Number("SELECT count(*) FROM incidents WHERE " + run + " AND tier=2") == 1);
    // Past the old onset, the loss stays below its level before the drift
    // (the mean of the 200 steps before the onset, skipped steps left out):
    // every 50-step mean of the new attempt up to 300 steps past detection.
    const double first = db.Number("SELECT min(attempt) FROM steps WHERE " + run);
    const double last = db.Number("SELECT max(attempt) FROM steps WHERE " + run);
    REQUIRE(last > first);
    const std::string win =
        " AND step BETWEEN " + std::to_string(onset) + " AND " + std::to_string(detected + 300);
    CHECK(db.Number("SELECT count(*) FROM steps WHERE " + run +
                    " AND attempt=" + std::to_string(last) + win) == detected + 300 - onset + 1);
    const double before =
        db.Number("SELECT avg(loss) FROM steps WHERE " + run +
                  " AND decision=0 AND attempt=" + std::to_string(first) + " AND step BETWEEN " +
                  std::to_string(onset - 200) + " AND " + std::to_string(onset - 1));
    const double after =
        db.Number("SELECT max(m) FROM (SELECT avg(loss) m FROM steps WHERE " + run +
                  " AND attempt=" + std::to_string(last) + win + " GROUP BY step / 50)");
    CHECK(after < before);
    // And log_z did not drift again: 3 above where it started is the page.
    const double logz0 =
        db.Number("SELECT log_z FROM steps WHERE " + run + " AND attempt=" + std::to_string(last) +
                  " AND step=" + std::to_string(onset));
    CHECK(db.Number("SELECT max(log_z) FROM steps WHERE " + run +
                    " AND attempt=" + std::to_string(last) + win) < logz0 + 1.0);
  }

  {  // the run as one page: five charts, the drift that the rollback undid
    std::string out;
    const std::string report = dir.File("report.html");
    const int rc = RunCommand(twctl + " report " + kRun + " --out " + report, "", &out);
    INFO(out);
    REQUIRE(rc == 0);
    const std::string html = ReadFile(report);
    size_t charts = 0;
    for (size_t p = html.find("<svg"); p != std::string::npos; p = html.find("<svg", p + 1)) {
      ++charts;
    }
    CHECK(charts == 5);
    CHECK(html.find("class=\"abandoned\"") != std::string::npos);
    CHECK(html.find("class=\"incident tier2\"") != std::string::npos);
    CHECK(html.find("class=\"incident tier3\"") != std::string::npos);
    CHECK(html.find(incident) != std::string::npos);
  }

  {  // tier 3: the NaN halted the run
    auto halt = db.Rows("SELECT step, reason FROM events WHERE " + run + " AND action=4");
    REQUIRE(halt.size() == 1);
    CHECK(halt[0][0] == std::to_string(kNanAt));
    CHECK(halt[0][1].find("nan_frac") != std::string::npos);
    // twctl names the tensor that held the NaN (the trainer passes named
    // gradients; the NaN is injected into the output layer's weight).
    auto t3 = db.Rows("SELECT id FROM incidents WHERE " + run + " AND tier=3");
    REQUIRE(t3.size() == 1);
    std::string show;
    const int rc = RunCommand(twctl + " incident show I-" + t3[0][0], "", &show);
    INFO(show);
    CHECK(rc == 0);
    const size_t section = show.find("nonfinite gradients by tensor");
    REQUIRE(section != std::string::npos);
    CHECK(show.find("head.weight", section) != std::string::npos);
  }

  {  // every PromQL expression of the dashboard and the alert rules returns data
    // Prometheus has the final state (twice over) once a scrape that began
    // 2 s from now has landed; it scrapes every second.
    const double final_s =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    REQUIRE(WaitUntil([&] { return LastScrapeS(prom) > final_s + 2; }, std::chrono::seconds(30),
                      std::chrono::milliseconds(200)));
    // Every dashboard in dashboards/: panel targets, annotations, and the
    // query variables (label_values(METRIC, LABEL) must list this run).
    std::vector<std::string> exprs;
    size_t dashboards = 0;
    for (const auto& f : std::filesystem::directory_iterator(root + "/dashboards")) {
      if (f.path().extension() != ".json") continue;
      ++dashboards;
      auto dash = core::ParseJson(ReadFile(f.path().string()), f.path().string());
      REQUIRE(dash.ok());
      for (const core::JsonValue& p : dash->Find("panels")->array) {
        for (const core::JsonValue& t : p.Find("targets")->array) {
          exprs.push_back(t.Find("expr")->string);
        }
      }
      for (const core::JsonValue& a : dash->Find("annotations")->Find("list")->array) {
        if (a.Find("expr") != nullptr) exprs.push_back(a.Find("expr")->string);
      }
      for (const core::JsonValue& v : dash->Find("templating")->Find("list")->array) {
        if (v.Find("type")->string != "query") continue;
        const std::string q = v.Find("query")->Find("query")->string;
        INFO(f.path().string() << " variable " << v.Find("name")->string << ": " << q);
        REQUIRE(q.rfind("label_values(", 0) == 0);
        const size_t comma = q.find(',');
        REQUIRE(comma != std::string::npos);
        const std::string metric = Trim(q.substr(13, comma - 13));
        const std::string label = Trim(q.substr(comma + 1, q.rfind(')') - comma - 1));
        CHECK(prom.Query(metric).find("\"" + label + "\":\"" + kRun + "\"") != std::string::npos);
      }
    }
    REQUIRE(dashboards >= 1);
    int alerts = 0;
    const std::vector<std::string> rule_exprs = RuleExpressions(alert_rules, &alerts);
    REQUIRE(alerts > 0);
    REQUIRE(rule_exprs.size() == static_cast<size_t>(alerts));
    exprs.insert(exprs.end(), rule_exprs.begin(), rule_exprs.end());
    REQUIRE(exprs.size() >= 20);
    size_t queried = 0;
    for (const std::string& e : exprs) {
      for (const std::string& operand : Operands(Replace(e, "$run", kRun))) {
        INFO(e << "\n  operand: " << operand);
        const auto live = std::find_if(live_metrics.begin(), live_metrics.end(),
                                       [&](const std::string& m) {
                                         return operand.find(m) != std::string::npos;
                                       });
        if (live != live_metrics.end()) {
          CHECK(live_seen.count(*live) == 1);  // had data while the job ran
        } else {
          CHECK(SeriesCount(prom, operand) > 0);
        }
        ++queried;
      }
    }
    CHECK(queried >= exprs.size());
  }
}

TEST_CASE("e2e: PromQL operands split at top-level comparisons and set operators only",
          "[integration][e2e]") {
  CHECK(Operands("up{job=\"x\"} == 0") == std::vector<std::string>{"up{job=\"x\"}"});
  CHECK(Operands("a > 12 and deriv(a[1h]) * 3600 > 0.25") ==
        std::vector<std::string>{"a", "deriv(a[1h]) * 3600"});
  CHECK(Operands("increase(x_total{l=~\"a>b\"}[5m]) > 3") ==
        std::vector<std::string>{"increase(x_total{l=~\"a>b\"}[5m])"});
  CHECK(Operands("sum by (tier) (m{run=~\"r\"})") ==
        std::vector<std::string>{"sum by (tier) (m{run=~\"r\"})"});
  CHECK(Operands("store_errors_total unless on() vector(1)") ==
        std::vector<std::string>{"store_errors_total", "on() vector(1)"});
}

}  // namespace
}  // namespace trainwatch::testing

namespace trainwatch::testing {
namespace {

TEST_CASE(
    "deploy: local-stack brings up trainwatchd and Prometheus and Alertmanager and stops them",
    "[integration][deploy]") {
  TempDir dir;
  const int grpc = FreePort(), metrics = FreePort(), prom = FreePort(), am = FreePort();
  std::string build = TRAINWATCHD_PATH;
  build = build.substr(0, build.rfind('/'));  // .../bin
  build = build.substr(0, build.rfind('/'));  // the build folder
  const std::string log = dir.File("local-stack.log");
  Child stack({"bash", std::string(PROJECT_SOURCE_DIR) + "/deploy/local-stack", build}, log,
              {{"TW_GRPC_PORT", std::to_string(grpc)},
               {"TW_METRICS_PORT", std::to_string(metrics)},
               {"TW_PROMETHEUS_PORT", std::to_string(prom)},
               {"TW_ALERTMANAGER_PORT", std::to_string(am)}});
  // Prometheus scrapes trainwatchd, has the rules and knows the Alertmanager.
  const bool up = WaitUntil(
      [&] {
        return HttpGet(prom, "/api/v1/query?query=up").find("\"value\":[") != std::string::npos &&
               HttpGet(prom, "/api/v1/query?query=up").find("\"1\"]") != std::string::npos;
      },
      std::chrono::seconds(40), std::chrono::milliseconds(100));
  INFO(ReadFile(log));
  REQUIRE(up);
  CHECK(HttpGet(prom, "/api/v1/query?query=up").find("\"job\":\"trainwatchd\"") !=
        std::string::npos);
  CHECK(HttpGet(prom, "/api/v1/rules").find("TrainwatchdDown") != std::string::npos);
  CHECK(WaitUntil(
      [&] {
        return HttpGet(prom, "/api/v1/alertmanagers").find("127.0.0.1:" + std::to_string(am)) !=
               std::string::npos;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(100)));
  CHECK(HttpGet(am, "/-/ready").find("OK") != std::string::npos);
  CHECK(HttpGet(metrics, "/metrics").find("trainwatch_ingest_records_total") != std::string::npos);
  std::string state;
  {
    std::istringstream lines(ReadFile(log));
    for (std::string l; std::getline(lines, l);) {
      if (l.rfind("state and logs in ", 0) == 0) state = l.substr(18, l.find(';') - 18);
    }
  }
  REQUIRE(!state.empty());
  REQUIRE(access(state.c_str(), F_OK) == 0);
  // SIGTERM to the script alone: it stops the three and cleans up.
  kill(stack.pid(), SIGTERM);
  CHECK(stack.Wait(30) == 143);
  CHECK(HttpGet(metrics, "/metrics").empty());
  CHECK(HttpGet(prom, "/-/ready").empty());
  CHECK(HttpGet(am, "/-/ready").empty());
  CHECK(access(state.c_str(), F_OK) != 0);
}

}  // namespace
}  // namespace trainwatch::testing
