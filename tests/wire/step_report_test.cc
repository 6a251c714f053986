// Step records through a trainwatch.v1.StepReport and back: presence, NaN,
// exact 64-bit shard ids, counts, tensors and the verdict.

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "trainwatch/wire/step_report.h"

namespace trainwatch::wire {
namespace {

namespace v1 = trainwatch::v1;
using core::Signal;

ReportedStep RoundTrip(const ReportedStep& s, v1::StepReport* proto) {
  StepToProto(s, proto);
  // Through bytes, as on the wire.
  const std::string bytes = proto->SerializeAsString();
  REQUIRE(proto->ParseFromString(bytes));
  return StepFromProto(*proto);
}

TEST_CASE("wire step: every signal and count round-trips", "[wire]") {
  const std::vector<uint64_t> shards = {(uint64_t{1} << 53) + 1, ~uint64_t{0}, 7};
  const std::vector<core::TensorStat> tensors = {{"layer.0.w", 4.5, 2, 100}};
  ReportedStep s;
  s.step = 41;
  s.Set(Signal::kLoss, 2.5).Set(Signal::kGradNorm, 1.25).Set(Signal::kLogZ, 8.0);
  s.Set(Signal::kNanFrac, 0.02).Set(Signal::kLearningRate, 3e-4).Set(Signal::kZLossAlpha, 1e-4);
  s.Set(Signal::kActivationMax, 900.0).Set(Signal::kAttentionLogitP99, 31.0);
  s.loss_ema_ratio = 1.5;
  s.nonfinite = 2;
  s.elements = 100;
  s.shards = shards;
  s.tensors = tensors;
  s.update_skipped = true;
  v1::StepReport proto;
  const ReportedStep back = RoundTrip(s, &proto);
  CHECK(back.step == 41);
  CHECK(back.present() == s.present());
  for (int i = 0; i < core::kNumSignals; ++i) {
    const auto sig = static_cast<Signal>(i);
    CHECK(back.Get(sig) == s.Get(sig));
  }
  CHECK(back.loss_ema_ratio == 1.5);
  CHECK(back.nonfinite == 2);
  CHECK(back.elements == 100);
  // Exact: ids above 2^53 would lose their low bits through a double.
  CHECK(std::vector<uint64_t>(back.shards.begin(), back.shards.end()) == shards);
  REQUIRE(back.tensors.size() == 1);
  CHECK(back.tensors[0].name == "layer.0.w");
  CHECK(back.tensors[0].sum_squares == 4.5);
  CHECK(back.tensors[0].nonfinite == 2);
  CHECK(back.tensors[0].elements == 100);
  CHECK(back.update_skipped);
}

TEST_CASE("wire step: shard names round-trip beside the ids - as sent", "[wire][shards]") {
  const std::vector<uint64_t> shards = {3};
  const std::vector<std::string> names = {"train-00012-of-01024.parquet:7", "s3://b/k;x,y",
                                          std::string(256, 'n'), "\xc3\xa9t\xc3\xa9"};
  ReportedStep s;
  s.step = 5;
  s.shards = shards;
  s.shard_names = names;
  v1::StepReport proto;
  const ReportedStep back = RoundTrip(s, &proto);
  CHECK(proto.shard_names_size() == 4);
  CHECK(back.shard_names == names);
  CHECK(std::vector<uint64_t>(back.shards.begin(), back.shards.end()) == shards);
  // A report from an agent before names (no field 22) reads with none.
  v1::StepReport old;
  old.set_step(6);
  old.add_shard_ids(9);
  CHECK(StepFromProto(old).shard_names.empty());
}

TEST_CASE("wire step: absent stays absent and NaN stays NaN and present", "[wire]") {
  ReportedStep s;
  s.step = 3;
  s.Set(Signal::kLoss, std::nan("")).Set(Signal::kGradNorm,
                                         std::numeric_limits<double>::infinity());
  v1::StepReport proto;
  const ReportedStep back = RoundTrip(s, &proto);
  CHECK(proto.has_metrics());  // the message is always there, even empty
  CHECK_FALSE(proto.metrics().has_log_z());
  CHECK_FALSE(proto.has_learning_rate());
  CHECK(proto.attention_logit_p99_size() == 0);
  REQUIRE(back.Has(Signal::kLoss));
  CHECK(std::isnan(back.Get(Signal::kLoss)));
  CHECK(back.Get(Signal::kGradNorm) == std::numeric_limits<double>::infinity());
  CHECK(back.present() == (core::Bit(Signal::kLoss) | core::Bit(Signal::kGradNorm)));
  CHECK(std::isnan(back.loss_ema_ratio));
  CHECK(back.shards.empty());
  CHECK(back.tensors.empty());
}

TEST_CASE("wire step: the fp16 loss scale and overflow round-trip - absent stays absent",
          "[wire][fp16]") {
  ReportedStep s;
  s.SetLossScale(32768.0, true);
  v1::StepReport proto;
  StepToProto(s, &proto);
  REQUIRE(proto.has_loss_scale());
  CHECK(proto.loss_scale() == 32768.0);
  CHECK(proto.loss_scale_overflow());
  const ReportedStep back = StepFromProto(proto);
  REQUIRE(back.HasLossScale());
  CHECK(back.loss_scale() == 32768.0);
  CHECK(back.loss_scale_overflow());
  // A bf16 record sends neither field.
  v1::StepReport plain;
  StepToProto(ReportedStep{}, &plain);
  CHECK_FALSE(plain.has_loss_scale());
  CHECK_FALSE(plain.loss_scale_overflow());
  // An overflow flag without a scale excuses nothing: read as no loss scale.
  plain.set_loss_scale_overflow(true);
  CHECK_FALSE(StepFromProto(plain).HasLossScale());
  CHECK_FALSE(StepFromProto(plain).loss_scale_overflow());
}

TEST_CASE("wire step: several layers' attention p99 read as their maximum - NaN wins", "[wire]") {
  v1::StepReport proto;
  for (double v : {3.0, 9.0, 4.0}) proto.add_attention_logit_p99(v);
  CHECK(StepFromProto(proto).Get(Signal::kAttentionLogitP99) == 9.0);
  proto.add_attention_logit_p99(std::nan(""));
  proto.add_attention_logit_p99(5.0);
  const ReportedStep s = StepFromProto(proto);
  REQUIRE(s.Has(Signal::kAttentionLogitP99));
  CHECK(std::isnan(s.Get(Signal::kAttentionLogitP99)));
}

TEST_CASE("wire step: the bytes are the ones the agent always sent", "[wire]") {
  const std::vector<uint64_t> shards = {5, 9};
  ReportedStep s;
  s.step = 12;
  s.Set(Signal::kLoss, 2.0).Set(Signal::kLearningRate, 1e-3).Set(Signal::kAttentionLogitP99, 7);
  s.loss_ema_ratio = 1.1;
  s.elements = 10;
  s.shards = shards;
  v1::StepReport got;
  StepToProto(s, &got);
  v1::StepReport want;
  want.set_step(12);
  want.mutable_metrics()->set_loss(2.0);
  want.mutable_metrics()->set_loss_ema_ratio(1.1);
  want.set_learning_rate(1e-3);
  want.add_attention_logit_p99(7);
  want.set_element_count(10);
  want.add_shard_ids(5);
  want.add_shard_ids(9);
  CHECK(got.SerializeAsString() == want.SerializeAsString());
}

TEST_CASE("wire step: verdicts round-trip and a continue carries no rule", "[wire]") {
  v1::StepReport proto;
  VerdictToProto(core::Verdict{core::Decision::kHalt, 3, core::EventKind::kNonfiniteValue},
                 &proto);
  CHECK(proto.verdict() == v1::VERDICT_HALT);
  CHECK(proto.skip_rule() == v1::RULE_NONFINITE_METRIC);
  CHECK(proto.skip_tier() == v1::TIER_NUMERICAL_FAILURE);
  const core::Verdict v = VerdictFromProto(proto);
  CHECK(v.decision == core::Decision::kHalt);
  CHECK(v.tier == 3);
  CHECK(v.rule == core::EventKind::kNonfiniteValue);

  v1::StepReport cont;
  VerdictToProto(core::Verdict{}, &cont);
  CHECK(cont.verdict() == v1::VERDICT_CONTINUE);
  CHECK(cont.skip_rule() == v1::RULE_UNSPECIFIED);
  CHECK(cont.skip_tier() == v1::TIER_UNSPECIFIED);
  CHECK(VerdictFromProto(cont).decision == core::Decision::kContinue);
  // An unknown rule number keeps the decision and tier.
  proto.set_skip_rule(static_cast<v1::Rule>(77));
  CHECK(VerdictFromProto(proto).decision == core::Decision::kHalt);
  CHECK(VerdictFromProto(proto).tier == 3);
}

}  // namespace
}  // namespace trainwatch::wire
