// Presentation of a load's result: one JSON object (for scripts) or a short
// aligned text block (for people).

#ifndef TRAINWATCH_BENCH_INGEST_REPORT_H_
#define TRAINWATCH_BENCH_INGEST_REPORT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "load_generator.h"

namespace trainwatch::bench {

// What is known about the server when the generator started it itself.
struct ServerReport {
  bool spawned = false;
  std::string command;
  // VmHWM read just before the server was stopped; -1 when unknown.
  int64_t peak_rss_bytes = -1;
  // What the server handed to write calls during the load (its database,
  // WAL and log; ReadWrittenBytes); -1 when unknown.
  int64_t written_bytes = -1;
  // Empty when the server stopped cleanly on SIGTERM.
  std::string stop_error;
};

// Whether the load passed: every record acknowledged within the limit, no
// stream errors, and a spawned server that stopped cleanly.
bool LoadPassed(const LoadResult& result, const ServerReport& server);

// The JSON string literal for `s`, quotes included.
std::string JsonQuote(absl::string_view s);

// One line, no trailing newline. Times in milliseconds, sizes in bytes; a
// figure that is unknown is null.
std::string FormatJson(const LoadConfig& config, const LoadResult& result,
                       const ServerReport& server);

std::string FormatText(const LoadConfig& config, const LoadResult& result,
                       const ServerReport& server);

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_REPORT_H_
