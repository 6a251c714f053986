// Reading a process's memory figures from procfs (Linux only).

#ifndef TRAINWATCH_BENCH_INGEST_PROC_STATUS_H_
#define TRAINWATCH_BENCH_INGEST_PROC_STATUS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace trainwatch::bench {

// Peak resident set size (VmHWM) in bytes, from a /proc/<pid>/status file.
absl::StatusOr<int64_t> ReadPeakRssBytes(const std::string& status_path);

// The same for a live process; its figure must be read before it is reaped.
absl::StatusOr<int64_t> ReadPeakRssBytesOf(pid_t pid);

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_PROC_STATUS_H_
