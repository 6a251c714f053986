// RuleEngine::SaveState / FromState: an engine restored from a snapshot at
// any step decides as the one that never stopped (the property, over random
// traces with every kind of trouble in them), and a damaged, foreign or
// out-of-date snapshot is refused with a reason, never half restored.

#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "synthetic.h"
#include "testing/engine_roundtrip.h"
#include "trainwatch/core/rule_engine.h"

namespace trainwatch::core {
namespace {

// A synthetic run with the injected failures at random places, shards
// (ids and names), checkpoints, spikes and the optional signals, so that
// every part of the state is live somewhere.
struct RandomTrace {
  std::vector<synth::Row> rows;
  std::vector<std::vector<uint64_t>> shards;
  std::vector<std::vector<std::string>> names;
  std::vector<std::string> ckpt;
  std::mt19937_64 rng;

  explicit RandomTrace(uint64_t seed, int64_t steps) : rng(seed) {
    synth::Options o;
    o.steps = steps;
    o.seed = seed;
    o.checkpoint_every = 500;
    std::uniform_int_distribution<int64_t> at(steps / 5, steps - 1);
    o.corrupt_batch_step = at(rng);
    o.logit_drift_step = seed % 2 ? at(rng) : -1;
    o.nan_step = seed % 3 == 0 ? at(rng) : -1;
    rows = synth::Generate(o);
    for (const synth::Row& r : rows) {
      shards.push_back({r.shard, r.shard + 1 + rng() % 3});
      names.push_back(rng() % 4 == 0 ? std::vector<std::string>{absl::StrCat("shard-", r.shard % 97)}
                                     : std::vector<std::string>{});
      ckpt.push_back(r.checkpoint);
    }
    // A few loss spikes of random length and height, and gaps in the steps
    // (logs that report every K steps).
    for (int k = 0; k < 4; ++k) {
      const size_t from = static_cast<size_t>(at(rng)) % rows.size();
      const size_t len = 5 + rng() % 300;
      const double up = 0.3 + (rng() % 100) / 50.0;
      for (size_t i = from; i < rows.size() && i < from + len; ++i) rows[i].loss += up;
    }
  }

