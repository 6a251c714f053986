// Halt, roll back and reconfigure, with real components only: the example
// PyTorch trainer under CPU bf16 autocast, trainwatchd, Debian's Prometheus
// and Alertmanager, and twctl as the on-call engineer. An activation outlier
// at step kOutlierAt makes the final norm's naive variance cancel to a
// negative number in bf16: NaN, a tier 3 halt (exit 3) and a page. The
// engineer approves a rollback that runs that module in fp32; trainwatchd
// restarts in between (the approval is durable); the scheduler restarts the
// job with the same command line and run id; the pending rollback reaches it
// at hello, before its first step; it loads the checkpoint, runs the norm in
// fp32, passes the old failing step, and the incident resolves.

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "stack.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/core/json.h"

namespace trainwatch::testing {
namespace {

constexpr int kOutlierAt = 50, kCheckpointEvery = 20, kSteps = 70;
const char* const kRun = "reconf-lm";

// The incidents of the run as twctl lists them (JSON).
std::vector<core::JsonValue> Incidents(const std::string& twctl) {
  std::string out;
  REQUIRE(RunCommand(twctl + " incidents --run " + kRun + " -o json", "", &out) == 0);
  auto v = core::ParseJson(out, "twctl");
  REQUIRE(v.ok());
  return v->Find("incidents")->array;
}

TEST_CASE("reconfigure: a tier 3 halt in bf16 resumes in fp32 at the restarted job's hello",
          "[integration][reconfigure]") {
  TempDir dir;
  HttpReceiver hook;
  Alertmanager am(dir, hook.port());
  const std::string pager = am.WritePagerConfig(dir, "http://127.0.0.1:3000/d/trainwatch");
  const std::string root = PROJECT_SOURCE_DIR;
  auto daemon = std::make_unique<Trainwatchd>(dir, "", pager);
  Prometheus prom(dir, daemon->metrics_port(), root + "/deploy/prometheus/trainwatch-rules.yml");

  // The job as the scheduler starts it, both times: same command line.
  const std::vector<std::string> job = {
      "/usr/bin/python3", "-u", root + "/examples/torch/train_lm.py", "--steps",
      std::to_string(kSteps), "--checkpoint-every", std::to_string(kCheckpointEvery),
      "--outlier-at", std::to_string(kOutlierAt), "--run-id", kRun, "--rules",
      R"({"warmup_steps": 20, "warmup_min_records": 10, "warmup_min_grad_samples": 10})",
      "--checkpoint-dir", dir.File("checkpoints")};
  const std::map<std::string, std::string> env = {{"PYTHONPATH", PYTHON_PACKAGE_DIR},
                                                  {"OMP_NUM_THREADS", "1"},
                                                  {"PYTHONDONTWRITEBYTECODE", "1"}};
  auto run_job = [&](const std::string& address, const std::string& log) {
    std::vector<std::string> argv = job;
    argv.insert(argv.end(), {"--server", address});
    Child trainer(argv, log, env);
    int code = -1;
    REQUIRE(WaitUntil([&] { return (code = trainer.Wait(0)) != -1; }, std::chrono::seconds(120),
                      std::chrono::milliseconds(100)));
    return code;
  };

  // 1. bf16: the outlier's NaN halts the job.
  const std::string first_log = dir.File("trainer1.log");
  const int first = run_job(daemon->address(), first_log);
  {
    INFO("trainer output:\n" << ReadFile(first_log));
    REQUIRE(first == 3);
    CHECK(ReadFile(first_log).find("halted at step " + std::to_string(kOutlierAt)) !=
          std::string::npos);
  }
  std::string twctl = "TRAINWATCH_SERVER=" + daemon->address() + " " + TWCTL_PATH;
  std::string incident;
  REQUIRE(WaitUntil(
      [&] {
        for (const core::JsonValue& inc : Incidents(twctl)) {
          if (inc.Find("state")->string == "INCIDENT_STATE_AWAITING_DECISION" &&
              inc.Find("tier")->string == "TIER_NUMERICAL_FAILURE") {
            incident = inc.Find("incident_id")->string;
          }
        }
        return !incident.empty();
      },
      std::chrono::seconds(20), std::chrono::milliseconds(200)));
  // The page, as Alertmanager delivered it.
  REQUIRE(WaitUntil([&] { return PagedFiring(hook, incident); }, std::chrono::seconds(30),
                    std::chrono::milliseconds(200)));

  // 2. The approval names the module and its precision; a malformed one is
  // refused by twctl before anything is sent.
  std::string out;
  CHECK(RunCommand(twctl + " rollback approve " + incident +
                       " --precision norm=fp8 --yes --comment x",
                   "", &out) == 2);
  CHECK(out.find("--precision takes MODULE=fp32|bf16|fp16") != std::string::npos);
  const std::string checkpoint = std::to_string(kOutlierAt / kCheckpointEvery * kCheckpointEvery);
  {
    const int rc = RunCommand(twctl + " rollback approve " + incident + " --to-step " +
                                  checkpoint + " --precision norm=fp32 --yes --comment " +
                                  "'bf16 cancels in the norm: run it in fp32'",
                              "", &out);
    INFO(out);
    REQUIRE(rc == 0);
    CHECK(out.find("run norm in fp32") != std::string::npos);
  }

  // 3. trainwatchd restarts before the job does: the decision is durable.
  daemon.reset();
  daemon = std::make_unique<Trainwatchd>(dir, "", pager);
  twctl = "TRAINWATCH_SERVER=" + daemon->address() + " " + TWCTL_PATH;

  // 4. The job restarts, same command line: the rollback reaches it at
  // hello, before its first step, and it passes the old failing step.
  const std::string second_log = dir.File("trainer2.log");
  const int second = run_job(daemon->address(), second_log);
  const std::string log = ReadFile(second_log);
  INFO("restarted trainer output:\n" << log);
  REQUIRE(second == 0);
  const size_t rollback = log.find("rollback C-");
  REQUIRE(rollback != std::string::npos);
  CHECK(log.find("to step " + checkpoint, rollback) != std::string::npos);
  CHECK(log.find("norm in fp32", rollback) != std::string::npos);
  CHECK(log.find("step 0 loss") == std::string::npos);  // no step before the rollback
  CHECK(log.find("halted") == std::string::npos);
  CHECK(log.find("finished " + std::to_string(kSteps) + " steps") != std::string::npos);

  REQUIRE(WaitUntil(
      [&] {
        for (const core::JsonValue& inc : Incidents(twctl)) {
          if (inc.Find("incident_id")->string == incident) {
            return inc.Find("state")->string == "INCIDENT_STATE_RESOLVED";
          }
        }
        return false;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(200)));
  // The new attempt holds the old failing step with a finite loss, and the
  // ack says what was applied.
  const std::string run = std::string("run_id='") + kRun + "'";
  CHECK(QueryInt(daemon->db(), "SELECT count(*) FROM steps WHERE " + run +
                                   " AND attempt=(SELECT max(attempt) FROM steps WHERE " + run +
                                   ") AND step=" + std::to_string(kOutlierAt) +
                                   " AND loss < 100") == 1);
  CHECK(QueryInt(daemon->db(), "SELECT count(*) FROM command_acks WHERE " + run +
                                   " AND status=2 AND resumed_step=" + checkpoint +
                                   " AND message LIKE '%norm in fp32%'") == 1);
}

}  // namespace
}  // namespace trainwatch::testing
