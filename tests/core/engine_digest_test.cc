// The engine is deterministic, and a change made for speed must keep every
// decision: fixed synthetic traces give a fixed digest of every step's
// outcome (verdict, derived numbers bit for bit, events with their reasons,
// shards and recommendations). The expected digests were taken on the engine
// before its per-record costs were cut; a change that moves one decision, one
// reason's wording or one derived number's last bit changes them. When a
// change of behaviour is intended, the digest is updated with it, in the same
// commit, and the commit says why.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "synthetic.h"
#include "trainwatch/core/rule_engine.h"

namespace trainwatch::core {
namespace {

// FNV-1a, 64 bits: simple, stable across platforms and compilers.
class Digest {
 public:
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h_ = (h_ ^ b[i]) * 0x100000001b3ull;
  }
  void Int(int64_t v) { Bytes(&v, sizeof v); }
  void Double(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    Int(static_cast<int64_t>(bits));
  }
  void Str(const std::string& s) {
    Int(static_cast<int64_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

void Add(Digest& d, const StepOutcome& out) {
  d.Int(static_cast<int>(out.verdict.decision));
  d.Int(out.verdict.tier);
  d.Int(static_cast<int>(out.verdict.rule));
  d.Double(out.loss_ema_ratio);
  d.Double(out.loss_ema);
  d.Double(out.grad_norm_median);
  d.Int(out.warming_up);
  for (const Event& e : out.events) {
    d.Int(e.step);
    d.Int(e.onset_step);
    d.Int(e.tier);
    d.Int(static_cast<int>(e.action));
    d.Int(static_cast<int>(e.kind));
    d.Int(static_cast<int64_t>(e.episode));
    d.Str(e.reason);
    for (uint64_t s : e.shards) d.Int(static_cast<int64_t>(s));
    for (const std::string& s : e.shard_names) d.Str(s);
    d.Int(e.shards_truncated);
    d.Int(e.recommended_checkpoint_step);
    d.Str(e.recommended_checkpoint_uri);
    d.Int(static_cast<int64_t>(e.recommended_actions.size()));
    d.Int(e.closes_episode);
    d.Int(e.lacked_signals);
    for (double v : {e.loss, e.loss_ema, e.loss_ema_ratio, e.grad_norm, e.grad_norm_median,
                     e.log_z}) {
      d.Double(v);
    }
  }
}

struct Result {
  uint64_t digest;
  size_t events;
};

Result Run(const synth::Options& o) {
  const std::vector<synth::Row> rows = synth::Generate(o);
  RuleEngine engine{RuleConfig()};
  StepOutcome out;
  Digest d;
  size_t events = 0;
  for (const synth::Row& row : rows) {
    const StepRecord r = synth::ToRecord(row);
    REQUIRE(engine.Judge(r, &out).ok());
    d.Int(r.step);
    Add(d, out);
    events += out.events.size();
  }
  return {d.value(), events};
}

TEST_CASE("engine digest: the demo trace gives the same outcomes step for step",
          "[engine][digest]") {
  const Result r = Run(synth::DemoOptions());
  CHECK(r.events > 0);
  CHECK(r.digest == 0x8ff0da39b2e0c836ull);
}

TEST_CASE("engine digest: a drifting 60k-step trace gives the same outcomes step for step",
          "[engine][digest]") {
  synth::Options o;
  o.steps = 60000;
  o.seed = 7;
  o.log_z_drift_per_1k = 0.02;
  o.corrupt_batch_step = 20000;
  o.logit_drift_step = 40000;
  const Result r = Run(o);
  CHECK(r.events > 0);
  CHECK(r.digest == 0x8fdf05a80ded309full);
}

}  // namespace
}  // namespace trainwatch::core
