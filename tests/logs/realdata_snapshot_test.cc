// The engine-snapshot property on the real public logs (tests/data/realdata):
// an engine saved and restored at any step decides on the rest of the log
// as the engine that never stopped (tests/testing/engine_roundtrip.h).

#include <random>
#include <string>

#include <catch2/catch.hpp>

#include "testing/engine_roundtrip.h"
#include "trainwatch/logs/metrics_file.h"

namespace trainwatch::logs {
namespace {

TEST_CASE("real logs: an engine restored from a snapshot decides as the one that never stopped",
          "[logs][realdata][snapshot]") {
  const std::string dir = TRAINWATCH_REALDATA_DIR;
  size_t events = 0;
  for (const char* name : {"llmc-gpt2-124m.main.log", "modded-nanogpt-1p5b.log",
                           "parameter-golf-behemoth-v10.log", "parameter-golf-bitnet.train.log"}) {
    INFO(name);
    auto trace = ReadMetricsFile(dir + "/" + name);
    REQUIRE(trace.ok());
    std::mt19937_64 rng(trace->size());
    for (int k = 0; k < 2; ++k) {
      const size_t cut = rng() % trace->size();
      events += testing::CheckRoundTrip(core::RuleConfig(), trace->size(), cut,
                                        [&](size_t i) { return trace->Record(i); })
                    .events_after_cut;
    }
  }
  CHECK(events > 0);
}

}  // namespace
}  // namespace trainwatch::logs
