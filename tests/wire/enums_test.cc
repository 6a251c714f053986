// Core enums and times through their trainwatch.v1 form and back.

#include <catch2/catch.hpp>
#include <set>

#include "trainwatch/wire/enums.h"
#include "trainwatch/wire/time.h"

namespace trainwatch::wire {
namespace {

namespace v1 = trainwatch::v1;
using core::EventKind;
using Kind = core::RecommendedAction::Kind;

TEST_CASE("wire enums: every tier round-trips and unknown tiers read as every tier", "[wire]") {
  for (int t = 0; t <= 3; ++t) CHECK(TierFromProto(TierToProto(t)) == t);
  CHECK(TierToProto(0) == v1::TIER_EARLY_WARNING);
  CHECK(TierToProto(3) == v1::TIER_NUMERICAL_FAILURE);
  CHECK(TierFromProto(v1::TIER_UNSPECIFIED) == -1);
  CHECK(TierFromProto(static_cast<v1::Tier>(42)) == -1);
}

TEST_CASE("wire enums: rules round-trip to the kind that first raises them", "[wire]") {
  std::set<int> rules;
  for (int k = 0; k <= static_cast<int>(EventKind::kStraggler); ++k) {
    const auto kind = static_cast<EventKind>(k);
    const v1::Rule rule = RuleToProto(kind);
    CHECK(rule != v1::RULE_UNSPECIFIED);
    rules.insert(rule);
    const std::optional<EventKind> back = RuleFromProto(rule);
    REQUIRE(back.has_value());
    CHECK(RuleToProto(*back) == rule);
  }
  // A confirmed anomaly and a recovery share their episode's opening rule.
  CHECK(rules.size() == 20);
  CHECK(RuleFromProto(v1::RULE_GRAD_NORM_SPIKE) == EventKind::kDataAnomaly);
  CHECK(RuleFromProto(v1::RULE_LOSS_SPIKE) == EventKind::kSpike);
  CHECK_FALSE(RuleFromProto(v1::RULE_TRAINER_DEFINED).has_value());
  CHECK_FALSE(RuleFromProto(static_cast<v1::Rule>(999)).has_value());
}

TEST_CASE("wire enums: decisions round-trip and an unknown verdict continues", "[wire]") {
  for (core::Decision d :
       {core::Decision::kContinue, core::Decision::kSkipUpdate, core::Decision::kHalt}) {
    CHECK(DecisionFromProto(DecisionToProto(d)) == d);
  }
  CHECK(DecisionToProto(core::Decision::kSkipUpdate) == v1::VERDICT_SKIP);
  CHECK(DecisionFromProto(v1::VERDICT_UNSPECIFIED) == core::Decision::kContinue);
  CHECK(DecisionFromProto(static_cast<v1::Verdict>(7)) == core::Decision::kContinue);
}

TEST_CASE("wire enums: recommended action kinds round-trip", "[wire]") {
  for (Kind k : {Kind::kQuarantineShards, Kind::kInspectShards, Kind::kSetZLossAlpha,
                 Kind::kWidenPrecision}) {
    CHECK(ActionKindFromProto(ActionKindToProto(k)) == k);
  }
  CHECK(ActionKindToProto(Kind::kWidenPrecision) == v1::ACTION_KIND_SET_LAYER_PRECISION);
  CHECK_FALSE(ActionKindFromProto(v1::ACTION_KIND_SKIP_STEPS).has_value());
  CHECK_FALSE(ActionKindFromProto(static_cast<v1::ActionKind>(55)).has_value());
}

TEST_CASE("wire time: milliseconds round-trip through a timestamp", "[wire]") {
  for (int64_t ms : {int64_t{0}, int64_t{999}, int64_t{1'700'000'123'456}}) {
    google::protobuf::Timestamp t;
    SetTime(ms, &t);
    CHECK(t.seconds() == ms / 1000);
    CHECK(t.nanos() == (ms % 1000) * 1'000'000);
    CHECK(TimeFromProto(t) == ms);
  }
}

}  // namespace
}  // namespace trainwatch::wire
