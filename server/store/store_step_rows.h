// Row code of a run's training history: the runs, steps, rank_steps,
// checkpoints, attempts and incarnations tables. Each function runs on the connection it is given and
// takes no lock: the Store picks the connection and serialises. Private to
// trainwatch::server.

#ifndef TRAINWATCH_SERVER_STORE_STEP_ROWS_H_
#define TRAINWATCH_SERVER_STORE_STEP_ROWS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/store.h"

struct sqlite3;

namespace trainwatch::server::rows {

// runs: one row a run, upserted (created_ms is kept from the first write).
absl::Status UpsertRuns(sqlite3* db, const std::vector<RunRow>& runs);
absl::StatusOr<std::vector<RunRow>> Runs(sqlite3* db);

// steps: a repeated (run, attempt, step) is ignored; the first write wins.
absl::Status InsertSteps(sqlite3* db, const std::vector<WriteBatch::Step>& steps);
// Carries each copy's steps up to its checkpoint into the new attempt, and
// records how the attempt began (attempts).
absl::Status CopyAttempts(sqlite3* db, const std::vector<AttemptCopy>& copies);
// attempts and steps: the run's attempts 0..current with their step ranges.
absl::StatusOr<std::vector<AttemptRow>> Attempts(sqlite3* db, const std::string& run_id,
                                                 int64_t current);

// incarnations: a repeated (run, incarnation) is ignored.
absl::Status InsertIncarnations(sqlite3* db, const std::vector<IncarnationRow>& rows);
absl::StatusOr<std::vector<std::string>> Incarnations(sqlite3* db, const std::string& run_id);
// The attempt's evaluated (not late) steps after `after_step` in step order,
// each with the uri of the checkpoint reported at that step ("" if none).
absl::Status ForEachStep(sqlite3* db, const std::string& run_id, int64_t attempt,
                         const std::function<void(const StepRow&, const std::string&)>& fn,
                         int64_t after_step = -1);
absl::StatusOr<std::vector<StepRow>> RecentSteps(sqlite3* db, const std::string& run_id,
                                                    int64_t attempt, int limit);
absl::StatusOr<std::vector<StepRow>> StepsBetween(sqlite3* db, const std::string& run_id,
                                                     int64_t attempt, int64_t first, int64_t last);
absl::StatusOr<int64_t> CountSteps(sqlite3* db, const std::string& run_id);
// Evaluated (not late) steps of the attempt whose update the rules skipped.
// Both counts read a partial index (migration 10), not the history.
absl::StatusOr<int64_t> CountSkipped(sqlite3* db, const std::string& run_id, int64_t attempt);
// The evaluated steps of the attempt on which the fp16 loss scaler overflowed.
absl::StatusOr<int64_t> CountLossScaleOverflows(sqlite3* db, const std::string& run_id,
                                                int64_t attempt);

// rank_steps: a repeated (run, attempt, step, rank) is ignored.
absl::Status InsertRankSteps(sqlite3* db, const std::vector<RankStepRow>& rows);
absl::StatusOr<std::vector<RankStepRow>> RankStepsAt(sqlite3* db, const std::string& run_id,
                                                     int64_t attempt, int64_t step);
absl::StatusOr<std::vector<RankStepRow>> RankStepsAfter(sqlite3* db, const std::string& run_id,
                                                        int64_t attempt, int64_t step);

// checkpoints: a step's later report replaces the earlier.
absl::Status ReplaceCheckpoints(sqlite3* db, const std::vector<CheckpointRow>& rows);
absl::StatusOr<std::vector<CheckpointRow>> Checkpoints(sqlite3* db, const std::string& run_id);

}  // namespace trainwatch::server::rows

#endif  // TRAINWATCH_SERVER_STORE_STEP_ROWS_H_
