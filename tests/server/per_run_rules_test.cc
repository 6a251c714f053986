// One set of rules per run, known to both sides: an agent's own rules judge
// its run at the server too, an agent without rules takes the run's from
// the server (every rank switching at the same step), what the agent decided
// is on record as a decision, a divergence is counted, and a restart of
// trainwatchd keeps the run's rules. Real server, real C++ agents; at the
// end, the component alone (per_run_rules.h), where a new per-run policy
// gets its cases.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "admission/agent_message_checks.h"
#include "daemon/server.h"
#include "server_fixture.h"
#include "test_util.h"
#include "ingest/per_run_rules.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/core/config.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using agent::Decision;
using testing::Hello;
using testing::HelloAnswer;
using testing::Running;
using testing::StartServer;
using testing::TempDir;
using testing::TestAgent;

// Lowered from the default 1,000: a skip at step 80 only by these rules.
core::RuleConfig Lowered() {
  core::RuleConfig r;
  r.warmup_steps = 50;
  return r;
}

constexpr int64_t kBadStep = 80;

// A steady step, or a bad batch: tier 1 skips it once warm.
agent::StepInput Input(int64_t step, std::mt19937_64& rng, bool bad) {
  std::normal_distribution<double> n(0.0, 1.0);
  agent::StepInput in;
  in.step = step;
  in.loss = 2.5 + 0.02 * n(rng);
  in.grad_sum_squares = std::exp(0.1 * n(rng));
  in.grad_elements = 1000;
  if (bad) {
    in.loss = 12.0;
    in.grad_sum_squares = 160.0;
  }
  return in;
}

RunView ViewOf(Running& tw, const std::string& run) {
  tw.server->ingestor()->Flush();
  for (const RunView& s : tw.server->ingestor()->views().All()) {
    if (s.row.run_id == run) return s;
  }
  FAIL("no run " << run);
  return {};
}

std::vector<v1::Decision> DecisionsOfIncident(Running& tw, int64_t incident) {
  tw.server->ingestor()->Flush();
  absl::StatusOr<std::vector<DecisionRow>> rows = tw.server->store()->DecisionsOfIncident(incident);
  REQUIRE(rows.ok());
  std::vector<v1::Decision> out;
  for (const DecisionRow& r : *rows) {
    REQUIRE(out.emplace_back().ParseFromString(r.payload));
  }
  return out;
}

