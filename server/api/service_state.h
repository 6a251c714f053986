// What the gRPC services share: the ingestor, the store, the pager and the
// authenticator, the open agent streams (sessions.h) and the incident
// watchers. It is the ingestor's listener: durable steps become acks on the
// right stream, server messages go to every stream of their run, incident
// changes to the watchers.

#ifndef TRAINWATCH_SERVER_SERVICE_STATE_H_
#define TRAINWATCH_SERVER_SERVICE_STATE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "ingest/ingest.h"
#include "admission/auth.h"
#include "trainwatch/core/clock.h"
#include "pager/pager.h"
#include "store/store.h"
#include "trainwatch/v1/agent.pb.h"
#include "trainwatch/v1/operator.pb.h"
#include "api/sessions.h"
#include "api/standby_reads.h"
#include "api/work_queue.h"

namespace trainwatch::server {

grpc::Status ToGrpc(const absl::Status& s);
// Whether `s` is a standby's refusal (ServiceState::RequireWriter).
bool IsStandbyRefusal(const absl::Status& s);
// The call's "authorization" metadata, empty when absent.
std::string AuthorizationOf(const grpc::CallbackServerContext* ctx);

// A WatchIncidents stream, told of every incident change. Push must not
// block: it runs on the ingest writer.
class IncidentWatcher {
 public:
  virtual ~IncidentWatcher() = default;
  virtual void Push(const IncidentRow& incident,
                    trainwatch::v1::IncidentEventKind kind) = 0;
};

// Everything the services share. Thread-safe.
//
// Who takes the agents' records and the decisions is the writer: the
// ingestor (with its pager) of a single trainwatchd, or of the replica that
// owns the shards. A standby replica has none until it takes over
// (SetWriter, once: a replica that loses its lease exits rather than step
// down); meanwhile it serves the operator's reads from the store
// (standby_reads.h) and answers what only the owner can do with ABORTED,
// naming the owner, on which agents and twctl try their next address.
class ServiceState : public IngestListener {
 public:
  // `writer` and `pager` null for a standby (then SetStandby, before any
  // call is served). `ingest`: the server's ingest options, which a writer
  // runs with (what the summaries read of the rules).
  ServiceState(Ingestor* writer, Store* store, Pager* pager, Authenticator auth, core::Clock* clock,
               std::string grafana_url, IngestOptions ingest = {})
      : writer_(writer),
        pager_(pager),
        store_(store),
        auth_(std::move(auth)),
        clock_(clock),
        grafana_url_(std::move(grafana_url)),
        ingest_(std::move(ingest)) {}

  // Null on a standby.
  Ingestor* writer() const { return writer_.load(std::memory_order_acquire); }
  Pager* pager() const { return pager_.load(std::memory_order_acquire); }
  // A standby taking over: from now on records and decisions go to `writer`.
  void SetWriter(Ingestor* writer, Pager* pager) {
    pager_.store(pager, std::memory_order_release);
    writer_.store(writer, std::memory_order_release);
  }
  // A standby's reads, its name and how to learn the owner's (replicas'
  // names, never alert labels). REQUIRES: `reads` outlives this.
  void SetStandby(const StandbyReads* reads, std::string replica,
                  std::function<std::string()> owner) {
    standby_ = reads;
    replica_ = std::move(replica);
    owner_ = std::move(owner);
  }
  // The runs' views: the writer's, or on a standby the store's.
  const RunViews& views() const;
  // On a standby: ABORTED saying it cannot do `what` and naming the owner
  // (UNAVAILABLE while it is taking over). OK once this replica writes.
  absl::Status RequireWriter(absl::string_view what) const;
  // On a standby: fills `out` (this replica, the owner, as of when) and
  // returns true; false once this replica writes.
  bool DescribeStandby(trainwatch::v1::StandbyAnswer* out) const;

  Store* store() { return store_; }
  const Authenticator& auth() const { return auth_; }
  core::Clock* clock() { return clock_; }
  const std::string& grafana_url() const { return grafana_url_; }
  const IngestOptions& ingest_options() const { return ingest_; }

  // The open agent streams.
  SessionRegistry& sessions() { return sessions_; }

  // IngestListener (writer thread). The writes to the streams these cause
  // (acks, server messages, ends) run on deliveries_, in the order the
  // writer asked for them: gRPC does a write's work (framing, a sendmsg)
  // inline in StartWrite, which on the writer cost as much as the commit
  // itself, one batch's worth of streams at a time, before the next batch
  // could start. OnDurable only notes the step in the stream's session; a
  // batch's acks go to deliveries_ as one task at OnAcksDone (or before
  // whatever is posted next), which writes each stream once: one queue
  // operation and one wake-up per batch instead of one per stream and key.
  void OnDurable(uint64_t stream_id, const std::string& run_id, int32_t rank,
                 int64_t step) override;
  void OnAcksDone() override;
  void OnIncident(const IncidentRow& incident, IncidentChange change) override;
  void OnServerMessage(const std::string& run_id, uint64_t stream_id,
                       const std::string& serialized) override;
  void OnStreamFailed(uint64_t stream_id, const absl::Status& status) override;
  bool IsStreamOpen(uint64_t stream_id) override { return sessions_.IsOpen(stream_id); }

  // Watchers of incident changes.
  void AddWatcher(IncidentWatcher* w) {
    absl::MutexLock lock(&watch_mu_);
    watchers_.insert(w);
  }
  void RemoveWatcher(IncidentWatcher* w) {
    absl::MutexLock lock(&watch_mu_);
    watchers_.erase(w);
  }

  // Store reads of the operator API run here, off gRPC's callback threads
  // (decisions run on the ingest writer).
  WorkQueue* reads() { return &reads_; }

  std::atomic<int64_t> streams_rejected{0};
  // Tasks posted to the delivery thread (acks, server messages, ends).
  int64_t deliveries_posted() const {
    return deliveries_posted_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<Ingestor*> writer_;
  std::atomic<Pager*> pager_;
  Store* store_;
  Authenticator auth_;
  core::Clock* clock_;
  std::string grafana_url_;
  const IngestOptions ingest_;
  const StandbyReads* standby_ = nullptr;
  std::string replica_;
  std::function<std::string()> owner_;
  SessionRegistry sessions_;
  absl::Mutex watch_mu_;
  std::set<IncidentWatcher*> watchers_ ABSL_GUARDED_BY(watch_mu_);
  WorkQueue reads_;
  // Sessions told of durable steps since the last delivery task.
  void PostUndelivered();
  absl::Mutex undelivered_mu_;
  std::vector<std::shared_ptr<Session>> undelivered_ ABSL_GUARDED_BY(undelivered_mu_);
  std::atomic<int64_t> deliveries_posted_{0};
  WorkQueue deliveries_;  // writes to agent streams, in the writer's order
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_SERVICE_STATE_H_
