// Replays of real public training logs (tests/data/realdata, metric lines
// only), asserting what their README says happens in each.

#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "synthetic.h"
#include "trainwatch/cli/metrics_file.h"
#include "trainwatch/cli/replay.h"

namespace trainwatch::cli {
namespace {

const std::string kDir = TRAINWATCH_REALDATA_DIR;

struct Replayed {
  Trace trace;
  ReplayResult result;
};

Replayed Load(const std::string& name, MetricsFormat expect) {
  auto trace = ReadMetricsFile(kDir + "/" + name);
  INFO(kDir << "/" << name);
  REQUIRE(trace.ok());
  CHECK(trace->format() == expect);
  auto result = Replay(*trace, core::RuleConfig());
  REQUIRE(result.ok());
  return {*std::move(trace), *std::move(result)};
}

std::string Dump(const ReplayResult& r) { return FormatEventsTable(r.events); }

size_t CountTierAtLeast(const ReplayResult& r, int tier) {
  size_t n = 0;
  for (const auto& e : r.events) n += e.tier >= tier;
  return n;
}

TEST_CASE("real log: llm.c GPT-2 124M is clean - its 15x grad outlier is not a page",
          "[cli][realdata]") {
  const Replayed r = Load("llmc-gpt2-124m.main.log", MetricsFormat::kLlmc);
  INFO(Dump(r.result));
  CHECK(r.trace.size() == 19552);
  CHECK(r.trace.reported() == (core::Bit(core::Signal::kLoss) |
                               core::Bit(core::Signal::kGradNorm) |
                               core::Bit(core::Signal::kLearningRate)));
  CHECK(CountTierAtLeast(r.result, 2) == 0);
  for (const auto& e : r.result.events) CHECK(e.action != core::Action::kPage);
}

TEST_CASE("real log: modded-nanogpt 1.5B is clean - its bump at 2730 is not a page",
          "[cli][realdata]") {
  const Replayed r = Load("modded-nanogpt-1p5b.log", MetricsFormat::kStepLog);
  INFO(Dump(r.result));
  CHECK(r.trace.size() == 20344);
  CHECK(CountTierAtLeast(r.result, 2) == 0);
  for (const auto& e : r.result.events) {
    CHECK(e.lacked_signals == (core::Bit(core::Signal::kGradNorm) |
                               core::Bit(core::Signal::kLogZ) |
                               core::Bit(core::Signal::kNanFrac)));
  }
}

TEST_CASE("real log: BitNet's spike at 1132-1142 is reported as a transient and not paged",
          "[cli][realdata]") {
  const Replayed r = Load("parameter-golf-bitnet.train.log", MetricsFormat::kStepLog);
  INFO(Dump(r.result));
  CHECK(r.trace.size() == 10000);
  CHECK(CountTierAtLeast(r.result, 2) == 0);
  const core::Event* spike = nullptr;
  for (const auto& e : r.result.events) {
    if (e.onset_step >= 1132 && e.onset_step <= 1142) spike = &e;
  }
  REQUIRE(spike != nullptr);
  CHECK(spike->tier <= 1);
  CHECK((spike->kind == core::EventKind::kTransient || spike->kind == core::EventKind::kSpike ||
         spike->kind == core::EventKind::kDataAnomaly));
  CHECK(spike->step <= 1150);
  CHECK(spike->action != core::Action::kPage);
  // The sequence-length changes at 335, 1002 and 1668 are not incidents.
  for (const auto& e : r.result.events) {
    for (int64_t confounder : {335, 1002, 1668}) {
      CHECK_FALSE((e.onset_step >= confounder && e.onset_step <= confounder + 10));
    }
  }
}

TEST_CASE("real log: Behemoth's NaN loss at step 1200 is tier 3 at that step",
          "[cli][realdata]") {
  const Replayed r = Load("parameter-golf-behemoth-v10.log", MetricsFormat::kStepLog);
  INFO(Dump(r.result));
  std::vector<core::Event> t3;
  for (const auto& e : r.result.events) {
    if (e.tier == 3) t3.push_back(e);
  }
  REQUIRE(t3.size() == 1);  // one episode, however many NaN steps follow
  CHECK(t3[0].step == 1200);
  CHECK(t3[0].action == core::Action::kHalt);
  CHECK(t3[0].reason.find("loss is nan") != std::string::npos);
  CHECK(r.result.halted_at == 1200);
  CHECK(CountTierAtLeast(r.result, 2) == 1);
}

TEST_CASE("replay speed: a 500k-step metrics file in well under a few seconds",
          "[cli][speed]") {
  synth::Options o;
  o.steps = 500000;
  const std::string csv = synth::ToCsv(synth::Generate(o));
  const auto t0 = std::chrono::steady_clock::now();
  auto trace = ParseMetrics(csv, "500k.csv");
  REQUIRE(trace.ok());
  auto result = Replay(*trace, core::RuleConfig());
  REQUIRE(result.ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("500k-step CSV parsed and replayed in " << seconds << " s");
  CHECK(result->records == 500000);
  // Well under a few seconds even on a loaded 2-core machine.
  CHECK(seconds < 3.0);
}

}  // namespace
}  // namespace trainwatch::cli
