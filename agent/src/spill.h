// A bounded on-disk FIFO of serialized records, for when the server stays
// unreachable longer than memory can hold: segment files appended in order,
// read back in order on reconnect, deleted once acknowledged, and the oldest
// segment dropped (and counted) when the bound is reached. Segments left by
// an earlier process for the same run and rank are picked up and drained.
//
// Not thread-safe: the agent's background threads hold a mutex around it.

#ifndef TRAINWATCH_AGENT_SRC_SPILL_H_
#define TRAINWATCH_AGENT_SRC_SPILL_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainwatch::agent {

class SpillStore {
 public:
  // `prefix` names this run and rank's files inside `dir`.
  static absl::StatusOr<std::unique_ptr<SpillStore>> Open(const std::string& dir,
                                                          const std::string& prefix,
                                                          size_t max_bytes,
                                                          size_t segment_bytes = 4u << 20);
  ~SpillStore();

  absl::Status Append(int64_t step, const std::string& bytes);
  // Every record held, oldest first.
  absl::Status ForEach(const std::function<void(int64_t step, const std::string& bytes)>& fn);
  // Deletes the segments whose records are all at or below `step`.
  void DiscardUpTo(int64_t step);

  size_t bytes() const { return total_bytes_; }
  size_t records() const;
  int64_t dropped() const { return dropped_; }

 private:
  struct Segment {
    std::string path;
    size_t bytes = 0;
    size_t records = 0;
    int64_t max_step = -1;
  };
  SpillStore() = default;
  absl::Status Roll();

  std::string dir_, prefix_;
  size_t max_bytes_ = 0, segment_bytes_ = 0;
  std::deque<Segment> segments_;
  FILE* current_ = nullptr;  // appends to segments_.back()
  uint64_t next_seq_ = 0;
  size_t total_bytes_ = 0;
  int64_t dropped_ = 0;
};

}  // namespace trainwatch::agent

#endif  // TRAINWATCH_AGENT_SRC_SPILL_H_
