// The health math against brute-force references on random data.

#include <algorithm>
#include <cmath>
#include <deque>
#include <random>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "trainwatch/core/windows.h"

namespace trainwatch::core {
namespace {

struct Sample {
  int64_t step;
  double value;
};

// Random steps with gaps of 1..max_gap and values with many duplicates (a
// median structure's classic failure), plus occasional huge outliers.
std::vector<Sample> RandomSamples(uint64_t seed, size_t n, int max_gap) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> gap(1, max_gap);
  std::uniform_int_distribution<int> coarse(0, 40);
  std::normal_distribution<double> fine(0.0, 1.0);
  std::vector<Sample> out;
  int64_t step = 0;
  for (size_t i = 0; i < n; ++i) {
    step += gap(rng);
    double v = (rng() % 3 == 0) ? coarse(rng) * 0.25 : fine(rng);
    if (rng() % 97 == 0) v *= 1e6;
    out.push_back({step, v});
  }
  return out;
}

TEST_CASE("DecayingMean equals the weighted mean of all previous samples", "[core][ema]") {
  for (int max_gap : {1, 7}) {
    const auto samples = RandomSamples(11 + max_gap, 3000, max_gap);
    const double span = 1000;
    const double keep = 1.0 - 2.0 / (span + 1.0);
    DecayingMean ema(span);
    CHECK(std::isnan(ema.Value()));
    for (size_t i = 0; i < samples.size(); ++i) {
      ema.Add(samples[i].step, samples[i].value);
      if (i % 37 != 0 && i + 1 != samples.size()) continue;
      double num = 0, den = 0;
      for (size_t k = 0; k <= i; ++k) {
        const double w = std::pow(keep, static_cast<double>(samples[i].step - samples[k].step));
        num += w * samples[k].value;
        den += w;
      }
      const double ref = num / den;
      REQUIRE(ema.Value() == Approx(ref).epsilon(1e-9).margin(1e-6));
    }
  }
}

TEST_CASE("DecayingMean of a constant is that constant from the first sample", "[core][ema]") {
  DecayingMean ema(1000);
  ema.Add(5, 2.5);
  CHECK(ema.Value() == Approx(2.5));
  ema.Add(6, 2.5);
  ema.Add(900, 2.5);
  CHECK(ema.Value() == Approx(2.5));
}

TEST_CASE("SlidingMedian equals the sorted window's median", "[core][median]") {
  for (auto [window, max_gap, n] : {std::tuple<int64_t, int, size_t>{1, 1, 200},
                                    {2, 1, 500},
                                    {50, 1, 4000},
                                    {51, 3, 4000},
                                    {200, 9, 6000},
                                    {5000, 1, 20000}}) {
    CAPTURE(window, max_gap);
    const auto samples = RandomSamples(static_cast<uint64_t>(window * 31 + max_gap), n, max_gap);
    SlidingMedian med(window);
    std::deque<Sample> ref;
    for (size_t i = 0; i < samples.size(); ++i) {
      const int64_t now = samples[i].step;
      med.EvictBefore(now - window);
      while (!ref.empty() && ref.front().step < now - window) ref.pop_front();
      REQUIRE(med.size() == ref.size());
      const bool check = window < 1000 || i % 101 == 0;
      if (check) {
        if (ref.empty()) {
          REQUIRE(std::isnan(med.Median()));
        } else {
          std::vector<double> v;
          for (const Sample& s : ref) v.push_back(s.value);
          std::sort(v.begin(), v.end());
          const size_t m = v.size() / 2;
          const double expect = v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
          REQUIRE(med.Median() == expect);
        }
      }
      med.Push(now, samples[i].value);
      ref.push_back(samples[i]);
    }
  }
}

TEST_CASE("SlidingMedian PushAndEvict equals the sorted window's median", "[core][median]") {
  // 128 and 129 straddle the change from the sorted array to the heaps.
  for (auto [window, max_gap] : {std::pair<int64_t, int>{1, 1}, {7, 1}, {64, 1}, {64, 5},
                                 {SlidingMedian::kSortedMaxWindow, 1},
                                 {SlidingMedian::kSortedMaxWindow + 1, 1}, {300, 2}}) {
    CAPTURE(window, max_gap);
    const auto samples = RandomSamples(static_cast<uint64_t>(window * 7 + max_gap), 5000, max_gap);
    SlidingMedian med(window);
    std::deque<Sample> ref;
    for (const Sample& s : samples) {
      // The engine's order: the new sample enters as the window moves on.
      med.PushAndEvict(s.step, s.value, s.step + 1 - window);
      ref.push_back(s);
      while (!ref.empty() && ref.front().step < s.step + 1 - window) ref.pop_front();
      REQUIRE(med.size() == ref.size());
      std::vector<double> v;
      for (const Sample& x : ref) v.push_back(x.value);
      std::sort(v.begin(), v.end());
      const size_t m = v.size() / 2;
      REQUIRE(med.Median() == (v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m])));
    }
  }
}

