// A nan or inf a log writes is a signal: a tier 3 input even when the metric
// was never finite, while a metric the log never writes stays unknown
// (lacked_signals). Replayed through the engine, on real excerpts
// (tests/data/formats) and on the smallest inputs that show each rule.

#include <algorithm>
#include <cmath>
#include <string>

#include <catch2/catch.hpp>

#include "trainwatch/logs/metrics_file.h"
#include "trainwatch/logs/replay.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

const std::string kFormats = TRAINWATCH_FORMATS_DIR;

ReplayResult ReplayText(absl::string_view content, MetricsFormat expect) {
  auto t = ParseMetrics(content, "run.log");
  REQUIRE(t.ok());
  CHECK(t->format() == expect);
  auto r = Replay(*t, core::RuleConfig());
  REQUIRE(r.ok());
  return *std::move(r);
}

ReplayResult ReplayFile(const std::string& name, MetricsFormat expect) {
  INFO(kFormats << "/" << name);
  auto t = ReadMetricsFile(kFormats + "/" + name);
  REQUIRE(t.ok());
  CHECK(t->format() == expect);
  auto r = Replay(*t, core::RuleConfig());
  REQUIRE(r.ok());
  return *std::move(r);
}

// The first tier 3 event, which must exist.
const core::Event& FirstHalt(const ReplayResult& r) {
  auto it = std::find_if(r.events.begin(), r.events.end(),
                         [](const core::Event& e) { return e.tier == 3; });
  REQUIRE(it != r.events.end());
  return *it;
}

TEST_CASE("a metric written only as nan halts at its first step", "[logs][nonfinite]") {
  // grad_norm is never finite in this file: before, the reader took it for
  // "never reported" and replay said nothing.
  const ReplayResult r =
      ReplayText("step,loss,grad_norm,log_z,nan_frac\n1,2.5,nan,,0\n2,2.4,nan,,0\n",
                 MetricsFormat::kGenericCsv);
  CHECK(r.halted_at == 1);
  const core::Event& e = FirstHalt(r);
  CHECK(e.step == 1);
  CHECK(e.reason.find("grad_norm is nan") != std::string::npos);
  // Never written: still unknown, and said so. Written as nan: not lacked.
  CHECK((e.lacked_signals & core::Bit(Signal::kLogZ)) != 0);
  CHECK((e.lacked_signals & core::Bit(Signal::kGradNorm)) == 0);
}

TEST_CASE("an inf written in a trainer's log halts", "[logs][nonfinite]") {
  const ReplayResult r = ReplayText(
      "s:0 trl:11.01 lr:0.000001 norm:inf\ns:1 trl:10.95 lr:0.000002 norm:inf\n",
      MetricsFormat::kLlmc);
  CHECK(r.halted_at == 0);
}

TEST_CASE("Megatron-DeepSpeed silent NaN: grad norm nan and no lm loss halts at once",
          "[logs][nonfinite][megatron]") {
  // bigscience-workshop/Megatron-DeepSpeed#396: bf16, "grad norm: nan", no
  // "lm loss" and "number of nan iterations: 0" on every line.
  const ReplayResult r =
      ReplayFile("megatron-deepspeed-silent-nan.log", MetricsFormat::kMegatron);
  CHECK(r.records == 3);
  CHECK(r.halted_at == 5426);
  CHECK(FirstHalt(r).step == 5426);
}

TEST_CASE("Megatron: a line with a grad norm and no lm loss is a failed step",
          "[logs][nonfinite][megatron]") {
  // Megatron prints "lm loss" only when the interval's average is above
  // zero: a NaN loss drops the field while the grad norm is still printed.
  const std::string ok =
      " iteration      100/  500000 | learning rate: 1.5E-04 | lm loss: 7.1E+00 | loss scale: "
      "1.0 | grad norm: 2.3 | number of skipped iterations:   0 | number of nan iterations:   0 "
      "|\n";
  const std::string no_loss =
      " iteration      110/  500000 | learning rate: 1.5E-04 | loss scale: 1.0 | grad norm: "
      "2.4 | number of skipped iterations:   0 | number of nan iterations:   0 |\n";
  auto t = ParseMetrics(ok + no_loss, "run.log");
  REQUIRE(t.ok());
  REQUIRE(t->size() == 2);
  CHECK(t->Record(1).Has(Signal::kLoss));
  CHECK(std::isnan(t->Record(1).Get(Signal::kLoss)));
  const ReplayResult r = ReplayText(ok + no_loss, MetricsFormat::kMegatron);
  CHECK(r.halted_at == 110);
  CHECK(FirstHalt(r).reason.find("loss is nan") != std::string::npos);

  // Without a grad norm either (an interval whose updates were all
  // skipped), the line says nothing of the loss: unknown, no halt.
  const std::string skipped =
      " iteration      110/  500000 | learning rate: 1.5E-04 | loss scale: 1.0 | number of "
      "skipped iterations:  10 | number of nan iterations:   0 |\n";
  auto s = ParseMetrics(ok + skipped, "run.log");
  REQUIRE(s.ok());
  CHECK_FALSE(s->Record(1).Has(Signal::kLoss));
  CHECK(ReplayText(ok + skipped, MetricsFormat::kMegatron).halted_at == -1);
}

TEST_CASE("nanoGPT loss nan halts at the first nan iter", "[logs][nonfinite][nanogpt]") {
  // karpathy/nanoGPT#215: fp16 on a V100, loss nan from iter 3010 on.
  const ReplayResult r = ReplayFile("nanogpt-fp16-nan.log", MetricsFormat::kNanoGpt);
  CHECK(r.halted_at == 3010);
  CHECK(FirstHalt(r).reason.find("loss is nan") != std::string::npos);
}

TEST_CASE("nanoGPT: a run whose every loss is nan halts at its first line",
          "[logs][nonfinite][nanogpt]") {
  const ReplayResult r = ReplayText(
      "iter 0: loss nan, time 9371.81ms, mfu -100.00%\niter 10: loss nan, time 893.76ms, mfu "
      "16.68%\n",
      MetricsFormat::kNanoGpt);
  CHECK(r.halted_at == 0);
  CHECK((FirstHalt(r).lacked_signals & core::Bit(Signal::kLoss)) == 0);
}

}  // namespace
}  // namespace trainwatch::logs
