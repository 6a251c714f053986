// A page through Debian's real Alertmanager on loopback: trainwatchd posts
// the alert (API v2), Alertmanager routes it to a webhook receiver, and the
// notification carries the summary and the dashboard link; when the
// incident ends, Alertmanager sends the resolution.


#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "stack.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/core/json.h"
#include "daemon/server.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using testing::Hello;
using testing::HttpReceiver;
using testing::Step;
using testing::TempDir;
using testing::TestAgent;
using testing::Alertmanager;

double Loss(int64_t s) { return 2.5 + 0.01 * std::sin(static_cast<double>(s) * 1.7); }

TEST_CASE("alertmanager: a tier 2 page arrives through the real Alertmanager and resolves",
          "[integration][alertmanager]") {
  TempDir dir;
  HttpReceiver hook;
  Alertmanager am(dir, hook.port());
  const std::string pager = am.WritePagerConfig(dir, "http://grafana.local/d/trainwatch");
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.db_path = dir.File("tw.db");
  o.pager_config_file = pager;
  auto server = Server::Start(o);
  REQUIRE(server.ok());
  auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->port()),
                                grpc::InsecureChannelCredentials());
  TestAgent a(ch);
  a.Send(Hello("run-am", 0, 1));
  for (int64_t s = 0; s < 3600; ++s) {
    a.Send(Step("run-am", 0, 1, s, s >= 3000 ? Loss(s) + 0.3 : Loss(s), 1.0));
  }
  REQUIRE(a.WaitDurable(0, 3599));
  REQUIRE(hook.WaitFor(1, 30));
  auto first = core::ParseJson(hook.requests()[0].body, "webhook");
  REQUIRE(first.ok());
  CHECK(first->Find("status")->string == "firing");
  const core::JsonValue& alert = first->Find("alerts")->array[0];
  CHECK(alert.Find("labels")->Find("run")->string == "run-am");
  const std::string id = alert.Find("labels")->Find("incident")->string;
  CHECK(alert.Find("annotations")->Find("summary")->string.find(id) != std::string::npos);
  CHECK(alert.Find("annotations")->Find("description")->string.find("non_recovering") !=
        std::string::npos);
  CHECK(alert.Find("annotations")->Find("dashboard")->string.find(
            "http://grafana.local/d/trainwatch?var-run=run-am") == 0);
  CHECK(alert.Find("generatorURL")->string.find("grafana.local") != std::string::npos);
  // The incident ends (rejected here: a human decided it is benign).
  auto op = v1::OperatorService::NewStub(ch);
  grpc::ClientContext c;
  v1::RejectRollbackRequest req;
  req.set_incident_id(id);
  req.set_comment("benign");
  v1::RejectRollbackResponse resp;
  REQUIRE(op->RejectRollback(&c, req, &resp).ok());
  CHECK(testing::WaitUntil(
      [&] {
        for (const auto& r : hook.requests()) {
          auto v = core::ParseJson(r.body, "webhook");
          if (v.ok() && v->Find("status") && v->Find("status")->string == "resolved") return true;
        }
        return false;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(100)));
  CHECK(a.Close().ok());
}

// Alertmanager's HA: trainwatchd sends each page to every instance of a
// gossip cluster (one receiver each), and the cluster notifies once. What a
// replicated trainwatchd relies on when a page is re-sent after a failover.
TEST_CASE("alertmanager: a page sent to both instances of a cluster notifies once",
          "[integration][alertmanager]") {
  TempDir dir, dir_a, dir_b;
  HttpReceiver hook;
  const int gossip_a = testing::FreePort(), gossip_b = testing::FreePort();
  Alertmanager am_a(dir_a, hook.port(), gossip_a, {gossip_b});
  Alertmanager am_b(dir_b, hook.port(), gossip_b, {gossip_a});
  REQUIRE(testing::WaitUntil([&] { return am_a.ClusterSize() == 2 && am_b.ClusterSize() == 2; },
                             std::chrono::seconds(30), std::chrono::milliseconds(100)));
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.db_path = dir.File("tw.db");
  o.pager_config_file =
      Alertmanager::WritePagerConfig(dir, "http://grafana.local/d/trainwatch", {&am_a, &am_b});
  auto server = Server::Start(o);
  REQUIRE(server.ok());
  auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->port()),
                                grpc::InsecureChannelCredentials());
  TestAgent a(ch);
  a.Send(Hello("run-ha", 0, 1));
  for (int64_t s = 0; s < 3600; ++s) {
    a.Send(Step("run-ha", 0, 1, s, s >= 3000 ? Loss(s) + 0.3 : Loss(s), 1.0));
  }
  REQUIRE(a.WaitDurable(0, 3599));
  REQUIRE(hook.WaitFor(1, 60));
  auto first = core::ParseJson(hook.requests()[0].body, "webhook");
  REQUIRE(first.ok());
  const std::string id =
      first->Find("alerts")->array[0].Find("labels")->Find("incident")->string;
  // Both instances received the alert (trainwatchd's outbox sent it to each)...
  auto outbox = (*server)->store()->Outbox(std::stoll(id.substr(2)));
  REQUIRE(outbox.ok());
  int sent = 0;
  for (const OutboxRow& row : *outbox) sent += row.state == "sent";
  CHECK(sent == 2);
  // ... and the second instance, which waits one peer-timeout (4 s) for the
  // first's notification to gossip, notifies nobody: over two timeouts later
  // there is still one notification. Without the cluster there were two.
  CHECK(testing::HoldsFor([&] { return testing::FiringAlerts(hook, id).size() == 1 &&
                                       hook.requests().size() == 1; },
                          std::chrono::seconds(10)));
  CHECK(a.Close().ok());
}

}  // namespace
}  // namespace trainwatch::server
