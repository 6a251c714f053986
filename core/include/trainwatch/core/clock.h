// Time as a seam: code that times out, paces or stamps reads a Clock, so
// that a test moves time forward instead of sleeping through it.

#ifndef TRAINWATCH_CORE_CLOCK_H_
#define TRAINWATCH_CORE_CLOCK_H_

#include <chrono>
#include <cstdint>

namespace trainwatch::core {

class Clock {
 public:
  virtual ~Clock();
  // Milliseconds since the Unix epoch.
  virtual int64_t NowMs() const = 0;
};

inline Clock::~Clock() = default;

// The wall clock: record and heartbeat times go to the server as they are.
// Shared, never destroyed, thread-safe.
inline Clock* SystemClock() {
  class System final : public Clock {
   public:
    int64_t NowMs() const override {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    }
  };
  static System* const clock = new System;
  return clock;
}

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_CLOCK_H_
