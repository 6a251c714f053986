// The parts of a core::Event the API shows: a rule firing, and the
// recommended actions of its incident.

#ifndef TRAINWATCH_WIRE_EVENT_H_
#define TRAINWATCH_WIRE_EVENT_H_

#include <optional>

#include "trainwatch/core/event.h"
#include "trainwatch/v1/common.pb.h"

namespace trainwatch::wire {

// Rule, tier, detection step and the reason as the explanation.
void EventToProto(const core::Event& e, trainwatch::v1::RuleFiring* f);
// Only the fields EventToProto writes; a rule no core kind raises reads as
// the event's default kind.
core::Event EventFromProto(const trainwatch::v1::RuleFiring& f);

// Kind, description, and the kind's payload (the shard range of a
// quarantine, the coefficient of a z-loss change).
void ActionToProto(const core::RecommendedAction& a, trainwatch::v1::RecommendedAction* out);
// Empty for the kinds only the server recommends (see ActionKindFromProto).
std::optional<core::RecommendedAction> ActionFromProto(const trainwatch::v1::RecommendedAction& a);

}  // namespace trainwatch::wire

#endif  // TRAINWATCH_WIRE_EVENT_H_
