// trainwatchd in process, over loopback: many agents at once, dedup,
// out-of-order and missing ranks, a restart from the store, the auth matrix
// with and without TLS, malformed and oversized messages, and a live
// /metrics scrape checked by promtool.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "server_fixture.h"
#include "test_util.h"
#include "testing/fake_clock.h"
#include "testing/wait.h"
#include "trainwatch/core/rule_engine.h"
#include "daemon/server.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using testing::Hello;
using testing::Step;
using testing::TempDir;
using testing::TestAgent;
using testing::Running;
using testing::StartServer;

// Baseline step values with a little deterministic noise.
double Loss(int64_t s) { return 2.5 + 0.01 * std::sin(static_cast<double>(s) * 1.7); }
double Grad(int64_t s) { return 1.0 + 0.05 * std::cos(static_cast<double>(s) * 0.9); }

TEST_CASE("server: many agents stream at once and every record is durable when acked",
          "[server][ingest]") {
  TempDir dir;
  Running r = StartServer(dir.File("tw.db"));
  constexpr int kRuns = 16;
  constexpr int kSteps = 400;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kRuns; ++i) {
    threads.emplace_back([&, i] {
      TestAgent a(r.channel);
      const std::string run = "run-" + std::to_string(i);
      a.Send(Hello(run, 0, 8));
      for (int64_t s = 0; s < kSteps; ++s) a.Send(Step(run, 0, 8, s, Loss(s), Grad(s)));
      if (a.WaitDurable(0, kSteps - 1) && a.Close().ok()) ok++;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok == kRuns);
  for (int i = 0; i < kRuns; ++i) {
    auto n = r.server->store()->CountSteps("run-" + std::to_string(i));
    REQUIRE(n.ok());
    CHECK(*n == kSteps);
  }
  const auto snap = r.server->ingestor()->views().All();
  CHECK(snap.size() == kRuns);
  for (const RunView& s : snap) CHECK(s.row.last_step == kSteps - 1);
}

TEST_CASE("server: a re-sent range after a reconnect is deduplicated", "[server][ingest]") {
  TempDir dir;
  Running r = StartServer(dir.File("tw.db"));
  {
    TestAgent a(r.channel);
    a.Send(Hello("run-d", 0, 1));
    for (int64_t s = 0; s < 100; ++s) a.Send(Step("run-d", 0, 1, s, Loss(s), Grad(s)));
    REQUIRE(a.WaitDurable(0, 99));
    REQUIRE(a.Close().ok());
  }
  {
    TestAgent a(r.channel);  // the agent reconnects and re-sends what it holds
    a.Send(Hello("run-d", 0, 1));
    for (int64_t s = 50; s < 150; ++s) a.Send(Step("run-d", 0, 1, s, Loss(s), Grad(s)));
    REQUIRE(a.WaitDurable(0, 149));
    REQUIRE(a.Close().ok());
  }
  auto n = r.server->store()->CountSteps("run-d");
  REQUIRE(n.ok());
  CHECK(*n == 150);
  CHECK(r.server->ingestor()->Stats().duplicates_total >= 50);
}

TEST_CASE("server: per-rank records out of order - and a step completed without a rank",
          "[server][ingest][aggregation]") {
  TempDir dir;
  testing::FakeClock clock;
  ServerOptions o;
  o.ingest.aggregation_timeout_ms = 30'000;
  Running r = StartServer(dir.File("tw.db"), &clock, o);
  const std::string run = "run-r";
  TestAgent a0(r.channel), a1(r.channel), a2(r.channel);
  a0.Send(Hello(run, 0, 3));
  a1.Send(Hello(run, 1, 3));
  a2.Send(Hello(run, 2, 3));
  // Rank 2 first, rank 0 in reverse order, rank 1 skips step 5.
  for (int64_t s = 0; s < 10; ++s) {
    a2.Send(Step(run, 2, 3, s, 3.0, 1.0, 8.0, v1::REPORT_SCOPE_RANK));
  }
  for (int64_t s = 9; s >= 0; --s) {
    a0.Send(Step(run, 0, 3, s, 1.0, 2.0, 8.0, v1::REPORT_SCOPE_RANK));
  }
  for (int64_t s = 0; s < 10; ++s) {
    if (s != 5) a1.Send(Step(run, 1, 3, s, 2.0, 4.0, 8.0, v1::REPORT_SCOPE_RANK));
  }
  REQUIRE(a2.WaitDurable(2, 9));
  REQUIRE(a0.WaitDurable(0, 9));
  REQUIRE(a1.WaitDurable(1, 9));
  r.server->ingestor()->Flush();
  // Steps 0-4 complete; 5 waits for rank 1, and 6-9 behind it.
  auto early = r.server->store()->StepsBetween(run, 0, 0, 9);
  REQUIRE(early.ok());
  REQUIRE(early->size() == 5);
  CHECK((*early)[2].Get(core::Signal::kLoss) == Approx(2.0));      // mean of 1, 2, 3
  CHECK((*early)[2].Get(core::Signal::kGradNorm) == Approx(4.0));  // max
  CHECK((*early)[2].missing_ranks.empty());
  CHECK((*early)[2].shards == std::vector<uint64_t>{1000002});
  clock.AdvanceMs(31'000);
  // The writer notices the timeout on its next wake-up (every 50 ms, real time).
  std::vector<StepRow> all;
  REQUIRE(testing::WaitUntil(
      [&] {
        auto steps = r.server->store()->StepsBetween(run, 0, 0, 9);
        REQUIRE(steps.ok());
        all = *steps;
        return all.size() == 10;
      },
      std::chrono::seconds(10)));
  REQUIRE(all.size() == 10);
  CHECK(all[5].missing_ranks == "1");
  CHECK(all[5].Get(core::Signal::kLoss) == Approx(2.0));  // mean of ranks 0 and 2
  CHECK(all[6].missing_ranks.empty());
  // A late record for step 5 is stored (and deduplicated) but not re-merged.
  a1.Send(Step(run, 1, 3, 5, 2.0, 4.0, 8.0, v1::REPORT_SCOPE_RANK));
  a1.Send(Step(run, 1, 3, 5, 2.0, 4.0, 8.0, v1::REPORT_SCOPE_RANK));
  REQUIRE(a1.WaitDurable(1, 9));
  r.server->ingestor()->Flush();
  auto after = r.server->store()->StepsBetween(run, 0, 5, 5);
  REQUIRE(after.ok());
  CHECK((*after)[0].missing_ranks == "1");
  for (TestAgent* a : {&a0, &a1, &a2}) CHECK(a->Close().ok());
}

TEST_CASE("server: a restart rebuilds every run's state from the store",
          "[server][restart]") {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  // A reference engine fed the same records: the rebuilt state must agree
  // with it to the bit.
  core::RuleEngine reference{core::RuleConfig()};
  core::StepOutcome ref_out;
  auto feed_ref = [&](int64_t s, double loss, double grad) {
    core::StepRecord rec;
    rec.step = s;
    rec.Set(core::Signal::kLoss, loss).Set(core::Signal::kGradNorm, grad);
    rec.Set(core::Signal::kLogZ, 8.0).Set(core::Signal::kNanFrac, 0.0);
    const uint64_t shard = 1000000 + static_cast<uint64_t>(s);
    rec.shards = absl::MakeConstSpan(&shard, 1);
    REQUIRE(reference.Judge(rec, &ref_out).ok());
  };
  int64_t incidents_before = 0;
  {
    Running r = StartServer(db);
    TestAgent a(r.channel);
    a.Send(Hello("run-x", 0, 1));
    for (int64_t s = 0; s < 3000; ++s) {
      const bool bad = s == 2500;
      const double loss = bad ? 3.2 : Loss(s), grad = bad ? 9.0 : Grad(s);
      a.Send(Step("run-x", 0, 1, s, loss, grad));
      feed_ref(s, loss, grad);
    }
    REQUIRE(a.WaitDurable(0, 2999));
    REQUIRE(a.Close().ok());
    IncidentFilter f;
    auto inc = r.server->store()->ListIncidents(f);
    REQUIRE(inc.ok());
    incidents_before = static_cast<int64_t>(inc->size());
    REQUIRE(incidents_before == 1);  // the data anomaly at 2,500
    CHECK((*inc)[0].tier == 1);
    r.server->Shutdown();
  }
  Running r = StartServer(db);
  const auto snap = r.server->ingestor()->views().All();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].row.last_step == 2999);
  TestAgent a(r.channel);
  a.Send(Hello("run-x", 0, 1));
  a.Send(Step("run-x", 0, 1, 2999, Loss(2999), Grad(2999)));  // a re-send: no new incident
  for (int64_t s = 3000; s < 3100; ++s) {
    const bool bad = s == 3050;  // past warm-up only if the state came back
    const double loss = bad ? 3.2 : Loss(s), grad = bad ? 9.0 : Grad(s);
    a.Send(Step("run-x", 0, 1, s, loss, grad));
    feed_ref(s, loss, grad);
    if (s == 3050) CHECK(ref_out.verdict.decision == core::Decision::kSkipUpdate);
  }
  REQUIRE(a.WaitDurable(0, 3099));
  REQUIRE(a.Close().ok());
  IncidentFilter f;
  auto inc = r.server->store()->ListIncidents(f);
  REQUIRE(inc.ok());
  REQUIRE(inc->size() == 2);  // the old one not re-opened, the new one found
  CHECK((*inc)[1].detection_step >= 3050);
  CHECK((*inc)[1].onset_step == 3050);
  auto steps = r.server->store()->StepsBetween("run-x", 0, 3050, 3099);
  REQUIRE(steps.ok());
  CHECK((*steps)[0].decision == static_cast<int>(core::Decision::kSkipUpdate));
  CHECK(std::memcmp(&steps->back().loss_ema_ratio, &ref_out.loss_ema_ratio, sizeof(double)) ==
        0);
}

