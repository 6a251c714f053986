// Rule firings and recommended actions through their trainwatch.v1 form.

#include <catch2/catch.hpp>

#include "trainwatch/wire/event.h"

namespace trainwatch::wire {
namespace {

namespace v1 = trainwatch::v1;
using Kind = core::RecommendedAction::Kind;

TEST_CASE("wire event: a rule firing keeps kind - tier - step and reason", "[wire]") {
  core::Event e;
  e.kind = core::EventKind::kLogZDrift;
  e.tier = 2;
  e.step = 1234;
  e.reason = "log_z drift 0.8 nats";
  v1::RuleFiring f;
  EventToProto(e, &f);
  CHECK(f.rule() == v1::RULE_LOG_Z_DRIFT);
  CHECK(f.tier() == v1::TIER_LOGIT_DRIFT);
  const core::Event back = EventFromProto(f);
  CHECK(back.kind == e.kind);
  CHECK(back.tier == 2);
  CHECK(back.step == 1234);
  CHECK(back.reason == e.reason);
}

TEST_CASE("wire event: actions round-trip with their payloads", "[wire]") {
  core::RecommendedAction q;
  q.kind = Kind::kQuarantineShards;
  q.shard_first = (uint64_t{1} << 60) + 1;  // beyond a double's 2^53
  q.shard_last = (uint64_t{1} << 60) + 3;
  q.text = "quarantine";
  core::RecommendedAction z;
  z.kind = Kind::kSetZLossAlpha;
  z.z_loss_alpha = 1e-4;
  for (const core::RecommendedAction& a : {q, z}) {
    v1::RecommendedAction p;
    ActionToProto(a, &p);
    const std::optional<core::RecommendedAction> back = ActionFromProto(p);
    REQUIRE(back.has_value());
    CHECK(back->kind == a.kind);
    CHECK(back->text == a.text);
    CHECK(back->shard_first == a.shard_first);
    CHECK(back->shard_last == a.shard_last);
    CHECK(back->z_loss_alpha == a.z_loss_alpha);
  }
  // Names ride in the set beside the range; a names-only action has no range.
  core::RecommendedAction named;
  named.kind = Kind::kQuarantineShards;
  named.has_shard_range = false;
  named.shard_names = {"shard-00500:0", "a,b"};
  v1::RecommendedAction np;
  ActionToProto(named, &np);
  CHECK(np.shards().ranges_size() == 0);
  CHECK(np.shards().names_size() == 2);
  std::optional<core::RecommendedAction> nb = ActionFromProto(np);
  REQUIRE(nb.has_value());
  CHECK_FALSE(nb->has_shard_range);
  CHECK(nb->shard_names == named.shard_names);
  q.shard_names = {"x"};
  v1::RecommendedAction qp;
  ActionToProto(q, &qp);
  nb = ActionFromProto(qp);
  REQUIRE(nb.has_value());
  CHECK(nb->has_shard_range);
  CHECK(nb->shard_last == q.shard_last);
  CHECK(nb->shard_names == q.shard_names);
  v1::RecommendedAction p;
  ActionToProto(z, &p);
  CHECK_FALSE(p.has_shards());  // no payload but the kind's own
  p.set_kind(v1::ACTION_KIND_SKIP_STEPS);
  CHECK_FALSE(ActionFromProto(p).has_value());
}

}  // namespace
}  // namespace trainwatch::wire