TEST_CASE("rules: an agent's own rules judge its run at a server on defaults - and survive a "
          "restart",
          "[server][rules]") {
  TempDir dir;
  const std::string db = dir.File("tw.db");
  Running tw = StartServer(db);
  const std::string run = "run-own-rules";
  agent::AgentConfig cfg;
  cfg.server_address = tw.address();
  cfg.run_id = run;
  cfg.rules = Lowered();
  auto a = agent::Agent::Create(cfg, std::make_unique<agent::SingleProcessReducer>());
  REQUIRE(a.ok());
  std::mt19937_64 rng(7);
  for (int64_t s = 0; s <= kBadStep + 5; ++s) {
    absl::StatusOr<agent::Verdict> v = (*a)->Step(Input(s, rng, s == kBadStep));
    REQUIRE(v.ok());
    CHECK(v->decision == (s == kBadStep ? Decision::kSkipUpdate : Decision::kContinue));
  }
  (*a)->Close(5000);
  CHECK((*a)->Stats().records_acked == kBadStep + 6);
  CHECK((*a)->Stats().server_rules_from_step == -1);  // its own rules, never the server's

  const RunView view = ViewOf(tw, run);
  CHECK(view.row.rules_source == "agent");
  CHECK(view.row.rules_json == core::RuleConfigToJson(Lowered()));
  CHECK(view.skipped_total == 1);  // the server judged by the agent's rules
  CHECK(view.incidents_total[1] == 1);
  CHECK(view.agent_decisions_total == 1);
  CHECK(view.decision_divergences_total == 0);
  // The agent's decision is on record with the incident the server opened.
  IncidentFilter f;
  f.run_id = run;
  absl::StatusOr<std::vector<IncidentRow>> incidents = tw.server->store()->ListIncidents(f);
  REQUIRE(incidents.ok());
  REQUIRE(incidents->size() == 1);
  CHECK((*incidents)[0].detection_step == kBadStep);
  // Beside the skip the server's own engine decided by the same rules (its
  // rule as the actor), what the agent reported it did.
  const std::vector<v1::Decision> decisions = DecisionsOfIncident(tw, (*incidents)[0].id);
  REQUIRE(decisions.size() == 2);
  CHECK(decisions[0].actor().kind() == v1::ACTOR_KIND_SERVER);
  const v1::Decision& d = decisions[1];
  CHECK(d.kind() == v1::DECISION_KIND_AGENT_SKIP);
  CHECK(d.actor().kind() == v1::ACTOR_KIND_AGENT);
  CHECK(d.step() == kBadStep);
  CHECK(d.agent_rule().rule() != v1::RULE_UNSPECIFIED);
  CHECK(d.agent_rule().tier() == v1::TIER_DATA_ANOMALY);
  CHECK_FALSE(d.agent_rule().explanation().empty());
  CHECK(d.server_verdict() == v1::VERDICT_SKIP);
  // The thresholds the agent ran: the run's rules, written out.
  CHECK(d.comment().find("the run's rules (agent)") != std::string::npos);
  CHECK(d.comment().find("\"warmup_steps\": 50") != std::string::npos);
  // Exported.
  const std::string metrics = testing::HttpGet(tw.server->metrics_port(), "/metrics");
  CHECK(metrics.find("trainwatch_skipped_steps_total{run=\"" + run + "\"} 1") != std::string::npos);
  CHECK(metrics.find("trainwatch_agent_decisions_total{run=\"" + run + "\"} 1") !=
        std::string::npos);

  // A restarted trainwatchd on its defaults rebuilds the run by the agent's
  // rules and hands them to an agent that has none.
  tw.server.reset();
  tw = StartServer(db);
  const RunView again = ViewOf(tw, run);
  CHECK(again.row.rules_source == "agent");
  CHECK(again.skipped_total == 1);
  const v1::DurabilityAck answer = HelloAnswer(tw.channel, run);
  CHECK(answer.rules_source() == "agent");
  absl::StatusOr<core::RuleConfig> told = core::ParseRuleConfigJson(answer.rules_json(), "ack");
  REQUIRE(told.ok());
  CHECK(told->warmup_steps == 50);
}

