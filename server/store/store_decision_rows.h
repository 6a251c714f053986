// Row code of what operators decided and what it set going: the decisions
// (the audit log), commands, command_acks and quarantined_shards tables.
// Each function runs on the connection it is given and takes no lock.
// Private to trainwatch::server.

#ifndef TRAINWATCH_SERVER_STORE_DECISION_ROWS_H_
#define TRAINWATCH_SERVER_STORE_DECISION_ROWS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/store.h"

struct sqlite3;

namespace trainwatch::server::rows {

// decisions: appended; a second decision with the same idempotency key is
// an error (the key is UNIQUE), an empty key is none.
absl::Status InsertDecisions(sqlite3* db, const std::vector<DecisionRow>& decisions);
absl::StatusOr<std::optional<DecisionRow>> FindDecisionByKey(sqlite3* db, const std::string& key);
absl::StatusOr<std::vector<DecisionRow>> DecisionsOfIncident(sqlite3* db, int64_t incident_id);
absl::StatusOr<int64_t> MaxDecisionId(sqlite3* db);

// commands: a repeated id is ignored.
absl::Status InsertCommands(sqlite3* db, const std::vector<CommandRow>& commands);
absl::StatusOr<std::optional<CommandRow>> LatestCommand(sqlite3* db, int64_t incident_id);

// command_acks: a repeated (command, run, rank, status) is ignored. Only
// `run_id`'s acknowledgements of the command are read: a row another run's
// agent wrote under the same id is never counted.
absl::Status InsertCommandAcks(sqlite3* db, const std::vector<CommandAckRow>& acks);
absl::StatusOr<std::vector<CommandAckRow>> CommandAcks(sqlite3* db, const std::string& run_id,
                                                       const std::string& command_id);

// quarantined_shards: appended.
absl::Status InsertQuarantines(sqlite3* db, const std::vector<QuarantineRow>& quarantines);
absl::StatusOr<std::vector<QuarantineRow>> Quarantines(sqlite3* db, const std::string& run_id);

}  // namespace trainwatch::server::rows

#endif  // TRAINWATCH_SERVER_STORE_DECISION_ROWS_H_