// ------------------------------------------------------------------ auth

struct Creds {
  std::string name;
  std::string token;
};

std::string WriteTokens(const TempDir& dir) {
  const std::string path = dir.File("tokens.json");
  std::ofstream(path) << R"({"tokens": [
    {"name": "trainer-a", "token": "agent-token-run-a-0123", "role": "agent", "runs": ["run-a"]},
    {"name": "grafana", "token": "reader-token-012345678", "role": "reader"},
    {"name": "oncall", "token": "operator-token-0123456", "role": "operator"}]})";
  return path;
}

// Calls every method once with `token`; returns method -> status code.
std::map<std::string, grpc::StatusCode> CallAll(const std::shared_ptr<grpc::Channel>& ch,
                                                const std::string& token) {
  std::map<std::string, grpc::StatusCode> out;
  auto op = v1::OperatorService::NewStub(ch);
  auto ctx = [&](grpc::ClientContext* c) {
    if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  };
  {
    TestAgent a(ch, token, std::chrono::seconds(10));
    a.Send(Hello("run-a", 0, 1));
    a.Send(Step("run-a", 0, 1, 0, 2.5, 1.0));
    a.WaitDurable(0, 0);
    out["Stream"] = a.Close().error_code();
  }
#define TW_CALL(method, req_type, resp_type, setup)  \
  {                                                  \
    grpc::ClientContext c;                           \
    ctx(&c);                                         \
    v1::req_type req;                                \
    setup;                                           \
    v1::resp_type resp;                              \
    out[#method] = op->method(&c, req, &resp).error_code(); \
  }
  TW_CALL(ListRuns, ListRunsRequest, ListRunsResponse, {});
  TW_CALL(GetRunStatus, GetRunStatusRequest, GetRunStatusResponse, req.set_run_id("run-a"));
  TW_CALL(ListIncidents, ListIncidentsRequest, ListIncidentsResponse, {});
  TW_CALL(GetIncident, GetIncidentRequest, GetIncidentResponse, req.set_incident_id("I-1"));
  TW_CALL(ApproveRollback, ApproveRollbackRequest, ApproveRollbackResponse,
          req.set_incident_id("I-1"));
  TW_CALL(RejectRollback, RejectRollbackRequest, RejectRollbackResponse,
          req.set_incident_id("I-1"));
  TW_CALL(ListQuarantinedShards, ListQuarantinedShardsRequest, ListQuarantinedShardsResponse,
          req.set_run_id("run-a"));
#undef TW_CALL
  {
    grpc::ClientContext c;
    ctx(&c);
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    v1::WatchIncidentsRequest req;
    auto reader = op->WatchIncidents(&c, req);
    v1::IncidentEvent ev;
    while (reader->Read(&ev)) {
    }
    const grpc::StatusCode code = reader->Finish().error_code();
    // An allowed watch runs until its deadline.
    out["WatchIncidents"] = code == grpc::DEADLINE_EXCEEDED ? grpc::OK : code;
  }
  return out;
}

void CheckMatrix(const std::shared_ptr<grpc::Channel>& ch) {
  const std::vector<std::string> read = {"ListRuns", "GetRunStatus", "ListIncidents",
                                         "GetIncident", "ListQuarantinedShards",
                                         "WatchIncidents"};
  const std::vector<std::string> decide = {"ApproveRollback", "RejectRollback"};
  auto allowed = [](grpc::StatusCode c) {
    return c != grpc::UNAUTHENTICATED && c != grpc::PERMISSION_DENIED && c != grpc::UNAVAILABLE;
  };
  for (const std::string& token : {std::string(), std::string("wrong-token-0123456789")}) {
    for (const auto& [method, code] : CallAll(ch, token)) {
      INFO(method << " with token '" << token << "'");
      CHECK(code == grpc::UNAUTHENTICATED);
    }
  }
  {
    const auto agent = CallAll(ch, "agent-token-run-a-0123");
    CHECK(agent.at("Stream") == grpc::OK);
    for (const auto& m : read) CHECK(agent.at(m) == grpc::PERMISSION_DENIED);
    for (const auto& m : decide) CHECK(agent.at(m) == grpc::PERMISSION_DENIED);
  }
  {
    const auto reader = CallAll(ch, "reader-token-012345678");
    CHECK(reader.at("Stream") == grpc::PERMISSION_DENIED);
    for (const auto& m : read) {
      INFO(m);
      CHECK(allowed(reader.at(m)));
    }
    for (const auto& m : decide) CHECK(reader.at(m) == grpc::PERMISSION_DENIED);
  }
  {
    const auto oper = CallAll(ch, "operator-token-0123456");
    CHECK(oper.at("Stream") == grpc::PERMISSION_DENIED);
    for (const auto& m : read) {
      INFO(m);
      CHECK(allowed(oper.at(m)));
    }
    for (const auto& m : decide) {
      INFO(m);
      CHECK(allowed(oper.at(m)));
    }
  }
  // An agent token scoped to run-a may not report for run-b.
  TestAgent a(ch, "agent-token-run-a-0123", std::chrono::seconds(10));
  a.Send(Hello("run-b", 0, 1));
  const grpc::Status s = a.Close();
  CHECK(s.error_code() == grpc::PERMISSION_DENIED);
  CHECK(s.error_message().find("run-b") != std::string::npos);
}

TEST_CASE("server: the auth matrix - every method by every role - in clear", "[server][auth]") {
  TempDir dir;
  ServerOptions o;
  o.tokens_file = WriteTokens(dir);
  Running r = StartServer(dir.File("tw.db"), core::SystemClock(), o);
  CheckMatrix(r.channel);
}

TEST_CASE("server: the auth matrix over TLS - and mutual TLS", "[server][auth][tls]") {
  TempDir dir;
  std::string certs_log;
  const bool made = testing::MakeCerts(dir, &certs_log);
  INFO(certs_log);
  REQUIRE(made);
  ServerOptions o;
  o.tokens_file = WriteTokens(dir);
  o.tls_cert_file = dir.File("server.pem");
  o.tls_key_file = dir.File("server.key");
  SECTION("TLS") {
    Running r = StartServer(dir.File("tw.db"), core::SystemClock(), o);
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = testing::ReadFile(dir.File("ca.pem"));
    auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(r.server->port()),
                                  grpc::SslCredentials(ssl));
    CheckMatrix(ch);
    // A plaintext client cannot talk to a TLS server.
    auto plain = grpc::CreateChannel("127.0.0.1:" + std::to_string(r.server->port()),
                                     grpc::InsecureChannelCredentials());
    CHECK(CallAll(plain, "operator-token-0123456").at("ListRuns") == grpc::UNAVAILABLE);
  }
  SECTION("mutual TLS") {
    o.tls_client_ca_file = dir.File("ca.pem");
    Running r = StartServer(dir.File("tw.db"), core::SystemClock(), o);
    grpc::SslCredentialsOptions with_cert;
    with_cert.pem_root_certs = testing::ReadFile(dir.File("ca.pem"));
    with_cert.pem_private_key = testing::ReadFile(dir.File("client.key"));
    with_cert.pem_cert_chain = testing::ReadFile(dir.File("client.pem"));
    auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(r.server->port()),
                                  grpc::SslCredentials(with_cert));
    CheckMatrix(ch);
    grpc::SslCredentialsOptions no_cert;
    no_cert.pem_root_certs = testing::ReadFile(dir.File("ca.pem"));
    auto anon = grpc::CreateChannel("127.0.0.1:" + std::to_string(r.server->port()),
                                    grpc::SslCredentials(no_cert));
    CHECK(CallAll(anon, "operator-token-0123456").at("ListRuns") == grpc::UNAVAILABLE);
  }
}