TEST_CASE("rules: agents without rules switch to the server's at the same step on every rank",
          "[server][rules]") {
  TempDir dir;
  ServerOptions o;
  o.ingest.rules = Lowered();
  o.ingest.rules_source = "server --rules";
  Running tw = StartServer(dir.File("tw.db"), core::SystemClock(), o);
  const std::string run = "run-server-rules";
  constexpr int kRanks = 3;
  agent::InProcessGroup group(kRanks);
  std::vector<std::vector<Decision>> decided(kRanks);
  std::vector<int64_t> switched(kRanks, -2);
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      agent::AgentConfig cfg;
      cfg.server_address = tw.address();
      cfg.run_id = run;
      auto a = agent::Agent::Create(cfg, group.ReducerFor(r));
      if (!a.ok()) {
        ++failed;
        return;
      }
      std::mt19937_64 rng(100 + r);  // each rank its own numbers
      // Ranks 0 and 1 hold the server's rules from step 0; rank 2 starts
      // without waiting, and holds them by step 30 at the latest. The step
      // itself never waits: whatever rank 2 holds, every rank must switch
      // at the one step where all hold them.
      if (r < 2 && !(*a)->WaitForServer(10'000)) ++failed;
      for (int64_t s = 0; s <= kBadStep + 5; ++s) {
        if (r == 2 && s == 30 && !(*a)->WaitForServer(10'000)) ++failed;
        // Rank 1's batch is bad; every rank must skip it.
        absl::StatusOr<agent::Verdict> v = (*a)->Step(Input(s, rng, s == kBadStep && r == 1));
        if (!v.ok()) ++failed;
        decided[r].push_back(v.ok() ? v->decision : Decision::kHalt);
      }
      switched[r] = (*a)->Stats().server_rules_from_step;
      (*a)->Close(5000);
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(failed == 0);
  INFO("switched at step " << switched[0]);
  CHECK(switched[0] >= 0);
  CHECK(switched[0] <= 31);
  for (int r = 1; r < kRanks; ++r) {
    CHECK(switched[r] == switched[0]);
    CHECK(decided[r] == decided[0]);
  }
  // By the server's rules the agent skips locally where the server decides.
  CHECK(decided[0][kBadStep] == Decision::kSkipUpdate);
  const RunView view = ViewOf(tw, run);
  CHECK(view.row.rules_source == "server --rules");
  CHECK(view.skipped_total == 1);
  CHECK(view.agent_decisions_total == 1);
  CHECK(view.decision_divergences_total == 0);
}

TEST_CASE("rules: an agent that does not announce its rules diverges - counted and on record",
          "[server][rules]") {
  TempDir dir;
  Running tw = StartServer(dir.File("tw.db"));
  const std::string run = "run-old-agent";
  // An older agent with lowered thresholds of its own: no rules in its
  // hello, a skip in its record where the server's defaults continue.
  TestAgent a(tw.channel);
  REQUIRE(a.Send(Hello(run, 0, 1)));
  for (int64_t s = 0; s <= 10; ++s) {
    v1::AgentMessage m = testing::Step(run, 0, 1, s, 2.5, 1.0);
    m.mutable_step_report()->set_verdict(s == 7 ? v1::VERDICT_SKIP : v1::VERDICT_CONTINUE);
    if (s == 7) {
      m.mutable_step_report()->set_skip_rule(v1::RULE_LOSS_EMA_RATIO_SKIP);
      m.mutable_step_report()->set_skip_tier(v1::TIER_DATA_ANOMALY);
      m.mutable_step_report()->set_update_skipped(true);
    }
    REQUIRE(a.Send(m));
  }
  REQUIRE(a.WaitDurable(0, 10));
  a.Close();
  const RunView view = ViewOf(tw, run);
  CHECK(view.row.rules_source == "server defaults");
  CHECK(view.skipped_total == 0);
  CHECK(view.decision_divergences_total == 1);
  CHECK(view.agent_decisions_total == 1);
  const std::vector<v1::Decision> decisions = DecisionsOfIncident(tw, 0);  // no incident
  REQUIRE(decisions.size() == 1);
  CHECK(decisions[0].kind() == v1::DECISION_KIND_AGENT_SKIP);
  CHECK(decisions[0].step() == 7);
  CHECK(decisions[0].agent_rule().rule() == v1::RULE_LOSS_EMA_RATIO_SKIP);
  CHECK(decisions[0].server_verdict() == v1::VERDICT_CONTINUE);
  CHECK(decisions[0].comment().find("not announced") != std::string::npos);
  const std::string metrics = testing::HttpGet(tw.server->metrics_port(), "/metrics");
  CHECK(metrics.find("trainwatch_decision_divergences_total{run=\"" + run + "\"} 1") !=
        std::string::npos);
}

TEST_CASE("rules: --run_rules gives matching runs their rules - bad files named", "[server][rules]") {
  absl::StatusOr<std::vector<RunRules>> parsed = ParseRunRulesJson(
      R"({"exp-42": {"warmup_steps": 50}, "exp-*": {"warmup_steps": 60, "bounds": {}}})",
      "run_rules.json");
  REQUIRE(parsed.ok());
  REQUIRE(parsed->size() == 2);
  TempDir dir;
  ServerOptions o;
  o.ingest.run_rules = *parsed;
  Running tw = StartServer(dir.File("tw.db"), core::SystemClock(), o);
  const v1::DurabilityAck exact = HelloAnswer(tw.channel, "exp-42");
  CHECK(exact.rules_source() == "server --run_rules exp-42");
  CHECK(core::ParseRuleConfigJson(exact.rules_json(), "ack")->warmup_steps == 50);
  const v1::DurabilityAck glob = HelloAnswer(tw.channel, "exp-7");
  CHECK(glob.rules_source() == "server --run_rules exp-*");
  CHECK(core::ParseRuleConfigJson(glob.rules_json(), "ack")->warmup_steps == 60);
  const v1::DurabilityAck other = HelloAnswer(tw.channel, "prod-1");
  CHECK(other.rules_source() == "server defaults");

  for (const auto& [json, message] : std::vector<std::pair<std::string, std::string>>{
           {"[]", "must be a JSON object"},
           {R"({"exp-*": 3})", "pattern \"exp-*\": its rules must be a JSON object"},
           {R"({"exp-*": {"warmup_stepz": 1}})", "unknown setting \"warmup_stepz\""},
           {R"({"exp-*": {"warmup_steps": "x"}})", "warmup_steps must be a number"}}) {
    absl::StatusOr<std::vector<RunRules>> bad = ParseRunRulesJson(json, "run_rules.json");
    INFO(json);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(bad.status().message().find(message) != absl::string_view::npos);
    CHECK(bad.status().message().find("run_rules.json") != absl::string_view::npos);
  }
}

TEST_CASE("rules: a hello's rules are checked - too long or invalid is refused naming the field",
          "[server][rules]") {
  AgentStreamLimits limits;
  v1::AgentMessage m = Hello("run-x", 0, 1);
  m.mutable_hello()->set_rules_json(core::RuleConfigToJson(Lowered()));
  CHECK(CheckAgentMessage(m, {}, limits).ok());
  m.mutable_hello()->set_rules_json(R"({"warmup_steps": -1})");
  absl::Status invalid = CheckAgentMessage(m, {}, limits);
  CHECK(invalid.code() == absl::StatusCode::kInvalidArgument);
  CHECK(invalid.message().find("hello.rules_json") != absl::string_view::npos);
  m.mutable_hello()->set_rules_json(std::string(limits.max_hello_rules_bytes + 1, ' '));
  absl::Status too_long = CheckAgentMessage(m, {}, limits);
  CHECK(too_long.code() == absl::StatusCode::kInvalidArgument);
  CHECK(too_long.message().find("hello: rules_json is") != absl::string_view::npos);
}

TEST_CASE("hello: what trainwatch run found is bounded - longer is refused naming the field",
          "[server][rules]") {
  AgentStreamLimits limits;
  v1::AgentMessage m = Hello("run-x", 0, 1);
  m.mutable_hello()->set_attachment(std::string(kMaxHelloAttachmentBytes, 'a'));
  CHECK(CheckAgentMessage(m, {}, limits).ok());
  m.mutable_hello()->set_attachment(std::string(kMaxHelloAttachmentBytes + 1, 'a'));
  absl::Status too_long = CheckAgentMessage(m, {}, limits);
  CHECK(too_long.code() == absl::StatusCode::kInvalidArgument);
  CHECK(too_long.message().find("hello: attachment is 4097 bytes long: at most 4096") !=
        absl::string_view::npos);
}

RunState NewRun(const std::string& id) {
  RunRow row;
  row.run_id = id;
  return RunState(row);
}

TEST_CASE("per-run rules: the first matching --run_rules pattern - else --rules",
          "[server][per_run_rules]") {
  IngestOptions options;
  options.rules.spike_delta_nats = 0.5;
  options.rules_source = "server --rules";
  core::RuleConfig big, bigger;
  big.spike_delta_nats = 0.2;
  bigger.spike_delta_nats = 0.3;
  options.run_rules = {{"big-*", big}, {"big-9*", bigger}};
  Batch batch;
  PerRunRules rules(&options, &batch);

  RunState a = NewRun("big-90");
  rules.Assign(a);
  CHECK(a.rules.spike_delta_nats == 0.2);  // the first match wins
  CHECK(a.row.rules_source == "server --run_rules big-*");
  RunState b = NewRun("small");
  rules.Assign(b);
  CHECK(b.rules.spike_delta_nats == 0.5);
  CHECK(b.row.rules_source == "server --rules");

  // What was recorded is what a restart restores.
  RunState restored(a.row);
  REQUIRE(rules.Restore(restored).ok());
  CHECK(restored.rules.spike_delta_nats == 0.2);
  RunState damaged = NewRun("x");
  damaged.row.rules_json = "{not json";
  CHECK_FALSE(rules.Restore(damaged).ok());
}

TEST_CASE("per-run rules: an agent's rules count before the first evaluated step only",
          "[server][per_run_rules]") {
  IngestOptions options;
  Batch batch;
  PerRunRules rules(&options, &batch);
  core::RuleConfig own;
  own.spike_delta_nats = 0.7;
  trainwatch::v1::Hello hello;
  hello.set_rules_json(core::RuleConfigToJson(own));

  RunState fresh = NewRun("f");
  rules.Assign(fresh);
  rules.AdoptHello(fresh, hello);
  CHECK(fresh.rules.spike_delta_nats == 0.7);
  CHECK(fresh.row.rules_source == "agent");
  CHECK(fresh.engine != nullptr);

  RunState judged = NewRun("j");
  rules.Assign(judged);
  judged.row.last_step = 10;  // its history was judged by the rules it has
  rules.AdoptHello(judged, hello);
  CHECK(judged.rules.spike_delta_nats == options.rules.spike_delta_nats);
  CHECK(judged.row.rules_source == "server defaults");
}

}  // namespace
}  // namespace trainwatch::server
