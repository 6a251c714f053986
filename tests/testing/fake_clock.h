// A clock that moves only when the test says so. Thread-safe: the code
// under test reads it from its own threads.

#ifndef TRAINWATCH_TESTS_TESTING_FAKE_CLOCK_H_
#define TRAINWATCH_TESTS_TESTING_FAKE_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "trainwatch/core/clock.h"

namespace trainwatch::testing {

class FakeClock final : public core::Clock {
 public:
  // Any fixed start will do; a realistic one keeps stamped times plausible.
  explicit FakeClock(int64_t start_ms = 1'700'000'000'000) : now_ms_(start_ms) {}
  int64_t NowMs() const override { return now_ms_.load(); }
  void AdvanceMs(int64_t ms) { now_ms_.fetch_add(ms); }

 private:
  std::atomic<int64_t> now_ms_;
};

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_TESTING_FAKE_CLOCK_H_
