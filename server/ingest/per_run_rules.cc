// The rules each run is judged by, and the agents' own decisions against the
// server's (per_run_rules.h).

#include "ingest/per_run_rules.h"

#include <fnmatch.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "trainwatch/core/rule_config_hash.h"
#include "trainwatch/wire/enums.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;

namespace {

void SetRules(const core::RuleConfig& rules, std::string source, RunRow* row) {
  row->rules_json = core::RuleConfigToJson(rules);
  row->rules_source = std::move(source);
}

}  // namespace

void PerRunRules::Assign(RunState& run) const {
  for (const RunRules& r : options_->run_rules) {
    if (fnmatch(r.pattern.c_str(), run.row.run_id.c_str(), 0) == 0) {
      run.rules = r.rules;
      SetRules(r.rules, absl::StrCat("server --run_rules ", r.pattern), &run.row);
      return;
    }
  }
  run.rules = options_->rules;
  SetRules(options_->rules, options_->rules_source, &run.row);
}

absl::Status PerRunRules::Restore(RunState& run) const {
  if (run.row.rules_json.empty()) {  // stored before migration 7
    Assign(run);
    run.row_dirty = true;
    return absl::OkStatus();
  }
  absl::StatusOr<core::RuleConfig> rules = core::ParseRuleConfigJson(
      run.row.rules_json, absl::StrCat("the stored rules of run ", run.row.run_id));
  if (!rules.ok()) return rules.status();
  run.rules = *std::move(rules);
  return absl::OkStatus();
}

void PerRunRules::AdoptHello(RunState& run, const v1::Hello& h) {
  if (h.rules_json().empty()) return;
  // Checked by CheckAgentMessage before the stream handed it over.
  absl::StatusOr<core::RuleConfig> rules = core::ParseRuleConfigJson(h.rules_json(), "hello");
  if (!rules.ok()) return;
  if (core::RuleConfigToJson(*rules) == run.row.rules_json) return;  // the run's already
  // Before the run's first evaluated step nothing was judged by the rules
  // the run has: the agent's take over. After it, the run's history was
  // judged by them, and switching would make the stored verdicts disagree
  // with a rebuild.
  const bool fresh = run.row.last_step < 0 && run.pending.empty() && run.row.attempt == 0;
  if (!fresh || run.row.rules_source == "agent") {
    LOG(WARNING) << "run " << run.row.run_id << ": rank " << h.rank()
                 << " announces rules other than the run's (" << run.row.rules_source
                 << "); the run keeps its rules, and the agent's decisions that differ are "
                    "counted as divergences";
    return;
  }
  run.rules = *std::move(rules);
  SetRules(run.rules, "agent", &run.row);
  run.engine = std::make_unique<core::RuleEngine>(run.rules);
  run.row_dirty = true;
  LOG(INFO) << "run " << run.row.run_id << ": judged by the rules its agent announced";
}

void PerRunRules::RecordAgentVerdict(RunState& run, const v1::StepReport& r, int64_t now) {
  const v1::Verdict agent = r.verdict();
  const v1::Verdict server = wire::DecisionToProto(run.out.verdict.decision);
  // VERDICT_UNSPECIFIED: a trainer's own record without the agent's
  // verdict; nothing to compare.
  if (agent == v1::VERDICT_UNSPECIFIED) return;
  if (agent != server) {
    ++run.decision_divergences_total;
    LOG(WARNING) << "run " << run.row.run_id << " step " << r.step() << ": the agent decided "
                 << v1::Verdict_Name(agent) << ", the server's engine "
                 << v1::Verdict_Name(server) << " by the run's rules (" << run.row.rules_source
                 << ")";
  }
  if (agent != v1::VERDICT_SKIP && agent != v1::VERDICT_HALT) return;
  // An observed run's agent acted on nothing: its verdicts are the
  // recommendations the incident tracker records, not decisions.
  if (run.row.observed) return;
  ++run.agent_decisions_total;
  // The thresholds the agent ran, where its hash names rules the server
  // knows: the run's, or the defaults an agent judges by until it switches.
  std::string agent_rules;
  if (r.rules_hash() != 0 && r.rules_hash() == core::RuleConfigHash(run.rules)) {
    agent_rules = absl::StrCat("the run's rules (", run.row.rules_source, "): ",
                               run.row.rules_json);
  } else if (r.rules_hash() != 0 && r.rules_hash() == core::RuleConfigHash(core::RuleConfig())) {
    agent_rules = absl::StrCat("the default rules: ", core::RuleConfigToJson(core::RuleConfig()));
  } else {
    agent_rules = "rules the server does not know (not announced)";
  }
  // The server's incident detected at this step, when its engine saw one:
  // the agent's decision is then listed with the incident's decisions.
  int64_t incident = 0;
  for (const auto& [episode, inc] : run.incidents.open()) {
    if (inc.detection_step == r.step()) incident = inc.id;
  }
  const int64_t did = batch_->ids.next_decision++;
  v1::Decision d;
  d.set_decision_id(absl::StrCat("D-", did));
  if (incident != 0) d.set_incident_id(absl::StrCat("I-", incident));
  d.set_run_id(run.row.run_id);
  d.set_kind(agent == v1::VERDICT_SKIP ? v1::DECISION_KIND_AGENT_SKIP
                                       : v1::DECISION_KIND_AGENT_HALT);
  d.mutable_actor()->set_kind(v1::ACTOR_KIND_AGENT);
  d.mutable_actor()->set_id(absl::StrCat("agent:", run.row.run_id, "/", r.rank()));
  d.mutable_actor()->set_via("step_report");
  d.mutable_decided_at()->set_seconds(now / 1000);
  d.set_step(r.step());
  *d.mutable_agent_rule() = r.verdict_reason();
  if (!r.has_verdict_reason()) {
    d.mutable_agent_rule()->set_rule(r.skip_rule());
    d.mutable_agent_rule()->set_tier(r.skip_tier());
  }
  d.set_server_verdict(server);
  d.set_comment(absl::StrCat("step ", r.step(), ": the agent decided ", v1::Verdict_Name(agent),
                             " (", v1::Rule_Name(d.agent_rule().rule()), ": ",
                             r.verdict_reason().explanation(), ") by ", agent_rules,
                             "; the server's engine: ", v1::Verdict_Name(server)));
  batch_->rows.decisions.push_back({did, incident, run.row.run_id, d.actor().id(),
                              agent == v1::VERDICT_SKIP ? "agent_skip" : "agent_halt",
                              d.comment(), d.SerializeAsString(), "", now});
}

}  // namespace trainwatch::server
