// What one batch gathers on the writer thread before its commit: the rows
// to write in one transaction, and what may be told only once they are
// durable (acks, server messages, incident changes, decisions' answers,
// streams to end). Every component of ingest adds to it; the Ingestor
// commits it, or forgets it when the store fails.
//
// Writer thread only.

#ifndef TRAINWATCH_SERVER_INGEST_BATCH_H_
#define TRAINWATCH_SERVER_INGEST_BATCH_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ingest/incident_tracker.h"
#include "store/store.h"

namespace trainwatch::server {

struct ApprovalOutcome {
  // OK; FAILED_PRECONDITION when the incident's state refuses the decision
  // (the message says why); NOT_FOUND; INVALID_ARGUMENT.
  absl::Status status;
  std::string decision;  // the serialized trainwatch.v1.Decision
  bool replayed = false;
  IncidentState state = IncidentState::kOpen;
};

struct Batch {
  WriteBatch rows;
  // (stream, run, rank) -> highest step in this batch; looked up by the
  // report's run id as a string_view (std::less<>), so that the id is
  // copied once per key and batch, not once per record.
  std::map<std::tuple<uint64_t, std::string, int32_t>, int64_t, std::less<>> acks;
  int64_t records = 0;  // step reports taken
  std::vector<std::pair<IncidentRow, IncidentChange>> changed_incidents;
  // (run, stream or 0 for all the run's, serialized ServerMessage).
  std::vector<std::tuple<std::string, uint64_t, std::string>> outgoing;
  std::vector<std::pair<uint64_t, absl::Status>> ending;  // streams to end, and why
  std::vector<std::pair<std::function<void(ApprovalOutcome)>, ApprovalOutcome>> answers;
  // Not per batch: ids are unique across runs and batches.
  IdCounters ids;

  // The report's step from `stream` is acknowledged with this batch.
  void Ack(uint64_t stream, const std::string& run_id, int32_t rank, int64_t step);
  // Incident changes are written with this batch and heard after commit.
  IncidentSink sink() { return {&rows, &changed_incidents}; }
  // Nothing to commit and nothing to tell.
  bool empty() const {
    return rows.empty() && acks.empty() && answers.empty() && outgoing.empty() &&
           ending.empty();
  }
  // Forgets everything but the ids (after a commit or a failure).
  void Clear();
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_BATCH_H_
