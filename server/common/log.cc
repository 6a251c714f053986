#include "common/log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace trainwatch::server::internal {

LogLine::~LogLine() {
  static std::mutex mu;
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() %
      1000);
  std::tm tm;
  gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  const std::string line = stream_.str();
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s.%03dZ %s\n", stamp, ms, line.c_str());
}

}  // namespace trainwatch::server::internal