TEST_CASE("server: refuses inconsistent TLS options and a busy port", "[server][options]") {
  TempDir dir;
  ServerOptions o;
  o.db_path = dir.File("tw.db");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.tls_cert_file = dir.File("missing.pem");
  CHECK(Server::Start(o).status().code() == absl::StatusCode::kInvalidArgument);
  o.tls_cert_file.clear();
  o.tokens_file = dir.File("missing.json");
  CHECK(Server::Start(o).status().code() == absl::StatusCode::kNotFound);
  o.tokens_file.clear();
  auto first = Server::Start(o);
  REQUIRE(first.ok());
  ServerOptions busy = o;
  busy.db_path = dir.File("tw2.db");
  busy.listen = "127.0.0.1:" + std::to_string((*first)->port());
  CHECK(Server::Start(busy).status().code() == absl::StatusCode::kUnavailable);
  CHECK(IsLoopback("127.0.0.1:7070"));
  CHECK(IsLoopback("[::1]:7070"));
  CHECK_FALSE(IsLoopback("0.0.0.0:7070"));
}

TEST_CASE("server: malformed and oversized messages end only their own stream",
          "[server][ingest][errors]") {
  TempDir dir;
  ServerOptions o;
  o.max_message_bytes = 64 * 1024;
  Running r = StartServer(dir.File("tw.db"), core::SystemClock(), o);
  TestAgent good(r.channel);
  good.Send(Hello("run-good", 0, 1));
  for (int64_t s = 0; s < 50; ++s) good.Send(Step("run-good", 0, 1, s, Loss(s), Grad(s)));
  REQUIRE(good.WaitDurable(0, 49));
  {
    TestAgent bad(r.channel);
    bad.Send(Hello("run-x", 0, 1));
    bad.Send(Step("", 0, 1, 0, 2.5, 1.0));
    const grpc::Status s = bad.Close();
    CHECK(s.error_code() == grpc::INVALID_ARGUMENT);
    CHECK(s.error_message() ==
          "run_id is empty: a run id is 1 to 128 characters of [A-Za-z0-9._:-]");
  }
  {
    TestAgent bad(r.channel);
    bad.Send(Hello("run-x", 0, 2));
    v1::AgentMessage m = Step("run-x", 5, 2, 0, 2.5, 1.0);
    bad.Send(m);
    const grpc::Status s = bad.Close();
    CHECK(s.error_code() == grpc::INVALID_ARGUMENT);
    CHECK(s.error_message() == "step_report: rank 5 is outside world_size 2");
  }
  {
    TestAgent big(r.channel);
    big.Send(Hello("run-big", 0, 1));
    v1::AgentMessage m = Step("run-big", 0, 1, 0, 2.5, 1.0);
    for (int i = 0; i < 20000; ++i) m.mutable_step_report()->add_shard_ids(1ull << 40);
    big.Send(m);
    const grpc::Status s = big.Close();
    CHECK(s.error_code() == grpc::RESOURCE_EXHAUSTED);
  }
  // The good stream went on.
  for (int64_t s = 50; s < 100; ++s) good.Send(Step("run-good", 0, 1, s, Loss(s), Grad(s)));
  REQUIRE(good.WaitDurable(0, 99));
  CHECK(good.Close().ok());
  auto n = r.server->store()->CountSteps("run-good");
  REQUIRE(n.ok());
  CHECK(*n == 100);
  CHECK(r.server->store()->CountSteps("run-big").value() == 0);
}