  StepRecord Record(size_t i) const {
    const synth::Row& row = rows[i];
    StepRecord r;
    r.step = row.step;
    r.Set(Signal::kLoss, row.loss).Set(Signal::kGradNorm, row.grad_norm);
    r.Set(Signal::kLogZ, row.log_z).Set(Signal::kNanFrac, row.nan_frac);
    if (i % 3 == 0) r.Set(Signal::kActivationMax, 10.0 + row.log_z);
    if (i % 5 == 0) r.Set(Signal::kAttentionLogitP99, 20.0 + row.log_z);
    r.shards = shards[i];
    r.shard_names = names[i];
    r.checkpoint_uri = ckpt[i];
    return r;
  }
};

TEST_CASE("engine state: restored at any step it decides as the engine that never stopped",
          "[core][snapshot]") {
  const RuleConfig config;
  size_t events = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const RandomTrace t(seed, 12000);
    std::mt19937_64 rng(seed * 7919);
    for (int k = 0; k < 3; ++k) {
      const size_t cut = rng() % t.rows.size();
      INFO("seed " << seed << " cut " << cut);
      events += testing::CheckRoundTrip(config, t.rows.size(), cut,
                                        [&](size_t i) { return t.Record(i); })
                    .events_after_cut;
    }
  }
  CHECK(events > 20);  // the comparison saw decisions, not only quiet steps
}

TEST_CASE("engine state: a fresh engine and one mid-episode both round-trip",
          "[core][snapshot]") {
  const RandomTrace t(11, 8000);
  auto rec = [&](size_t i) { return t.Record(i); };
  testing::CheckRoundTrip(RuleConfig(), t.rows.size(), 0, rec);
  // Just after the corrupt batch: an episode is open.
  size_t at = 0;
  for (size_t i = 1; i < t.rows.size(); ++i) {
    if (t.rows[i].loss - t.rows[i - 1].loss > 2.0) at = i + 1;
  }
  REQUIRE(at > 0);
  testing::CheckRoundTrip(RuleConfig(), t.rows.size(), at, rec);
}

TEST_CASE("engine state: cut inside a warm-up divergence - it pages once - as without the cut",
          "[core][snapshot][warmup]") {
  // Loss 3, then far above its lowest value from record 30: the page comes
  // at record 32; cut at 31, between the first high record and the page.
  auto rec = [](size_t i) {
    StepRecord r;
    r.step = static_cast<int64_t>(i);
    r.Set(Signal::kLoss, i < 30 ? 3.0 - 0.01 * static_cast<double>(i) : 9.0);
    return r;
  };
  const auto result = testing::CheckRoundTrip(RuleConfig(), 40, 31, rec);
  CHECK(result.events_after_cut == 1);  // the page, decided by the restored engine
}

std::string SavedAfter(const RuleConfig& config, int64_t steps) {
  const RandomTrace t(5, steps);
  RuleEngine e(config);
  StepOutcome o;
  for (size_t i = 0; i < t.rows.size(); ++i) REQUIRE(e.Judge(t.Record(i), &o).ok());
  return e.SaveState();
}

TEST_CASE("engine state: a snapshot holds each step's own shard ids - not its whole stride",
          "[core][snapshot]") {
  // The trace names two shards a step. A stride of 256 slots instead of 16
  // adds 1024 x 240 unused slots to the ring (1.9 MB of ids if saved); only
  // the rules' text may grow.
  const RuleConfig narrow;
  RuleConfig wide;
  wide.max_shards_per_step = 256;
  REQUIRE(Validate(wide).ok());
  const std::string a = SavedAfter(narrow, 3000), b = SavedAfter(wide, 3000);
  CHECK(b.size() < a.size() + 64);
  // And the ids come back where the engine reads them.
  const RandomTrace t(13, 4000);
  testing::CheckRoundTrip(wide, t.rows.size(), 2500, [&](size_t i) { return t.Record(i); });
}

TEST_CASE("engine state: damaged - truncated - foreign rules - another version are refused",
          "[core][snapshot]") {
  const RuleConfig config;
  const std::string blob = SavedAfter(config, 3000);

  SECTION("a flipped byte anywhere fails the checksum or the header") {
    std::mt19937_64 rng(1);
    for (int k = 0; k < 200; ++k) {
      std::string bad = blob;
      bad[rng() % bad.size()] ^= static_cast<char>(1 + rng() % 255);
      absl::StatusOr<std::unique_ptr<RuleEngine>> e = RuleEngine::FromState(config, bad);
      REQUIRE_FALSE(e.ok());
    }
  }
  SECTION("truncated or empty") {
    for (size_t n : {size_t{0}, size_t{3}, size_t{15}, blob.size() / 2, blob.size() - 1}) {
      absl::StatusOr<std::unique_ptr<RuleEngine>> e =
          RuleEngine::FromState(config, blob.substr(0, n));
      REQUIRE_FALSE(e.ok());
      CHECK(e.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(e.status().message().find("engine snapshot") != absl::string_view::npos);
    }
  }
  SECTION("built under other rules") {
    RuleConfig other = config;
    other.tier1_grad_ratio += 1.0;
    absl::StatusOr<std::unique_ptr<RuleEngine>> e = RuleEngine::FromState(other, blob);
    REQUIRE_FALSE(e.ok());
    CHECK(e.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(e.status().message().find("rule config") != absl::string_view::npos);
  }
  SECTION("another format version") {
    std::string bad = blob;
    bad[4] = 99;
    absl::StatusOr<std::unique_ptr<RuleEngine>> e = RuleEngine::FromState(config, bad);
    REQUIRE_FALSE(e.ok());
    CHECK(e.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(e.status().message().find("version 99") != absl::string_view::npos);
  }
  SECTION("the previous format, whose small medians were heaps") {
    std::string old = blob;
    old[4] = 1;
    absl::StatusOr<std::unique_ptr<RuleEngine>> e = RuleEngine::FromState(config, old);
    REQUIRE_FALSE(e.ok());
    CHECK(e.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(e.status().message().find("version 1,") != absl::string_view::npos);
  }
  SECTION("the intact blob restores") {
    absl::StatusOr<std::unique_ptr<RuleEngine>> e = RuleEngine::FromState(config, blob);
    REQUIRE(e.ok());
    CHECK((*e)->last_step() == 2999);
  }
}

}  // namespace
}  // namespace trainwatch::core
