// The stall rule on followed logs (`twctl follow`), fed the real logs in
// tests/data at the times their own lines give (train_time:Nms, or a date
// and time): the follower's liveness (agent/src/liveness.h) measures the
// log's writes as a follower reading the log live would, its heartbeats go
// to the server's (server/ingest/liveness.h) with trainwatchd's default
// options, and no real log, clean or not, may stall. The same log with an
// hour of silence in it must.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "absl/strings/numbers.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "ingest/liveness.h"
#include "liveness.h"  // the agent's (agent/src)
#include "testing/fake_clock.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;

// The time each line says it was written at (ms, from the log's first such
// line), for the lines that say one.
std::vector<int64_t> LineTimes(const std::string& path) {
  static const std::regex kTrainTime(R"(train_time:(\d+)ms)");
  static const std::regex kDateTime(
      R"((\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[,.](\d{3}))?)");
  std::ifstream in(path);
  std::vector<int64_t> times;
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    int64_t ms = -1;
    if (std::regex_search(line, m, kTrainTime)) {
      REQUIRE(absl::SimpleAtoi(m[1].str(), &ms));
    } else if (std::regex_search(line, m, kDateTime)) {
      int v[7] = {0};
      for (int i = 0; i < 7; ++i) {
        if (m[i + 1].matched) REQUIRE(absl::SimpleAtoi(m[i + 1].str(), &v[i]));
      }
      const absl::Time t =
          absl::FromCivil(absl::CivilSecond(v[0], v[1], v[2], v[3], v[4], v[5]), absl::UTCTimeZone());
      ms = absl::ToUnixMillis(t) + v[6];
    }
    if (ms >= 0) times.push_back(ms);
  }
  if (!times.empty()) {
    const int64_t first = times.front();
    for (int64_t& t : times) t -= first;
  }
  return times;
}

struct Paced {
  int opened = 0, resolved = 0;
  std::string title;
};

// Follows a log whose lines arrive at `times`, each its own write, with
// heartbeats every 5 s and trainwatchd's default stall options.
Paced Follow(const std::vector<int64_t>& times) {
  constexpr int64_t kStart = 1'700'000'000'000;
  constexpr int64_t kBeatMs = 5'000;
  testing::FakeClock clock(kStart);
  agent::internal::Liveness follower(&clock);
  Liveness server(LivenessOptions(), nullptr);
  RunRow row;
  row.run_id = "followed";
  row.world_size = 1;
  row.observed = true;
  RunState state(row);
  IdCounters ids;
  WriteBatch rows;
  Paced paced;
  auto beat = [&](int64_t now) {
    v1::Heartbeat h;
    h.set_run_id("followed");
    h.set_interval_ms(kBeatMs);
    follower.Fill(&h);
    server.OnHeartbeat(h, now);
    std::vector<std::pair<IncidentRow, IncidentChange>> changes;
    server.Check(now, [&](const std::string&) { return &state; }, &ids,
                 IncidentSink{&rows, &changes});
    for (const auto& [inc, change] : changes) {
      if (change == IncidentChange::kOpened) {
        ++paced.opened;
        paced.title = inc.title;
      }
      if (inc.state == IncidentState::kResolved) ++paced.resolved;
    }
  };
  int64_t next_beat = kStart, last = kStart;
  for (size_t i = 0; i < times.size(); ++i) {
    const int64_t t = std::max(last, kStart + times[i]);  // a clock set back is no pace
    for (; next_beat < t; next_beat += kBeatMs) {
      clock.AdvanceMs(next_beat - clock.NowMs());
      beat(next_beat);
    }
    clock.AdvanceMs(t - clock.NowMs());
    follower.CaughtUp();  // the follower had read all before this line
    follower.LogStep(static_cast<int64_t>(i));
    server.OnProgress("followed", static_cast<int64_t>(i), t);
    last = t;
  }
  return paced;
}

TEST_CASE("log pace: no real log in tests/data stalls when followed at its own timestamps",
          "[server][liveness][realdata]") {
  std::vector<std::string> paced;  // the logs with 50 timed lines or more
  for (const char* dir : {"realdata", "formats"}) {
    for (const auto& e : std::filesystem::directory_iterator(
             std::string(TRAINWATCH_TEST_DATA_DIR) + "/" + dir)) {
      if (e.path().extension() != ".log") continue;
      const std::vector<int64_t> times = LineTimes(e.path().string());
      if (times.size() < 2) continue;
      INFO(e.path().filename().string() << ": " << times.size() << " timed lines over "
                                        << times.back() / 1000 << " s");
      const Paced p = Follow(times);
      CHECK(p.opened == 0);
      CHECK(p.title == "");
      if (times.size() >= 50) paced.push_back(e.path().filename().string());
    }
  }
  // The public runs that say their times were covered.
  std::sort(paced.begin(), paced.end());
  CHECK(paced == std::vector<std::string>{"modded-nanogpt-1p5b.log",
                                          "parameter-golf-behemoth-v10.log",
                                          "parameter-golf-bitnet.train.log"});
}

TEST_CASE("log pace: the same real log with an hour of silence in it stalls once - then resolves",
          "[server][liveness][realdata]") {
  std::vector<int64_t> times =
      LineTimes(std::string(TRAINWATCH_TEST_DATA_DIR) + "/realdata/modded-nanogpt-1p5b.log");
  REQUIRE(times.size() > 10'000);
  for (size_t i = 10'000; i < times.size(); ++i) times[i] += 3'600'000;
  const Paced p = Follow(times);
  CHECK(p.opened == 1);
  CHECK(p.resolved == 1);
  CHECK(p.title.rfind("stalled: the log has written no step after step 9999 for ", 0) == 0);
}

}  // namespace
}  // namespace trainwatch::server
