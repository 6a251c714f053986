// Core enums and their trainwatch.v1 counterparts. The wire enums are open
// (a reader must accept numbers it does not know), so every *FromProto says
// what an unknown number becomes.

#ifndef TRAINWATCH_WIRE_ENUMS_H_
#define TRAINWATCH_WIRE_ENUMS_H_

#include <optional>

#include "trainwatch/core/event.h"
#include "trainwatch/v1/common.pb.h"

namespace trainwatch::wire {

// Core tiers are 0..3, 0 being early warnings and spike notices.
trainwatch::v1::Tier TierToProto(int tier);
// -1 for TIER_UNSPECIFIED and unknown numbers (the filters' "every tier").
int TierFromProto(trainwatch::v1::Tier tier);

trainwatch::v1::Rule RuleToProto(core::EventKind kind);
// Several kinds share a rule (a confirmed data anomaly is still a grad-norm
// spike); their rule reads back as the kind that first raises it. Empty for
// rules no core kind raises and for unknown numbers.
std::optional<core::EventKind> RuleFromProto(trainwatch::v1::Rule rule);

trainwatch::v1::Verdict DecisionToProto(core::Decision d);
// Unspecified and unknown verdicts read as kContinue: the trainer goes on.
core::Decision DecisionFromProto(trainwatch::v1::Verdict v);

trainwatch::v1::ActionKind ActionKindToProto(core::RecommendedAction::Kind k);
// Empty for the kinds only the server recommends (rollback, skip steps...).
std::optional<core::RecommendedAction::Kind> ActionKindFromProto(trainwatch::v1::ActionKind k);

}  // namespace trainwatch::wire

#endif  // TRAINWATCH_WIRE_ENUMS_H_
