// Time reaches server logic only through this interface, so that tests can
// drive aggregation timeouts and retries with a fake clock.

#ifndef TRAINWATCH_SERVER_CLOCK_H_
#define TRAINWATCH_SERVER_CLOCK_H_

#include <atomic>
#include <cstdint>

namespace trainwatch::server {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds since the Unix epoch.
  virtual int64_t NowMs() const = 0;
};

// The wall clock. Never deleted.
Clock* SystemClock();

// A clock that moves only when told. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'700'000'000'000) : now_(start_ms) {}
  int64_t NowMs() const override { return now_.load(); }
  void AdvanceMs(int64_t ms) { now_.fetch_add(ms); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_CLOCK_H_
