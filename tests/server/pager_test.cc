// Pages: into the outbox with the incident change, out to a local HTTP
// receiver in each of the four formats (checked field by field), retried
// after a failure, sent once per state change, and surviving a restart.
// Then the Pager alone, on a temp-dir store, a fake clock and a fake
// HttpPoster: the requests it makes, its backoff, its Alertmanager re-sends
// and its logs.

#include <grpcpp/grpcpp.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "pager/http_poster.h"
#include "pager/pager.h"
#include "daemon/server.h"
#include "test_util.h"
#include "testing/fake_clock.h"
#include "testing/wait.h"
#include "trainwatch/core/json.h"

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

// Records every request; answers from a queue, then 200.
class FakePoster final : public HttpPoster {
 public:
  struct Call {
    std::string url;
    Headers headers;
    std::string body;
    absl::Duration timeout;
  };
  void AnswerNext(absl::StatusOr<HttpResponse> answer) {
    std::lock_guard<std::mutex> lock(mu_);
    answers_.push_back(std::move(answer));
  }
  absl::StatusOr<HttpResponse> Post(const std::string& url, const Headers& headers,
                                    const std::string& body, absl::Duration timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back({url, headers, body, timeout});
    if (answers_.empty()) return HttpResponse{200, "ok"};
    absl::StatusOr<HttpResponse> a = std::move(answers_.front());
    answers_.pop_front();
    return a;
  }
  std::vector<Call> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  size_t count() { return calls().size(); }

 private:
  std::mutex mu_;
  std::deque<absl::StatusOr<HttpResponse>> answers_;
  std::vector<Call> calls_;
};

constexpr char kSlackUrl[] = "https://hooks.slack.test/services/T0/B0/slack-secret-token";
constexpr char kRoutingKey[] = "pd-secret-routing-key";

Receiver MakeReceiver(const std::string& name, Receiver::Type type, const std::string& url) {
  Receiver r;
  r.name = name;
  r.type = type;
  r.url = url;
  if (type == Receiver::Type::kPagerDuty) r.routing_key = kRoutingKey;
  return r;
}

PagerConfig FourReceivers() {
  PagerConfig c;
  c.grafana_url = "http://grafana.test/d/tw";
  c.receivers = {MakeReceiver("am", Receiver::Type::kAlertmanager, "http://am.test:9093/"),
                 MakeReceiver("pd", Receiver::Type::kPagerDuty, "https://pd.test/v2/enqueue"),
                 MakeReceiver("slack", Receiver::Type::kSlack, kSlackUrl),
                 MakeReceiver("hook", Receiver::Type::kWebhook, "http://hook.test/pages")};
  return c;
}

// A pager on its own store, clock and poster, stopped before they go.
struct PagerRig {
  explicit PagerRig(PagerConfig config) {
    auto s = Store::Open(dir.File("tw.db"));
    REQUIRE(s.ok());
    store = *std::move(s);
    pager = std::make_unique<Pager>(store.get(), std::move(config), &clock, &poster);
  }
  ~PagerRig() { pager->Stop(); }

  // Commits the incident with its pages, as the ingest writer does.
  void Commit(const IncidentRow& incident) {
    WriteBatch b;
    b.incidents.push_back(incident);
    b.outbox = pager->Rows(incident, "loss rose 12% over 600 steps", clock.NowMs());
    REQUIRE(store->Write(b).ok());
    pager->Wake();
  }
  std::vector<OutboxRow> Outbox(int64_t incident_id) {
    auto rows = store->Outbox(incident_id);
    REQUIRE(rows.ok());
    return *rows;
  }
  // Until the sender has recorded `attempts` for the incident's only page.
  OutboxRow WaitAttempts(int64_t incident_id, int attempts) {
    OutboxRow row;
    CHECK(testing::WaitUntil(
        [&] {
          std::vector<OutboxRow> rows = Outbox(incident_id);
          if (rows.size() != 1 || rows[0].attempts < attempts) return false;
          row = rows[0];
          return true;
        },
        std::chrono::seconds(10)));
    return row;
  }
  bool WaitCalls(size_t n) {
    return testing::WaitUntil([&] { return poster.count() >= n; }, std::chrono::seconds(10));
  }

