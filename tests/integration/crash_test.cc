// The incident-to-rollback loop across crashes: trainwatchd runs as a real
// process and is killed with SIGKILL between each pair of stages, then
// restarted on the same database. No page and no command may be lost or
// doubled.

#include <sqlite3.h>

#include <fstream>
#include <map>
#include <string>

#include <catch2/catch.hpp>

#include "stack.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/cli/operator_commands.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using testing::Hello;
using testing::HttpReceiver;
using testing::QueryInt;
using testing::Step;
using testing::TempDir;
using testing::TestAgent;
using testing::Trainwatchd;

bool WaitCount(const std::string& db, const std::string& sql, int64_t n) {
  return testing::WaitUntil([&] { return QueryInt(db, sql) >= n; }, std::chrono::seconds(10),
                            std::chrono::milliseconds(20));
}

double Loss(int64_t s) { return 2.5 + 0.01 * std::sin(static_cast<double>(s) * 1.7); }

TEST_CASE("crash: SIGKILL between every stage loses and doubles nothing", "[server][crash]") {
  TempDir dir;
  HttpReceiver rx;
  const std::string db = dir.File("trainwatch.db");  // where Trainwatchd keeps it
  const std::string pager = dir.File("pager.json");
  const std::string base = "http://127.0.0.1:" + std::to_string(rx.port());
  std::ofstream(pager) << "{\"receivers\": [{\"name\": \"am\", \"type\": \"alertmanager\", "
                          "\"url\": \""
                       << base << "/am\"}, {\"name\": \"hook\", \"type\": \"webhook\", \"url\": \""
                       << base << "/hook\"}]}";
  const std::string run = "run-crash";
  // Stage 1: records arrive, an incident opens, its pages go in the outbox.
  {
    Trainwatchd d(dir, "", pager);
    TestAgent a(d.channel());
    a.Send(Hello(run, 0, 2));
    for (int64_t s = 0; s < 3600; ++s) {
      a.Send(Step(run, 0, 2, s, s >= 3000 ? Loss(s) + 0.3 : Loss(s), 1.0));
      if (s > 0 && s % 1000 == 0) {
        v1::AgentMessage c;
        c.mutable_checkpoint()->set_run_id(run);
        c.mutable_checkpoint()->set_step(s);
        c.mutable_checkpoint()->set_uri("ckpt://crash/" + std::to_string(s));
        a.Send(c);
      }
    }
    REQUIRE(a.WaitDurable(0, 3599));
    REQUIRE(WaitCount(db, "SELECT COUNT(*) FROM outbox", 2));
    // Stage 2: the pages are delivered (and marked so) before the kill.
    REQUIRE(WaitCount(db, "SELECT COUNT(*) FROM outbox WHERE state = 'sent'", 2));
    d.Kill();
  }
  CHECK(rx.requests().size() == 2);
  const int64_t incident =
      QueryInt(db, "SELECT id FROM incidents WHERE tier = 2 ORDER BY id LIMIT 1");
  REQUIRE(incident > 0);
  const std::string id = "I-" + std::to_string(incident);
  // Stage 3: the approval, then a kill.
  {
    Trainwatchd d(dir, "", pager);
    std::string out, err;
    const int rc = cli::OperatorCommand(
        "rollback", {"--server", d.address(), "approve", id, "--comment", "crash test", "--yes"},
        nullptr, &out, &err);
    INFO(out << err);
    REQUIRE(rc == 0);
    // The stage ends when its pages (the rollback under way) are delivered.
    // A kill in the middle of an HTTP delivery can repeat that one page
    // (at-least-once; Alertmanager and PagerDuty deduplicate it by label and
    // dedup key); between stages nothing repeats.
    REQUIRE(WaitCount(db, "SELECT COUNT(*) FROM outbox WHERE state = 'sent'", 4));
    d.Kill();
  }
  CHECK(QueryInt(db, "SELECT COUNT(*) FROM decisions") == 1);
  CHECK(QueryInt(db, "SELECT COUNT(*) FROM commands") == 1);
  // Stage 4: every rank gets the command after the restart and acknowledges.
  std::string command_id;
  {
    Trainwatchd d(dir, "", pager);
    TestAgent r0(d.channel()), r1(d.channel());
    r0.Send(Hello(run, 0, 2));
    r1.Send(Hello(run, 1, 2));
    v1::Command c0, c1;
    REQUIRE(r0.WaitCommand(&c0));
    REQUIRE(r1.WaitCommand(&c1));
    CHECK(c0.command_id() == c1.command_id());
    command_id = c0.command_id();
    for (int rank : {0, 1}) {
      v1::AgentMessage ack;
      auto* a = ack.mutable_command_ack();
      a->set_run_id(run);
      a->set_rank(rank);
      a->set_command_id(command_id);
      a->set_status(v1::ACK_STATUS_APPLIED);
      (rank == 0 ? r0 : r1).Send(ack);
    }
    REQUIRE(WaitCount(db, "SELECT COUNT(*) FROM command_acks", 2));
    REQUIRE(WaitCount(db, "SELECT COUNT(*) FROM runs WHERE attempt = 1", 1));
    d.Kill();
  }
  // Stage 5: the run passes the old point; the incident resolves.
  {
    Trainwatchd d(dir, "", pager);
    TestAgent r0(d.channel()), r1(d.channel());
    r0.Send(Hello(run, 0, 2));
    r1.Send(Hello(run, 1, 2));  // an applied command is not sent again
    for (int64_t s = 3001; s < 3800; ++s) r0.Send(Step(run, 0, 2, s, Loss(s), 1.0));
    REQUIRE(r0.WaitDurable(0, 3799));
    REQUIRE(WaitCount(db, "SELECT COUNT(*) FROM outbox WHERE state = 'sent'", 6));
    d.Kill();
  }
  CHECK(QueryInt(db, "SELECT state FROM incidents WHERE id = " + std::to_string(incident)) == 5);
  CHECK(QueryInt(db, "SELECT COUNT(*) FROM decisions") == 1);
  CHECK(QueryInt(db, "SELECT COUNT(*) FROM commands") == 1);
  CHECK(QueryInt(db, "SELECT COUNT(*) FROM command_acks") == 2);
  // Each receiver: the trigger, the rollback under way, the resolution, once each.
  std::map<std::string, int> pages;
  for (const auto& r : rx.requests()) {
    const std::string kind = r.body.find("\"resolved\"") != std::string::npos ? "resolved"
                             : r.body.find("rolling_back") != std::string::npos ? "rolling_back"
                                                                               : "trigger";
    pages[r.path + " " + kind]++;
  }
  for (const auto& [key, n] : pages) {
    INFO(key);
    CHECK(n == 1);
  }
  CHECK(pages.size() == 6);
}

}  // namespace
}  // namespace trainwatch::server
