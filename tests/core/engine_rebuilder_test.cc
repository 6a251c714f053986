// EngineRebuilder: a replay of history gives the engine that lived through
// it, up to the step it is told, and nothing past it.

#include <cmath>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "trainwatch/core/rule_engine.h"

namespace trainwatch::core {
namespace {

std::vector<StepRecord> History(int64_t steps) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> noise(0.0, 0.01);
  std::vector<StepRecord> out;
  for (int64_t s = 0; s < steps; ++s) {
    StepRecord r;
    r.step = s;
    r.Set(Signal::kLoss, 2.5 + noise(rng)).Set(Signal::kGradNorm, 1.0 + noise(rng));
    r.Set(Signal::kLogZ, 8.0).Set(Signal::kNanFrac, 0.0);
    out.push_back(r);
  }
  return out;
}

// Steps with a loss jump and a grad-norm outlier: a data anomaly once the
// engine is warm, a different verdict while it is not.
std::vector<Verdict> Verdicts(RuleEngine& engine, int64_t from, int64_t count) {
  std::vector<Verdict> out;
  StepOutcome o;
  for (int64_t s = from; s < from + count; ++s) {
    StepRecord r;
    r.step = s;
    const bool bad = s == from + 3;
    r.Set(Signal::kLoss, bad ? 9.0 : 2.5).Set(Signal::kGradNorm, bad ? 40.0 : 1.0);
    r.Set(Signal::kLogZ, 8.0).Set(Signal::kNanFrac, 0.0);
    REQUIRE(engine.Judge(r, &o).ok());
    out.push_back(o.verdict);
  }
  return out;
}

TEST_CASE("engine rebuilder: the replayed engine decides as the one that lived the history",
          "[core][rebuild]") {
  const RuleConfig config;
  const std::vector<StepRecord> history = History(3000);
  RuleEngine lived(config);
  StepOutcome o;
  for (const StepRecord& r : history) REQUIRE(lived.Judge(r, &o).ok());
  lived.NoteCheckpoint(2500, "ck/2500");

  EngineRebuilder rebuild(config);
  rebuild.NoteCheckpoint(2500, "ck/2500");  // before the records: order does not matter
  for (const StepRecord& r : history) CHECK(rebuild.Feed(r));
  CHECK_FALSE(rebuild.Feed(history.back()));  // not after the last step
  CHECK(rebuild.fed() == 3000);
  std::unique_ptr<RuleEngine> replayed = std::move(rebuild).Finish();
  CHECK(replayed->last_step() == lived.last_step());
  CHECK(replayed->MemoryBytes() == lived.MemoryBytes());

  const std::vector<Verdict> a = Verdicts(lived, 3000, 10);
  const std::vector<Verdict> b = Verdicts(*replayed, 3000, 10);
  REQUIRE(a.size() == b.size());
  bool skipped = false;
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].decision == b[i].decision);
    CHECK(a[i].tier == b[i].tier);
    skipped |= a[i].decision == Decision::kSkipUpdate;
  }
  CHECK(skipped);  // the comparison saw a decision, not only "continue"
}

TEST_CASE("engine rebuilder: no record past up_to - and a cold engine has no tier 1", "[core][rebuild]") {
  EngineRebuilder rebuild(RuleConfig(), 99);
  for (const StepRecord& r : History(200)) CHECK(rebuild.Feed(r) == (r.step <= 99));
  CHECK(rebuild.fed() == 100);
  std::unique_ptr<RuleEngine> e = std::move(rebuild).Finish();
  CHECK(e->last_step() == 99);
  // A fresh engine: without the warm-up history there is no tier 1 skip.
  std::unique_ptr<RuleEngine> cold = std::move(EngineRebuilder(RuleConfig())).Finish();
  for (const Verdict& v : Verdicts(*cold, 0, 10)) CHECK(v.decision != Decision::kSkipUpdate);
}

}  // namespace
}  // namespace trainwatch::core
