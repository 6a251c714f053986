// Pages: into the outbox with the incident change, out to a local HTTP
// receiver in each of the four formats (checked field by field), retried
// after a failure, sent once per state change, and surviving a restart.

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include <catch2/catch.hpp>

#include "test_util.h"
#include "testing/fake_clock.h"
#include "testing/wait.h"
#include "trainwatch/core/json.h"
#include "pager.h"
#include "server.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using testing::Hello;
using testing::HttpReceiver;
using testing::Step;
using testing::TempDir;
using testing::TestAgent;
using testing::WaitUntil;

core::JsonValue J(const std::string& body) {
  auto v = core::ParseJson(body, "page");
  INFO(body);
  REQUIRE(v.ok());
  return *v;
}

std::string WritePagerConfig(const TempDir& dir, int port) {
  const std::string path = dir.File("pager.json");
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  std::ofstream(path) << "{\"grafana_url\": \"http://grafana.test/d/tw\", \"receivers\": ["
                      << "{\"name\": \"am\", \"type\": \"alertmanager\", \"url\": \"" << base
                      << "/am\"},"
                      << "{\"name\": \"pd\", \"type\": \"pagerduty\", \"url\": \"" << base
                      << "/pd\", \"routing_key_env\": \"TW_TEST_PD_KEY\"},"
                      << "{\"name\": \"slack\", \"type\": \"slack\", \"url\": \"" << base
                      << "/slack\"},"
                      << "{\"name\": \"hook\", \"type\": \"webhook\", \"url\": \"" << base
                      << "/hook\"}]}";
  return path;
}

double Loss(int64_t s) { return 2.5 + 0.01 * std::sin(static_cast<double>(s) * 1.7); }

