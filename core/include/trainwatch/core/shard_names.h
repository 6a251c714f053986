// Bounds on shard names, the strings a data loader names its data with
// (a webdataset url, "train-00012-of-01024.parquet:7", an MDS shard). They
// are part of the protocol (agent.proto, StepReport.shard_names), so the
// agent refuses a step past them and the server refuses a message past them
// with the same words: a name is cut nowhere, silently.
//
//   a name: 1 to kMaxShardNameBytes (256) bytes of valid UTF-8 (a proto
//           string); empty names are refused, since they name nothing;
//   a record (one step, one rank, or one shard set): at most
//           kMaxShardNamesPerRecord (1,024) names.
//
// 256 bytes holds any object-store url a loader uses in practice; 1,024
// names is a batch drawn from that many shards, far more than a batch has.
//
// A shard list as an operator types it (twctl rollback approve
// --quarantine-shards): entries separated by ',', each
//   N      digits only: the shard id N;
//   A..B   digits..digits: the ids A to B, A <= B;
//   else   a shard name, e.g. train-00012-of-01024.parquet or a..b.
// '\' takes the next character as it is: "\," is a ',' inside a name and
// "\\" a '\'; an entry with an escaped character is always a name, so
// "\7" is the name "7" and "\1..4" the name "1..4".

#ifndef TRAINWATCH_CORE_SHARD_NAMES_H_
#define TRAINWATCH_CORE_SHARD_NAMES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace trainwatch::core {

inline constexpr size_t kMaxShardNameBytes = 256;
inline constexpr size_t kMaxShardNamesPerRecord = 1024;

// INVALID_ARGUMENT naming `what` (e.g. "step_report") and the bound when
// `count` names are too many for one record.
absl::Status CheckShardNameCount(absl::string_view what, size_t count);
// INVALID_ARGUMENT naming `what` and the bound when `name` is empty or longer
// than kMaxShardNameBytes.
absl::Status CheckShardName(absl::string_view what, absl::string_view name);
// Both: the count, then each name.
absl::Status CheckShardNames(absl::string_view what, absl::Span<const std::string> names);

struct ShardList {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // single ids as N..N
  std::vector<std::string> names;
};

// Reads the list above. INVALID_ARGUMENT naming the entry for an empty list
// or entry, a range with B < A, an id beyond 64 bits, a trailing '\', or a
// name past the bounds.
absl::StatusOr<ShardList> ParseShardList(absl::string_view text);
// `name` as one entry of such a list, escaped so that it reads back as
// the same name.
std::string ShardListEntry(absl::string_view name);

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_SHARD_NAMES_H_
