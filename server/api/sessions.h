// The open agent streams: one Session per stream, shared between its
// reactor and the ingest writer, by stream id.
//
// Thread-safe.

#ifndef TRAINWATCH_SERVER_API_SESSIONS_H_
#define TRAINWATCH_SERVER_API_SESSIONS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::server {

class AgentStream;

// One agent stream's state shared with the writer thread. The reactor stays
// alive while a write is in flight (gRPC calls OnDone only after Finish, and
// Finish waits for the write), which is what makes Deliver() safe.
struct Session {
  absl::Mutex mu;
  AgentStream* reactor ABSL_GUARDED_BY(mu) = nullptr;
  bool done ABSL_GUARDED_BY(mu) = false;
  bool writing ABSL_GUARDED_BY(mu) = false;
  bool finish_pending ABSL_GUARDED_BY(mu) = false;
  grpc::Status finish_status ABSL_GUARDED_BY(mu);
  // Highest durable step per (run, rank) not yet sent: acks coalesce.
  std::map<std::pair<std::string, int32_t>, int64_t> acks ABSL_GUARDED_BY(mu);
  // Commands and quarantine lists, sent before acks, in order.
  std::deque<std::string> outgoing ABSL_GUARDED_BY(mu);
  trainwatch::v1::ServerMessage out ABSL_GUARDED_BY(mu);
  // For run status.
  std::string run_id ABSL_GUARDED_BY(mu);
  int32_t rank ABSL_GUARDED_BY(mu) = -1;
  trainwatch::v1::Hello hello ABSL_GUARDED_BY(mu);
  trainwatch::v1::Heartbeat heartbeat ABSL_GUARDED_BY(mu);
};

class SessionRegistry {
 public:
  // The new session's stream id (from 1).
  uint64_t Register(std::shared_ptr<Session> s);
  void Unregister(uint64_t id);
  // The session of stream `id`, null when it is gone.
  std::shared_ptr<Session> Find(uint64_t id);
  bool IsOpen(uint64_t id);
  // Every session, or only stream `id`'s when it is not 0.
  std::vector<std::shared_ptr<Session>> Sessions(uint64_t id = 0);
  // Per run: connected ranks.
  std::map<std::string, std::set<int32_t>> ConnectedRanks();

 private:
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_API_SESSIONS_H_
