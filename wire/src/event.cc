#include "trainwatch/wire/event.h"

#include "trainwatch/wire/enums.h"

namespace trainwatch::wire {

namespace v1 = trainwatch::v1;
using Kind = core::RecommendedAction::Kind;

void EventToProto(const core::Event& e, v1::RuleFiring* f) {
  f->set_rule(RuleToProto(e.kind));
  f->set_tier(TierToProto(e.tier));
  f->set_step(e.step);
  f->set_explanation(e.reason);
}

core::Event EventFromProto(const v1::RuleFiring& f) {
  core::Event e;
  e.kind = RuleFromProto(f.rule()).value_or(e.kind);
  e.tier = TierFromProto(f.tier());
  e.step = f.step();
  e.reason = f.explanation();
  return e;
}

void ActionToProto(const core::RecommendedAction& a, v1::RecommendedAction* out) {
  out->set_kind(ActionKindToProto(a.kind));
  out->set_description(a.text);
  if (a.kind == Kind::kQuarantineShards) {
    v1::ShardSet* set = out->mutable_shards();
    if (a.has_shard_range) {
      v1::ShardRange* r = set->add_ranges();
      r->set_first(a.shard_first);
      r->set_last(a.shard_last);
    }
    for (const std::string& name : a.shard_names) set->add_names(name);
  } else if (a.kind == Kind::kSetZLossAlpha) {
    out->mutable_setting()->set_z_loss_alpha(a.z_loss_alpha);
  }
}

std::optional<core::RecommendedAction> ActionFromProto(const v1::RecommendedAction& in) {
  std::optional<Kind> kind = ActionKindFromProto(in.kind());
  if (!kind) return std::nullopt;
  core::RecommendedAction a;
  a.kind = *kind;
  a.text = in.description();
  if (a.kind == Kind::kQuarantineShards) {
    a.has_shard_range = in.shards().ranges_size() > 0;
    if (a.has_shard_range) {
      a.shard_first = in.shards().ranges(0).first();
      a.shard_last = in.shards().ranges(0).last();
    }
    a.shard_names.assign(in.shards().names().begin(), in.shards().names().end());
  } else if (a.kind == Kind::kSetZLossAlpha) {
    a.z_loss_alpha = in.setting().z_loss_alpha();
  }
  return a;
}

}  // namespace trainwatch::wire
