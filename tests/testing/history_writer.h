// A stored history for restart tests and the restart bench: `runs` runs of
// `steps` steps each, written straight through the Store API (one
// transaction a run, no gRPC), each step judged by the rule engine as
// trainwatchd would have judged it, and with the engine snapshots
// trainwatchd would have written every `snapshot_steps` steps and at its
// clean shutdown (0: none, as a database from before snapshots).

#ifndef TRAINWATCH_TESTS_TESTING_HISTORY_WRITER_H_
#define TRAINWATCH_TESTS_TESTING_HISTORY_WRITER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "store/store.h"

namespace trainwatch::testing {

struct HistoryShape {
  int runs = 8;
  int64_t steps = 50'000;
  int64_t snapshot_steps = 10'000;
};

// Run ids are "run-0", "run-1", ...
absl::Status WriteHistory(server::Store* store, const HistoryShape& shape);

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_TESTING_HISTORY_WRITER_H_