// A drifting stream (a grad norm that falls, then climbs): the middle ranks
// walk steadily off one end of the heap form's sorted run, so the run is
// refilled from a heap's top and spilled into the other, over and over.
TEST_CASE("SlidingMedian follows a drifting stream", "[core][median]") {
  for (int64_t window : {int64_t{300}, int64_t{5000}}) {
    CAPTURE(window);
    std::mt19937_64 rng(static_cast<uint64_t>(window));
    std::normal_distribution<double> noise(0.0, 0.05);
    SlidingMedian med(window);
    std::deque<double> ref;
    for (int64_t step = 0; step < 4 * window; ++step) {
      const double trend = step < 2 * window ? -0.001 * step : 0.002 * (step - 3 * window);
      const double v = step % 11 == 0 ? 1.0 : trend + noise(rng);  // and one value repeated
      med.PushAndEvict(step, v, step + 1 - window);
      ref.push_back(v);
      if (static_cast<int64_t>(ref.size()) > window) ref.pop_front();
      if (window > 1000 && step % 37 != 0) continue;
      std::vector<double> sorted(ref.begin(), ref.end());
      std::sort(sorted.begin(), sorted.end());
      const size_t m = sorted.size() / 2;
      REQUIRE(med.Median() == (sorted.size() % 2 ? sorted[m] : 0.5 * (sorted[m - 1] + sorted[m])));
    }
  }
}

TEST_CASE("SlidingMedian holds at most its window and reports its memory", "[core][median]") {
  SlidingMedian med(5000);
  for (int64_t s = 0; s < 12000; ++s) med.Push(s, static_cast<double>(s % 10));
  CHECK(med.size() == 5000);
  CHECK(med.Median() == 4.5);
  CHECK(med.MemoryBytes() < 200 * 1024);
}

TEST_CASE("SlidingMin equals the brute-force window minimum", "[core][min]") {
  for (int max_gap : {1, 5}) {
    const auto samples = RandomSamples(99 + max_gap, 5000, max_gap);
    const int64_t window = 300;
    SlidingMin mn(window);
    std::vector<Sample> seen;
    for (const Sample& s : samples) {
      const double got = mn.MinSince(s.step - window);
      double ref = NAN;
      for (const Sample& p : seen) {
        if (p.step >= s.step - window && !(p.value >= ref)) ref = p.value;
      }
      if (std::isnan(ref)) {
        REQUIRE(std::isnan(got));
      } else {
        REQUIRE(got == ref);
      }
      mn.Push(s.step, s.value);
      seen.push_back(s);
    }
  }
}

TEST_CASE("BucketSeries keeps per-bucket aggregates and marks gaps empty", "[core][buckets]") {
  BucketSeries b(100, 5);
  CHECK(b.newest_index() == -1);
  CHECK(b.Back(0).index == -1);
  for (int64_t s = 0; s < 200; ++s) b.Add(s, static_cast<double>(s));
  CHECK(b.newest_index() == 1);
  CHECK(b.Back(0).mean() == Approx(149.5));
  CHECK(b.Back(1).mean() == Approx(49.5));
  CHECK(b.Back(1).min == 0);
  CHECK(b.Back(1).max == 99);
  b.Add(450, 7.0);  // buckets 2 and 3 were skipped
  CHECK(b.newest_index() == 4);
  CHECK(b.Back(0).count == 1);
  CHECK(b.Back(1).count == 0);
  CHECK(b.Back(1).index == 3);
  CHECK(b.Back(2).count == 0);
  CHECK(b.Back(3).mean() == Approx(149.5));
  CHECK(b.Back(5).index == -1);  // beyond capacity
  b.Add(2000, 1.0);              // a jump longer than the capacity
  CHECK(b.Back(0).index == 20);
  CHECK(b.Back(4).index == 16);
  CHECK(b.Back(4).count == 0);
}

}  // namespace
}  // namespace trainwatch::core