  TempDir dir;
  std::unique_ptr<Store> store;
  testing::FakeClock clock;
  FakePoster poster;
  std::unique_ptr<Pager> pager;
};

IncidentRow Incident(int64_t id, IncidentState state, int64_t opened_ms) {
  IncidentRow i;
  i.id = id;
  i.run_id = "run-u";
  i.tier = 2;
  i.state = state;
  i.title = "loss divergence";
  i.onset_step = 2990;
  i.detection_step = 3010;
  i.recommended_checkpoint_step = 3000;
  i.opened_ms = opened_ms;
  i.updated_ms = opened_ms;
  return i;
}

std::map<std::string, FakePoster::Call> ByUrl(const std::vector<FakePoster::Call>& calls) {
  std::map<std::string, FakePoster::Call> m;
  for (const auto& c : calls) m[c.url] = c;
  return m;
}

TEST_CASE("pager alone: each receiver format - the URL - headers and body it posts",
          "[server][pager]") {
  PagerRig rig(FourReceivers());
  const int64_t t0 = rig.clock.NowMs();
  rig.Commit(Incident(7, IncidentState::kAwaitingDecision, t0));
  rig.pager->Start();
  REQUIRE(rig.WaitCalls(4));
  auto calls = ByUrl(rig.poster.calls());
  REQUIRE(calls.size() == 4);
  for (const auto& [url, c] : calls) {
    INFO(url);
    CHECK(c.headers == HttpPoster::Headers{{"Content-Type", "application/json"}});
    CHECK(c.timeout == absl::Seconds(10));
  }
  const std::string approve = "twctl rollback approve I-7 --to-step 3000 --comment \"...\"";
  // Alertmanager API v2, the base URL's trailing '/' dropped.
  REQUIRE(calls.count("http://am.test:9093/api/v2/alerts") == 1);
  core::JsonValue am = J(calls["http://am.test:9093/api/v2/alerts"].body);
  REQUIRE(am.type == core::JsonValue::Type::kArray);
  const core::JsonValue& alert = am.array[0];
  CHECK(alert.Find("labels")->Find("alertname")->string == "TrainwatchIncident");
  CHECK(alert.Find("labels")->Find("run")->string == "run-u");
  CHECK(alert.Find("labels")->Find("incident")->string == "I-7");
  CHECK(alert.Find("labels")->Find("severity")->string == "page");
  CHECK(alert.Find("annotations")->Find("approve_command")->string == approve);
  CHECK(alert.Find("annotations")->Find("state")->string == "awaiting_decision");
  CHECK(alert.Find("generatorURL")->string ==
        "http://grafana.test/d/tw?var-run=run-u&from=" + std::to_string(t0 - 3'600'000) +
            "&to=now");
  CHECK(alert.Find("startsAt")->string.back() == 'Z');
  CHECK(alert.Find("endsAt") == nullptr);
  // PagerDuty Events API v2
  REQUIRE(calls.count("https://pd.test/v2/enqueue") == 1);
  core::JsonValue pd = J(calls["https://pd.test/v2/enqueue"].body);
  CHECK(pd.Find("routing_key")->string == kRoutingKey);
  CHECK(pd.Find("event_action")->string == "trigger");
  CHECK(pd.Find("dedup_key")->string == "trainwatch-run-u-I-7");
  CHECK(pd.Find("payload")->Find("source")->string == "trainwatchd");
  CHECK(pd.Find("payload")->Find("custom_details")->Find("onset_step")->number == 2990);
  CHECK(pd.Find("links")->array[0].Find("text")->string == "Grafana");
  // Slack, posted to its secret webhook URL.
  REQUIRE(calls.count(kSlackUrl) == 1);
  core::JsonValue slack = J(calls[kSlackUrl].body);
  CHECK(slack.Find("text")->string == "[trainwatch] I-7 tier 2 on run-u: awaiting_decision");
  CHECK(slack.Find("blocks")->array[0].Find("text")->Find("text")->string.find(
            "Approve: `" + approve + "`") != std::string::npos);
  // Generic webhook
  REQUIRE(calls.count("http://hook.test/pages") == 1);
  core::JsonValue hook = J(calls["http://hook.test/pages"].body);
  CHECK(hook.Find("event")->string == "trigger");
  CHECK(hook.Find("incident_id")->string == "I-7");
  CHECK(hook.Find("summary")->string == "loss rose 12% over 600 steps");
  CHECK(hook.Find("detection_step")->number == 3010);
  CHECK(rig.pager->sent_total() == 4);

  // Dismissed: every receiver hears the resolve.
  rig.clock.AdvanceMs(5'000);
  IncidentRow closed = Incident(7, IncidentState::kDismissed, t0);
  closed.closed_ms = rig.clock.NowMs();
  rig.Commit(closed);
  REQUIRE(rig.WaitCalls(8));
  std::vector<FakePoster::Call> all = rig.poster.calls();
  auto resolved = ByUrl({all.begin() + 4, all.end()});
  REQUIRE(resolved.size() == 4);
  CHECK(J(resolved["http://am.test:9093/api/v2/alerts"].body).array[0].Find("endsAt") != nullptr);
  CHECK(J(resolved["https://pd.test/v2/enqueue"].body).Find("event_action")->string == "resolve");
  CHECK(J(resolved["http://hook.test/pages"].body).Find("event")->string == "resolve");
  CHECK(J(resolved[kSlackUrl].body).Find("text")->string.find("dismissed") != std::string::npos);
}

TEST_CASE("pager alone: with no checkpoint to roll back to a page suggests no approval",
          "[server][pager]") {
  PagerRig rig(FourReceivers());
  IncidentRow i = Incident(8, IncidentState::kAwaitingDecision, rig.clock.NowMs());
  i.recommended_checkpoint_step = -1;  // the run reported none before the onset
  rig.Commit(i);
  rig.pager->Start();
  REQUIRE(rig.WaitCalls(4));
  auto calls = ByUrl(rig.poster.calls());
  const core::JsonValue am = J(calls["http://am.test:9093/api/v2/alerts"].body);
  CHECK(am.array[0].Find("annotations")->Find("approve_command")->string == "");
  CHECK(J(calls[kSlackUrl].body).Find("blocks")->array[0].Find("text")->Find("text")->string.find(
            "Approve:") == std::string::npos);
}

TEST_CASE("pager alone: a failure status or transport error is retried with backoff",
          "[server][pager]") {
  PagerConfig config;
  config.receivers = {MakeReceiver("hook", Receiver::Type::kWebhook, "http://hook.test/pages")};
  PagerRig rig(config);
  rig.poster.AnswerNext(HttpResponse{503, "busy"});
  const int64_t t0 = rig.clock.NowMs();
  rig.Commit(Incident(3, IncidentState::kAwaitingDecision, t0));
  rig.pager->Start();

  OutboxRow row = rig.WaitAttempts(3, 1);
  CHECK(row.state == "pending");
  CHECK(row.last_error == "HTTP 503");
  CHECK(row.next_attempt_ms == t0 + 1'000);  // the first backoff: 1 s on the pager's clock
  // Not due yet: a pass that posts a later incident's page leaves it.
  rig.clock.AdvanceMs(999);
  rig.Commit(Incident(30, IncidentState::kAwaitingDecision, t0));
  REQUIRE(rig.WaitCalls(2));
  CHECK(rig.Outbox(3)[0].attempts == 1);
  rig.poster.AnswerNext(absl::UnavailableError("Connection refused"));
  rig.clock.AdvanceMs(1);
  rig.pager->Wake();
  row = rig.WaitAttempts(3, 2);
  CHECK(row.state == "pending");
  CHECK(row.last_error == "Connection refused");
  CHECK(row.next_attempt_ms == t0 + 1'000 + 2'000);  // doubled
  rig.clock.AdvanceMs(2'000);
  rig.pager->Wake();
  row = rig.WaitAttempts(3, 3);
  CHECK(row.state == "sent");
  CHECK(row.sent_ms == t0 + 3'000);
  std::vector<FakePoster::Call> calls = rig.poster.calls();
  REQUIRE(calls.size() == 4);
  CHECK(J(calls[1].body).Find("incident_id")->string == "I-30");
  CHECK(calls[2].body == calls[0].body);  // the same page each time
  CHECK(calls[3].body == calls[0].body);
  CHECK(rig.pager->failed_total() == 2);
  CHECK(rig.pager->sent_total() == 2);
}

TEST_CASE("pager alone: one page per receiver and state change", "[server][pager]") {
  PagerConfig config;
  config.receivers = {MakeReceiver("hook", Receiver::Type::kWebhook, "http://hook.test/pages"),
                      MakeReceiver("slack", Receiver::Type::kSlack, kSlackUrl)};
  PagerRig rig(config);
  const int64_t t0 = rig.clock.NowMs();
  rig.Commit(Incident(5, IncidentState::kAwaitingDecision, t0));
  rig.Commit(Incident(5, IncidentState::kAwaitingDecision, t0));  // no change: no page
  rig.pager->Start();
  REQUIRE(rig.WaitCalls(2));
  rig.Commit(Incident(5, IncidentState::kAwaitingDecision, t0));
  rig.Commit(Incident(5, IncidentState::kRollingBack, t0));
  rig.Commit(Incident(5, IncidentState::kRollingBack, t0));
  // A later incident's pages come after every due page of incident 5 in
  // the same pass, so once they are out any repeat would be too.
  REQUIRE(rig.WaitCalls(4));
  rig.Commit(Incident(6, IncidentState::kAwaitingDecision, t0));
  REQUIRE(rig.WaitCalls(6));
  std::map<std::string, int> pages;  // url + event + state -> posts
  for (const auto& c : rig.poster.calls()) {
    const core::JsonValue body = J(c.body);
    if (c.url == kSlackUrl) {
      pages[c.url + " " + body.Find("text")->string]++;
    } else {
      pages[c.url + " " + body.Find("incident_id")->string + " " + body.Find("event")->string +
            " " + body.Find("state")->string]++;
    }
  }
  CHECK(pages == std::map<std::string, int>{
                     {"http://hook.test/pages I-5 trigger awaiting_decision", 1},
                     {"http://hook.test/pages I-5 update rolling_back", 1},
                     {"http://hook.test/pages I-6 trigger awaiting_decision", 1},
                     {std::string(kSlackUrl) + " [trainwatch] I-5 tier 2 on run-u: awaiting_decision", 1},
                     {std::string(kSlackUrl) + " [trainwatch] I-5 tier 2 on run-u: rolling_back", 1},
                     {std::string(kSlackUrl) + " [trainwatch] I-6 tier 2 on run-u: awaiting_decision", 1}});
  CHECK(rig.Outbox(5).size() == 4);
  // Below min_tier, no page at all.
  IncidentRow low = Incident(9, IncidentState::kAwaitingDecision, t0);
  low.tier = 1;
  CHECK(rig.pager->Rows(low, "", t0).empty());
}

TEST_CASE("pager alone: a firing alert is re-sent to Alertmanager each resend period",
          "[server][pager]") {
  PagerConfig config;
  config.receivers = {MakeReceiver("am", Receiver::Type::kAlertmanager, "http://am.test"),
                      MakeReceiver("hook", Receiver::Type::kWebhook, "http://hook.test/pages")};
  config.resend_ms = 60'000;
  PagerRig rig(config);
  rig.Commit(Incident(4, IncidentState::kAwaitingDecision, rig.clock.NowMs()));
  rig.pager->Start();
  REQUIRE(rig.WaitCalls(2));
  REQUIRE(testing::WaitUntil(
      [&] {
        for (const OutboxRow& r : rig.Outbox(4)) {
          if (r.state != "sent") return false;
        }
        return true;
      },
      std::chrono::seconds(10)));
  rig.clock.AdvanceMs(60'000);
  REQUIRE(rig.WaitCalls(3));
  std::vector<FakePoster::Call> calls = rig.poster.calls();
  CHECK(calls[2].url == "http://am.test/api/v2/alerts");
  CHECK(calls[2].body == ByUrl(calls)["http://am.test/api/v2/alerts"].body);
  CHECK(rig.pager->sent_total() == 2);  // a re-send is not a new page
}

// Everything written to stderr (the server's log) while alive.
class StderrCapture {
 public:
  explicit StderrCapture(const std::string& path) : path_(path) {
    std::fflush(stderr);
    saved_ = dup(2);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    close(fd);
  }
  ~StderrCapture() { Restore(); }
  std::string Restore() {
    if (saved_ >= 0) {
      std::fflush(stderr);
      dup2(saved_, 2);
      close(saved_);
      saved_ = -1;
    }
    return testing::ReadFile(path_);
  }

 private:
  std::string path_;
  int saved_ = -1;
};

TEST_CASE("pager alone: failures are logged without the Slack URL or routing key",
          "[server][pager]") {
  PagerConfig config = FourReceivers();
  PagerRig rig(config);
  for (int i = 0; i < 4; ++i) rig.poster.AnswerNext(absl::UnavailableError("Connection refused"));
  StderrCapture capture(rig.dir.File("stderr.log"));
  rig.Commit(Incident(8, IncidentState::kAwaitingDecision, rig.clock.NowMs()));
  rig.pager->Start();
  const bool all_tried = testing::WaitUntil(
      [&] {
        std::vector<OutboxRow> rows = rig.Outbox(8);
        for (const OutboxRow& r : rows) {
          if (r.attempts < 1) return false;
        }
        return rows.size() == 4;
      },
      std::chrono::seconds(10));
  rig.pager->Stop();
  const std::string log = capture.Restore();
  REQUIRE(all_tried);
  INFO(log);
  CHECK(log.find("pager: slack trigger:awaiting_decision for I-8 failed (Connection refused)") !=
        std::string::npos);
  CHECK(log.find("pager: pd ") != std::string::npos);
  CHECK(log.find("slack-secret-token") == std::string::npos);
  CHECK(log.find("hooks.slack.test") == std::string::npos);
  CHECK(log.find(kRoutingKey) == std::string::npos);
  // The secrets did go where they belong.
  auto calls = ByUrl(rig.poster.calls());
  CHECK(calls.count(kSlackUrl) == 1);
  CHECK(J(calls["https://pd.test/v2/enqueue"].body).Find("routing_key")->string == kRoutingKey);
}

// Found by fuzz/pager_config_fuzz (fuzz/corpus/pager_config_fuzz/
// crash-min-tier-overflow): numbers outside int's range were cast unchecked.
TEST_CASE("pager: min_tier and resend_seconds out of range are errors naming the file",
          "[server][pager]") {
  const std::string receivers =
      R"("receivers": [{"name": "am", "type": "alertmanager", "url": "u"}])";
  for (const std::string bad : {R"("min_tier": 7777777771)", R"("min_tier": 0)",
                                R"("min_tier": 2.5)", R"("min_tier": "2")"}) {
    auto c = ParsePagerConfig("{" + bad + ", " + receivers + "}", "p.json");
    REQUIRE_FALSE(c.ok());
    CHECK(std::string(c.status().message()) == "p.json:1:14: min_tier must be 1, 2 or 3");
  }
  for (const std::string bad : {R"("resend_seconds": 1e300)", R"("resend_seconds": 0)",
                                R"("resend_seconds": -Infinity)"}) {
    auto c = ParsePagerConfig("{" + bad + ", " + receivers + "}", "p.json");
    REQUIRE_FALSE(c.ok());
    CHECK(std::string(c.status().message()) ==
          "p.json:1:20: resend_seconds must be in [1, 86400]");
  }
  auto ok = ParsePagerConfig(R"({"min_tier": 3, "resend_seconds": 30, )" + receivers + "}",
                             "p.json");
  REQUIRE(ok.ok());
  CHECK(ok->min_tier == 3);
  CHECK(ok->resend_ms == 30'000);
}

}  // namespace
}  // namespace trainwatch::server