TEST_CASE("pager: four formats - retries - once per state change - across a restart",
          "[server][pager]") {
  setenv("TW_TEST_PD_KEY", "pd-routing-key-secret", 1);
  TempDir dir;
  HttpReceiver rx;
  // The retry backoff reads this clock; the test moves it past each backoff
  // once the failed attempt before it has been seen.
  testing::FakeClock clock;
  auto attempts_reach = [&](size_t n) {
    return WaitUntil([&] { return rx.attempts() >= n; }, std::chrono::seconds(30));
  };
  rx.FailNext("/hook", 2, 503);  // the webhook is down for two attempts
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.db_path = dir.File("tw.db");
  o.pager_config_file = WritePagerConfig(dir, rx.port());
  std::string id;
  {
    auto server = Server::Start(o, &clock);
    REQUIRE(server.ok());
    auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->port()),
                                  grpc::InsecureChannelCredentials());
    TestAgent a(ch);
    a.Send(Hello("run-p", 0, 1));
    for (int64_t s = 0; s < 3600; ++s) {
      a.Send(Step("run-p", 0, 1, s, s >= 3000 ? Loss(s) + 0.3 : Loss(s), 1.0));
      if (s > 0 && s % 1000 == 0) {
        v1::AgentMessage c;
        c.mutable_checkpoint()->set_run_id("run-p");
        c.mutable_checkpoint()->set_step(s);
        c.mutable_checkpoint()->set_uri("ckpt://p/" + std::to_string(s));
        a.Send(c);
      }
    }
    REQUIRE(a.WaitDurable(0, 3599));
    // The webhook only after its retries: 1 s, then 2 s later.
    REQUIRE(attempts_reach(4));
    CHECK(rx.requests().size() == 3);
    clock.AdvanceMs(1000);
    REQUIRE(attempts_reach(5));
    CHECK(rx.requests().size() == 3);
    clock.AdvanceMs(2000);
    REQUIRE(rx.WaitFor(4));
    CHECK(a.Close().ok());
    (*server)->Shutdown();
  }
  auto reqs = rx.requests();
  std::map<std::string, std::string> by_path;
  for (const auto& r : reqs) by_path[r.path] = r.body;
  REQUIRE(by_path.size() == 4);
  // Alertmanager API v2
  core::JsonValue am = J(by_path["/am/api/v2/alerts"]);
  REQUIRE(am.type == core::JsonValue::Type::kArray);
  const core::JsonValue& alert = am.array[0];
  CHECK(alert.Find("labels")->Find("alertname")->string == "TrainwatchIncident");
  CHECK(alert.Find("labels")->Find("run")->string == "run-p");
  CHECK(alert.Find("labels")->Find("tier")->string == "2");
  id = alert.Find("labels")->Find("incident")->string;
  CHECK(id.rfind("I-", 0) == 0);
  CHECK(alert.Find("annotations")->Find("approve_command")->string.rfind(
            "twctl rollback approve " + id + " --to-step 3000", 0) == 0);
  CHECK(alert.Find("generatorURL")->string.find("var-run=run-p") != std::string::npos);
  CHECK(alert.Find("endsAt") == nullptr);  // firing
  // PagerDuty Events API v2
  core::JsonValue pd = J(by_path["/pd"]);
  CHECK(pd.Find("routing_key")->string == "pd-routing-key-secret");
  CHECK(pd.Find("event_action")->string == "trigger");
  CHECK(pd.Find("dedup_key")->string == "trainwatch-run-p-" + id);
  CHECK(pd.Find("payload")->Find("severity")->string == "error");
  CHECK(pd.Find("links")->array[0].Find("href")->string.find("grafana.test") != std::string::npos);
  // Slack blocks
  core::JsonValue slack = J(by_path["/slack"]);
  CHECK(slack.Find("blocks")->array[0].Find("text")->Find("text")->string.find(
            "twctl rollback approve " + id) != std::string::npos);
  // Generic webhook
  core::JsonValue hook = J(by_path["/hook"]);
  CHECK(hook.Find("event")->string == "trigger");
  CHECK(hook.Find("incident_id")->string == id);
  CHECK(hook.Find("state")->string == "awaiting_decision");
  CHECK(hook.Find("recommended_checkpoint_step")->number == 3000);

  // The receivers go down; the approval's pages wait in the outbox through
  // a restart, and are delivered once after it.
  for (const char* p : {"/am/api/v2/alerts", "/pd", "/slack", "/hook"}) rx.FailNext(p, 3, 500);
  {
    auto server = Server::Start(o, &clock);
    REQUIRE(server.ok());
    auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->port()),
                                  grpc::InsecureChannelCredentials());
    auto op = v1::OperatorService::NewStub(ch);
    grpc::ClientContext c;
    v1::RejectRollbackRequest req;
    req.set_incident_id(id);
    req.set_comment("benign for this test");
    v1::RejectRollbackResponse resp;
    const size_t before = rx.attempts();
    REQUIRE(op->RejectRollback(&c, req, &resp).ok());
    REQUIRE(attempts_reach(before + 4));  // each page tried once, and failed
    (*server)->Shutdown();  // before the pages could go out
  }
  CHECK(rx.requests().size() == 4);
  {
    auto server = Server::Start(o, &clock);
    REQUIRE(server.ok());
    // The backoff after each failure doubles: 1 s, 2 s, then 4 s.
    const size_t before = rx.attempts();
    clock.AdvanceMs(1000);
    REQUIRE(attempts_reach(before + 4));
    clock.AdvanceMs(2000);
    REQUIRE(attempts_reach(before + 8));
    CHECK(rx.requests().size() == 4);
    clock.AdvanceMs(4000);
    REQUIRE(rx.WaitFor(8, 30));
    // A page sent twice (its delivery not recorded) would go out again on
    // the pager's next pass, every 200 ms.
    CHECK(testing::HoldsFor([&] { return rx.requests().size() == 8; },
                            std::chrono::milliseconds(500)));
    (*server)->Shutdown();
  }
  reqs = rx.requests();
  CHECK(reqs.size() == 8);  // each page once: no loss, no double
  std::map<std::string, int> count;
  for (const auto& r : reqs) count[r.path]++;
  for (const auto& [path, n] : count) {
    INFO(path);
    CHECK(n == 2);
  }
  for (const auto& r : reqs) {
    if (r.path == "/am/api/v2/alerts" && r.body.find("dismissed") != std::string::npos) {
      CHECK(J(r.body).array[0].Find("endsAt") != nullptr);  // resolved in Alertmanager
    }
    if (r.path == "/pd" && r.body.find("\"resolve\"") != std::string::npos) {
      CHECK(J(r.body).Find("event_action")->string == "resolve");
    }
  }
  unsetenv("TW_TEST_PD_KEY");
}

TEST_CASE("pager: configuration errors are clear - secrets are required", "[server][pager]") {
  CHECK_FALSE(ParsePagerConfig("{}", "p.json").ok());
  auto bad = ParsePagerConfig(R"({"receivers": [{"name": "x", "type": "email", "url": "u"}]})",
                              "p.json");
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find("type must be alertmanager") !=
        std::string::npos);
  unsetenv("TW_NOT_SET_KEY");
  auto missing = ParsePagerConfig(
      R"({"receivers": [{"name": "pd", "type": "pagerduty", "url": "u",
          "routing_key_env": "TW_NOT_SET_KEY"}]})",
      "p.json");
  REQUIRE_FALSE(missing.ok());
  CHECK(std::string(missing.status().message()).find("TW_NOT_SET_KEY is not set") !=
        std::string::npos);
}

}  // namespace
}  // namespace trainwatch::server
