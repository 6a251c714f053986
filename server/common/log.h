// Minimal leveled logging to stderr for trainwatchd (this Abseil release has
// no logging library). One line per statement, written whole under a lock so
// that lines from different threads never interleave. Private to server/.

#ifndef TRAINWATCH_SERVER_SRC_LOG_H_
#define TRAINWATCH_SERVER_SRC_LOG_H_

#include <sstream>

namespace trainwatch::server::internal {

class LogLine {
 public:
  explicit LogLine(char level) { stream_ << level << ' '; }
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace trainwatch::server::internal

#define TW_LOG_INFO ::trainwatch::server::internal::LogLine('I').stream()
#define TW_LOG_WARNING ::trainwatch::server::internal::LogLine('W').stream()
#define TW_LOG_ERROR ::trainwatch::server::internal::LogLine('E').stream()
#define LOG(level) TW_LOG_##level

#endif  // TRAINWATCH_SERVER_SRC_LOG_H_