TEST_CASE("server: /metrics passes promtool check metrics on a live scrape",
          "[server][metrics]") {
  TempDir dir;
  Running r = StartServer(dir.File("tw.db"));
  TestAgent a(r.channel);
  a.Send(Hello("run-m", 0, 1));
  for (int64_t s = 0; s < 1500; ++s) {
    a.Send(Step("run-m", 0, 1, s, s == 1400 ? 3.5 : Loss(s), s == 1400 ? 9.0 : Grad(s)));
  }
  REQUIRE(a.WaitDurable(0, 1499));
  const std::string body = testing::HttpGet(r.server->metrics_port(), "/metrics");
  INFO(body);
  CHECK(body.find("trainwatch_loss{run=\"run-m\"}") != std::string::npos);
  CHECK(body.find("trainwatch_skipped_steps_total{run=\"run-m\"} 1") != std::string::npos);
  CHECK(body.find("trainwatch_incidents_total{run=\"run-m\",tier=\"1\"} 1") != std::string::npos);
  CHECK(body.find("trainwatch_agents_connected{run=\"run-m\"} 1") != std::string::npos);
  CHECK(body.find("trainwatch_ingest_records_total 1500") != std::string::npos);
  CHECK(body.find("trainwatch_store_wal_checkpoints_total ") != std::string::npos);
  CHECK(body.find("trainwatch_store_writer_checkpoints_total 0") != std::string::npos);
  std::string out;
  const int rc = testing::RunCommand("promtool check metrics", body, &out);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.empty());
  CHECK(a.Close().ok());
}

