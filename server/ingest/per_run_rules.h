// The rules each run is judged by, and the agents' own decisions against
// the server's engine. A run is judged by one RuleConfig, recorded with the
// run (runs.rules_json and rules_source, migration 9) so that a restart
// rebuilds it by the same rules. Which rules win follows the precedence
// stated once, at AgentConfig::rules (trainwatch/agent/agent.h): here, the
// job's own rules arrive in a Hello (rules_json, "agent") and count only
// before the run's first evaluated step, since the run's history was judged
// by the rules it has; otherwise the run is given the first --run_rules
// pattern matching its id, else --rules, else the defaults, when created.
// Every answer to a Hello names them (DurabilityAck.rules_json).
//
// A skip or a halt in an agent's global record is stored as a decision
// (DECISION_KIND_AGENT_*) with its rule and, when StepReport.rules_hash
// names rules the server knows, those rules; a step where the agent's
// verdict and the server's differ is a divergence, logged and counted.
//
// Writer thread only.

#ifndef TRAINWATCH_SERVER_INGEST_PER_RUN_RULES_H_
#define TRAINWATCH_SERVER_INGEST_PER_RUN_RULES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "ingest/batch.h"
#include "ingest/ingest_options.h"
#include "ingest/run_state.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::server {

class PerRunRules {
 public:
  // REQUIRES: both pointers outlive this.
  PerRunRules(const IngestOptions* options, Batch* batch) : options_(options), batch_(batch) {}

  // A new run's rules, by the options.
  void Assign(RunState& run) const;
  // A run read from the store: its recorded rules (a damaged column is an
  // error), or, for a run from before migration 9, Assign.
  absl::Status Restore(RunState& run) const;
  // A Hello's rules, when it announces any.
  void AdoptHello(RunState& run, const trainwatch::v1::Hello& h);
  // The agent's verdict in an evaluated global record against the
  // server's (run.out): stored as a decision when a skip or a halt, counted
  // and logged when they differ.
  void RecordAgentVerdict(RunState& run, const trainwatch::v1::StepReport& r, int64_t now);

 private:
  const IngestOptions* options_;
  Batch* batch_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_PER_RUN_RULES_H_
