// Private: everything between the ring and trainwatchd. The pump thread
// moves the training thread's records out of the ring into the list of
// unacknowledged messages (spilling the oldest to disk past the memory
// bound) and cancels a write that stalls; the writer thread keeps one
// stream to the server, re-sending what is not durable on each new
// connection; a reader per connection takes the server's acks, commands and
// quarantine. The step only ever touches the ring.

#ifndef TRAINWATCH_AGENT_SRC_SENDER_H_
#define TRAINWATCH_AGENT_SRC_SENDER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "liveness.h"
#include "ring.h"
#include "spill.h"
#include "step_message.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/core/clock.h"
#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::agent::internal {

// How long Close() waits for the closing heartbeat to be written.
inline constexpr int kClosingGraceMs = 200;

class Sender {
 public:
  // No server answering for this long is said once, on rank 0 (stderr).
  static constexpr int64_t kUnansweredWarnMs = 30'000;

  // `spill` may be null (no spilling). Sends nothing until Start().
  Sender(const AgentConfig& config, Origin origin, std::unique_ptr<SpillStore> spill);
  ~Sender();  // Close(0)
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  // Starts the pump and the writer. Once.
  void Start();

  // Training thread only (the ring's one producer): the slot to fill, or
  // nullptr when the ring is full (the record is dropped, and counted);
  // then Commit() publishes it.
  Slot* BeginRecord() { return ring_.BeginPush(); }
  void Commit(const Slot* slot);

  // A checkpoint or command ack: sent once, ahead of the records, not kept.
  void SendControl(v1::AgentMessage m) ABSL_LOCKS_EXCLUDED(mu_);

  // Commands: by callback (called on the reader's thread) or by poll; each
  // delivered once either way.
  void SetCommandCallback(std::function<void(const Command&)> callback)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<Command> PollCommand() ABSL_LOCKS_EXCLUDED(mu_);
  // Agent::WaitForServer.
  bool WaitForServer(int timeout_ms) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> QuarantinedShards() const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::string> QuarantinedShardNames() const ABSL_LOCKS_EXCLUDED(mu_);
  bool IsQuarantined(absl::string_view shard_name) const ABSL_LOCKS_EXCLUDED(mu_);

  // A rollback to `step`: the records of later steps, queued or spilled,
  // are never sent. Training thread only.
  void AbandonAfter(int64_t step) ABSL_LOCKS_EXCLUDED(mu_, drain_mu_);

  // The run's rules from the server's answer to a hello (DurabilityAck.
  // rules_json), for an agent without rules of its own: their hash
  // (RulesHash, 0 before any arrived) is read on the step path without a
  // lock; the rules themselves once the ranks agreed on that hash, without
  // a lock too (nullptr before they arrived): the step must never wait for
  // mu_, which a sender thread (SCHED_BATCH, perhaps nicer) may hold while
  // it waits for a core.
  uint32_t server_rules_hash() const {
    return server_rules_hash_.load(std::memory_order_acquire);
  }
  const core::RuleConfig* ServerRules() const {
    return server_rules_hash() != 0 ? &*server_rules_ : nullptr;
  }

  // The transport's part of the agent's statistics (every field but steps).
  void FillStats(AgentStats* s) const ABSL_LOCKS_EXCLUDED(mu_);

  // Waits up to `timeout_ms` for every record to be durable, then stops the
  // threads; what is still unacknowledged goes to the spill folder.
  void Close(int timeout_ms) ABSL_LOCKS_EXCLUDED(mu_, drain_mu_);

  // What the heartbeats say of the training thread.
  Liveness& liveness() { return liveness_; }
  const Liveness& liveness() const { return liveness_; }

 private:
  // What is waiting for the server's durability ack, oldest first.
  // Shared, immutable: the writer takes its batch under the lock by pointer,
  // not by a deep copy, and writes it after.
  using Message = std::shared_ptr<const v1::AgentMessage>;
  struct Entry {
    int64_t step;
    Message message;
    uint64_t sent_gen;  // connection generation it was last sent on
  };

  void Drain() ABSL_LOCKS_EXCLUDED(mu_, drain_mu_);
  void PumpLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  using Stream = grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>;
  // Sends on one connection until it breaks or the sender stops.
  void SendUntilBroken(Stream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // A write, timed for the pump's stall watch. `more`: another write follows
  // at once, so gRPC may buffer this one until then (WriteOptions'
  // buffer_hint); the last write of a burst passes false, which flushes.
  bool Write(Stream* stream, const v1::AgentMessage& m, bool more = false);
  void HandleServerMessage(const v1::ServerMessage& m) ABSL_LOCKS_EXCLUDED(mu_);
  v1::AgentMessage HelloMessage() const;
  v1::AgentMessage HeartbeatMessage() const ABSL_LOCKS_EXCLUDED(mu_);

  const AgentConfig config_;
  const Origin origin_;
  core::Clock* const clock_;
  Liveness liveness_;
  Ring<Slot> ring_;
  // Written by every step: a cache line of its own, since the mutexes that
  // followed it on the same line are taken by the sender's threads all the
  // time, and each step paid for fetching that line back.
  alignas(64) std::atomic<int64_t> queued_{0};
  // The ring has one consumer at a time: the pump, or Close()/AbandonAfter()
  // on the training thread.
  alignas(64) absl::Mutex drain_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  std::deque<Entry> memory_ ABSL_GUARDED_BY(mu_);
  // Checkpoints and command acks. Never a step report: the server's durable
  // step is a watermark over the records in step order, and a report sent
  // out of order would cover records not yet sent.
  std::deque<Message> control_ ABSL_GUARDED_BY(mu_);
  const std::unique_ptr<SpillStore> spill_ ABSL_PT_GUARDED_BY(mu_);
  bool spill_resend_ ABSL_GUARDED_BY(mu_) = false;  // re-send the spill on this connection
  int64_t durable_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t run_last_step_ ABSL_GUARDED_BY(mu_) = -1;  // the hello's answer
  int64_t acked_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t spilled_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reconnects_ ABSL_GUARDED_BY(mu_) = 0;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t gen_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The writer sent its closing heartbeat (Close() lets it before cancelling).
  bool closing_sent_ ABSL_GUARDED_BY(mu_) = false;
  // The server ended the stream with FAILED_PRECONDITION (a newer
  // incarnation of the run took over): the writer stopped for good, and
  // records are no longer kept.
  bool replaced_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Command> commands_ ABSL_GUARDED_BY(mu_);
  std::function<void(const Command&)> callback_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> quarantine_ ABSL_GUARDED_BY(mu_);
  // The first answer to a hello arrived, and the command it said follows
  // (empty: none, or delivered): what WaitForServer() waits for.
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  std::string awaited_command_ ABSL_GUARDED_BY(mu_);
  bool Answered() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || (answered_ && awaited_command_.empty());
  }
  // Written once, under mu_ (the reader of whichever connection got them
  // first), before server_rules_hash_ publishes them, and never again: read
  // without the lock once the hash is there.
  std::optional<core::RuleConfig> server_rules_;
  std::atomic<uint32_t> server_rules_hash_{0};
  // A set, since the loader asks about each name it is about to serve.
  std::set<std::string, std::less<>> quarantine_names_ ABSL_GUARDED_BY(mu_);
  // The writer's blocking call, watched by the pump (0: none in progress).
  std::atomic<int64_t> write_started_ms_{0};
  std::unique_ptr<grpc::ClientContext> ctx_ ABSL_GUARDED_BY(mu_);

  std::thread pump_, writer_;
};

}  // namespace trainwatch::agent::internal

#endif  // TRAINWATCH_AGENT_SRC_SENDER_H_
