// Rule engine throughput: step records evaluated per second on one core, and
// the memory of one run's state. The goal (issue 16) is >= 3,000,000
// records/s on an idle machine and >= 2,000,000 with margin on a loaded one,
// so that replaying a 500k-step run, parsing included, takes under 0.5 s.
// On a shared machine compare builds by alternating them (the wall figure
// moves by 10-20% with the load) or by instructions per record under
// cachegrind, which the load does not move.

#include <vector>

#include <benchmark/benchmark.h>

#include "synthetic.h"
#include "trainwatch/core/rule_engine.h"

namespace {

using trainwatch::core::RuleConfig;
using trainwatch::core::RuleEngine;
using trainwatch::core::StepOutcome;
using trainwatch::core::StepRecord;

std::vector<StepRecord> MakeRecords(const std::vector<trainwatch::synth::Row>& rows) {
  std::vector<StepRecord> recs;
  recs.reserve(rows.size());
  for (const auto& row : rows) recs.push_back(trainwatch::synth::ToRecord(row));
  return recs;
}

// A 500k-step benign run with a slow log_z drift: the steady state.
void BM_JudgeBenign(benchmark::State& state) {
  trainwatch::synth::Options o;
  o.steps = 500000;
  o.log_z_drift_per_1k = 0.01;
  const auto rows = trainwatch::synth::Generate(o);
  const auto recs = MakeRecords(rows);
  size_t bytes = 0;
  for (auto _ : state) {
    RuleEngine engine{RuleConfig()};
    StepOutcome out;
    for (const StepRecord& r : recs) {
      if (!engine.Judge(r, &out).ok()) state.SkipWithError("rejected");
    }
    benchmark::DoNotOptimize(out);
    bytes = engine.MemoryBytes();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(recs.size()));
  state.counters["state_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_JudgeBenign)->Unit(benchmark::kMillisecond);

// The demo run: a bad batch, a drift, a NaN — events and their formatting
// included.
void BM_JudgeDemo(benchmark::State& state) {
  const auto rows = trainwatch::synth::Generate(trainwatch::synth::DemoOptions());
  const auto recs = MakeRecords(rows);
  for (auto _ : state) {
    RuleEngine engine{RuleConfig()};
    StepOutcome out;
    size_t events = 0;
    for (const StepRecord& r : recs) {
      if (!engine.Judge(r, &out).ok()) state.SkipWithError("rejected");
      events += out.events.size();
    }
    benchmark::DoNotOptimize(events);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(recs.size()));
}
BENCHMARK(BM_JudgeDemo)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