TEST_CASE("server: fp16 loss-scale overflows are counted and exported - never a halt",
          "[server][metrics][fp16]") {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  // An fp16 step: the scaler halves the scale on each overflow, whose
  // gradients hold inf.
  auto fp16 = [](int64_t s, bool overflow, double scale) {
    v1::AgentMessage m = Step("run-h", 0, 1, s, Loss(s), overflow ? HUGE_VAL : Grad(s));
    v1::StepReport* r = m.mutable_step_report();
    if (overflow) r->mutable_metrics()->set_nan_frac(0.5);
    r->set_loss_scale(scale);
    r->set_loss_scale_overflow(overflow);
    return m;
  };
  auto expect = [](const std::string& body, const std::string& line) {
    INFO(body);
    CHECK(body.find(line) != std::string::npos);
  };
  {
    Running r = StartServer(db);
    TestAgent a(r.channel);
    a.Send(Hello("run-h", 0, 1));
    a.Send(Hello("run-bf16", 0, 1));
    double scale = 65536.0;
    for (int64_t s = 0; s < 300; ++s) {
      const bool overflow = s == 100 || s == 200 || s == 201;
      if (overflow) scale /= 2;
      a.Send(fp16(s, overflow, scale));
      a.Send(Step("run-bf16", 0, 1, s, Loss(s), Grad(s)));
    }
    REQUIRE(a.WaitDurable(0, 299));
    const std::string body = testing::HttpGet(r.server->metrics_port(), "/metrics");
    expect(body, "trainwatch_loss_scale{run=\"run-h\"} 8192");
    expect(body, "trainwatch_loss_scale_overflows_total{run=\"run-h\"} 3");
    expect(body, "trainwatch_incidents_total{run=\"run-h\",tier=\"3\"} 0");
    expect(body, "trainwatch_incidents_total{run=\"run-h\",tier=\"0\"} 2");
    // A bf16 run has no loss-scale series.
    CHECK(body.find("trainwatch_loss_scale{run=\"run-bf16\"}") == std::string::npos);
    CHECK(body.find("trainwatch_loss_scale_overflows_total{run=\"run-bf16\"}") ==
          std::string::npos);
    REQUIRE(a.Close().ok());
    r.server->Shutdown();
  }
  // The store kept the scale and the flags: a restarted server counts the
  // same, and its rebuilt engine still takes an overflow for one.
  Running r = StartServer(db);
  TestAgent a(r.channel);
  a.Send(Hello("run-h", 0, 1));
  a.Send(fp16(300, true, 4096.0));
  REQUIRE(a.WaitDurable(0, 300));
  const std::string body = testing::HttpGet(r.server->metrics_port(), "/metrics");
  expect(body, "trainwatch_loss_scale{run=\"run-h\"} 4096");
  expect(body, "trainwatch_loss_scale_overflows_total{run=\"run-h\"} 4");
  expect(body, "trainwatch_incidents_total{run=\"run-h\",tier=\"3\"} 0");
  CHECK(a.Close().ok());
}

}  // namespace
}  // namespace trainwatch::server
