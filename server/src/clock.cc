#include "trainwatch/server/clock.h"

#include <chrono>

namespace trainwatch::server {

namespace {
class WallClock : public Clock {
 public:
  int64_t NowMs() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};
}  // namespace

Clock* SystemClock() {
  static WallClock* clock = new WallClock();
  return clock;
}

}  // namespace trainwatch::server
