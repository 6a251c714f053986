// Reading a process's memory and write figures from procfs (Linux only).

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

// Bytes the process has handed to write calls so far ("wchar:" in a
// /proc/<pid>/io file: write, pwrite and their vector forms, to files whether
// or not the bytes have reached a disk yet; gRPC's sendmsg to its sockets is
// not counted). Read twice, it says what a stretch of work wrote.
absl::StatusOr<int64_t> ReadWrittenBytes(const std::string& io_path);
absl::StatusOr<int64_t> ReadWrittenBytesOf(pid_t pid);

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_PROC_STATUS_H_
