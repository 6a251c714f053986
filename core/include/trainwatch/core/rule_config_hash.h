// A short fingerprint of a RuleConfig, the same on every machine and build,
// by which the agent's ranks agree on the server's rules in their step
// collective (agent.h) and a step report tells the server which rules the
// agent judged it by (StepReport.rules_hash).

#ifndef TRAINWATCH_CORE_RULE_CONFIG_HASH_H_
#define TRAINWATCH_CORE_RULE_CONFIG_HASH_H_

#include <cstdint>

#include "trainwatch/core/config.h"

namespace trainwatch::core {

// In [1, 2^31], so that a double carries it exactly and 0 can mean none.
// FNV-1a of RuleConfigToJson, not std::hash: std::hash may differ between
// the builds of one job's ranks or of the agent and the server.
inline uint32_t RuleConfigHash(const RuleConfig& rules) {
  uint32_t h = 2166136261u;
  for (const char c : RuleConfigToJson(rules)) {
    h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  }
  return (h & 0x7fffffffu) + 1;
}

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_RULE_CONFIG_HASH_H_
