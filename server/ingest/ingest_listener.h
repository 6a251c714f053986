// What the write path tells the gRPC edge, on the writer thread.

#ifndef TRAINWATCH_SERVER_INGEST_INGEST_LISTENER_H_
#define TRAINWATCH_SERVER_INGEST_INGEST_LISTENER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "ingest/incident_tracker.h"
#include "store/store.h"

namespace trainwatch::server {

// Told about durable steps and incident changes, on the writer thread. An
// implementation must not block.
class IngestListener {
 public:
  virtual ~IngestListener() = default;
  // Every step report from `stream_id` for (run, rank) up to `step` is durable.
  virtual void OnDurable(uint64_t stream_id, const std::string& run_id, int32_t rank,
                         int64_t step) = 0;
  // The batch's OnDurable calls are over (once per committed batch, after
  // them): an implementation may gather them and deliver each stream's acks
  // once, here.
  virtual void OnAcksDone() {}
  virtual void OnIncident(const IncidentRow& incident, IncidentChange change) = 0;
  // A server message (a command, the quarantine list) for every stream of
  // `run_id`, or only for `stream_id` when it is not 0.
  virtual void OnServerMessage(const std::string& run_id, uint64_t stream_id,
                               const std::string& serialized) = 0;
  // The store failed a batch holding messages from `stream_id`: end that
  // stream with `status` (UNAVAILABLE, retryable) so that its agent
  // reconnects and re-sends what was not acknowledged. No ack may reach the
  // stream after this call.
  virtual void OnStreamFailed(uint64_t stream_id, const absl::Status& status) = 0;
  // Whether `stream_id` is still open: a newer incarnation's Hello counts a
  // conflict only for the older one's streams still open (a job that ended
  // and was started again is no conflict). Must not block.
  virtual bool IsStreamOpen(uint64_t /*stream_id*/) { return true; }
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_INGEST_LISTENER_H_
