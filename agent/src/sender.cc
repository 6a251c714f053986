#include "sender.h"

#include <grpcpp/grpcpp.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server_rotation.h"
#include "trainwatch/agent/server_addresses.h"
#include "trainwatch/core/rule_config_hash.h"
#include "trainwatch/core/version.h"
#include "trainwatch/wire/client_tls.h"

namespace trainwatch::agent::internal {

namespace {

Command CommandOf(const v1::Command& c) {
  Command cmd;
  cmd.command_id = c.command_id();
  if (c.has_rollback()) {
    cmd.kind = Command::Kind::kRollback;
    const auto& p = c.rollback();
    cmd.incident_id = p.incident_id();
    cmd.target_step = p.target_step();
    cmd.checkpoint_uri = p.checkpoint_uri();
    for (const auto& r : p.quarantine().ranges()) cmd.quarantine.emplace_back(r.first(), r.last());
    for (uint64_t id : p.quarantine().shard_ids()) cmd.quarantine.emplace_back(id, id);
    cmd.quarantine_names.assign(p.quarantine().names().begin(), p.quarantine().names().end());
    if (p.has_skip_steps()) cmd.skip_steps = {p.skip_steps().first(), p.skip_steps().last()};
    for (const auto& s : p.settings()) {
      if (s.has_z_loss_alpha()) cmd.z_loss_alpha = s.z_loss_alpha();
      if (s.has_lr_scale()) cmd.lr_scale = s.lr_scale();
      if (s.has_layer_precision()) {
        const v1::Precision p = s.layer_precision().precision();
        // The server sends no other (rollback.h); an unknown one reaches the
        // trainer as its enum name, for it to fail the command naming it.
        cmd.precision.emplace_back(s.layer_precision().layer(),
                                   p == v1::PRECISION_FP32   ? "fp32"
                                   : p == v1::PRECISION_BF16 ? "bf16"
                                   : p == v1::PRECISION_FP16 ? "fp16"
                                                             : v1::Precision_Name(p));
      }
    }
  } else if (c.has_halt()) {
    cmd.kind = Command::Kind::kHalt;
    cmd.incident_id = c.halt().incident_id();
    cmd.reason = c.halt().reason();
  } else if (c.has_resume()) {
    cmd.kind = Command::Kind::kResume;
    cmd.incident_id = c.resume().incident_id();
    cmd.reason = c.resume().reason();
  }
  return cmd;
}

}  // namespace

Sender::Sender(const AgentConfig& config, Origin origin, std::unique_ptr<SpillStore> spill)
    : config_(config),
      origin_(std::move(origin)),
      clock_(config.clock != nullptr ? config.clock : core::SystemClock()),
      liveness_(clock_),
      ring_(config.ring_records),
      spill_(std::move(spill)) {}

Sender::~Sender() { Close(0); }

namespace {

// The sender's threads run as SCHED_BATCH: a wake-up of theirs (every 5 ms,
// every ack) never preempts the running thread at once, which on a busy
// machine is the training thread in Step(). And `nicer` than the thread
// that started them (AgentConfig::sender_nice, 0 by default: see there for
// what it costs), so that at the next tick they take the core from it less
// often. Threads they start (the reader, gRPC's own when it starts here)
// inherit both. A refusal (a seccomp filter) leaves the thread as it was:
// it costs latency, not correctness. On Linux both calls change the calling
// thread only.
void YieldToTrainingThread(int nicer) {
  sched_param p{};
  p.sched_priority = 0;
  sched_setscheduler(0, SCHED_BATCH, &p);
  if (nicer <= 0) return;
  errno = 0;
  const int inherited = getpriority(PRIO_PROCESS, 0);
  if (errno != 0) return;
  setpriority(PRIO_PROCESS, 0, std::min(19, inherited + nicer));
}

}  // namespace

void Sender::Start() {
  pump_ = std::thread([this] {
    YieldToTrainingThread(config_.sender_nice);
    PumpLoop();
  });
  writer_ = std::thread([this] {
    YieldToTrainingThread(config_.sender_nice);
    WriterLoop();
  });
}

void Sender::Commit(const Slot* slot) {
  // Read before publishing: from then on the slot is the pump's.
  const int records = slot->tensor_report != nullptr ? 2 : 1;
  ring_.EndPush();
  queued_.fetch_add(records, std::memory_order_relaxed);
}

void Sender::SendControl(v1::AgentMessage m) {
  absl::MutexLock lock(&mu_);
  if (replaced_) return;  // never sent
  control_.push_back(std::make_shared<const v1::AgentMessage>(std::move(m)));
}

void Sender::SetCommandCallback(std::function<void(const Command&)> callback) {
  std::deque<Command> pending;
  {
    absl::MutexLock lock(&mu_);
    callback_ = callback;
    if (callback) pending.swap(commands_);
  }
  for (const Command& c : pending) callback(c);
}

std::optional<Command> Sender::PollCommand() {
  absl::MutexLock lock(&mu_);
  if (commands_.empty()) return std::nullopt;
  Command c = std::move(commands_.front());
  commands_.pop_front();
  return c;
}

bool Sender::WaitForServer(int timeout_ms) {
  if (config_.server_address.empty()) return false;
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &Sender::Answered),
                       absl::Milliseconds(std::max(timeout_ms, 0)));
  return answered_ && awaited_command_.empty();
}

std::vector<std::pair<uint64_t, uint64_t>> Sender::QuarantinedShards() const {
  absl::MutexLock lock(&mu_);
  return quarantine_;
}

std::vector<std::string> Sender::QuarantinedShardNames() const {
  absl::MutexLock lock(&mu_);
  return {quarantine_names_.begin(), quarantine_names_.end()};
}

bool Sender::IsQuarantined(absl::string_view shard_name) const {
  absl::MutexLock lock(&mu_);
  return quarantine_names_.find(shard_name) != quarantine_names_.end();
}

void Sender::AbandonAfter(int64_t step) {
  // Records still in the ring belong to the abandoned steps too.
  Drain();
  absl::MutexLock lock(&mu_);
  while (!memory_.empty() && memory_.back().step > step) memory_.pop_back();
  if (spill_ != nullptr && spill_->records() > 0) {
    // The spill is a FIFO; keep only what is at or below the checkpoint.
    std::vector<std::pair<int64_t, std::string>> keep;
    spill_->ForEach([&](int64_t s, const std::string& bytes) {
      if (s <= step) keep.emplace_back(s, bytes);
    }).IgnoreError();
    spill_->DiscardUpTo(std::numeric_limits<int64_t>::max());
    for (const auto& [s, bytes] : keep) spill_->Append(s, bytes).IgnoreError();
  }
  if (durable_ > step) durable_ = step;
}

void Sender::FillStats(AgentStats* s) const {
  s->records_queued = queued_.load();
  absl::MutexLock lock(&mu_);
  s->records_acked = acked_;
  s->records_spilled = spilled_;
  s->records_dropped = dropped_ + ring_.dropped() + (spill_ ? spill_->dropped() : 0);
  s->reconnects = reconnects_;
  s->durable_step = durable_;
  s->connected = connected_;
  s->unacked = memory_.size() + (spill_ ? spill_->records() : 0);
  s->spill_bytes = spill_ ? spill_->bytes() : 0;
  s->replaced = replaced_;
  s->run_last_step = run_last_step_;
}

void Sender::Close(int timeout_ms) {
  if (!pump_.joinable() && !writer_.joinable()) return;
  Drain();
  std::string warning;
  {
    absl::MutexLock lock(&mu_);
    auto flushed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return replaced_ || (memory_.empty() && (spill_ == nullptr || spill_->records() == 0));
    };
    mu_.AwaitWithTimeout(absl::Condition(&flushed), absl::Milliseconds(timeout_ms));
    stop_ = true;
    // Unacknowledged records survive in the spill folder for the next run.
    if (spill_ != nullptr) {
      for (const Entry& e : memory_) {
        if (e.step > durable_) spill_->Append(e.step, e.message->SerializeAsString()).IgnoreError();
      }
      memory_.clear();
    } else if (!memory_.empty() && !replaced_) {
      // Without a spill folder they are gone with the process: say so, once,
      // with the count, rather than lose them without a word.
      dropped_ += static_cast<int64_t>(memory_.size());
      warning = absl::StrCat(
          "trainwatch agent (run ", origin_.run_id, ", rank ", origin_.rank, "): closing with ",
          memory_.size(), " records not acknowledged by trainwatchd at ",
          config_.server_address, " (steps ", memory_.front().step, "..", memory_.back().step,
          ", last durable step ", durable_,
          "); they are lost. Set TRAINWATCH_SPILL_DIR (AgentConfig::spill_dir) to keep "
          "them for the next start, or give Close() more time.\n");
    }
    // The writer's last heartbeat tells the server that this rank's silence
    // is the end of its job (not a lost rank, nor a stall): a moment for it
    // before the call is cancelled.
    auto said = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closing_sent_ || !connected_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&said), absl::Milliseconds(kClosingGraceMs));
    if (ctx_ != nullptr) ctx_->TryCancel();
  }
  if (pump_.joinable()) pump_.join();
  if (writer_.joinable()) writer_.join();
  if (!warning.empty()) std::fputs(warning.c_str(), stderr);
}

// ------------------------------------------------------------------ pump

// Moves what the training thread queued into the unacknowledged list,
// spilling (or dropping) the oldest past the memory bound.
void Sender::Drain() {
  absl::MutexLock consumer(&drain_mu_);
  std::vector<std::pair<int64_t, Message>> fresh;
  while (Slot* s = ring_.Front()) {
    fresh.emplace_back(s->step, std::make_shared<const v1::AgentMessage>(StepMessage(origin_, *s)));
    if (s->tensor_report != nullptr) fresh.emplace_back(s->step, std::move(s->tensor_report));
    ring_.Pop();
  }
  if (fresh.empty()) return;
  absl::MutexLock lock(&mu_);
  // Replaced by a newer incarnation: nothing will be sent again, and a
  // spill would hand this history to the next launch.
  if (replaced_) return;
  for (auto& [step, m] : fresh) memory_.push_back({step, std::move(m), 0});
  while (memory_.size() > config_.memory_records) {
    const Entry& old = memory_.front();
    if (old.step > durable_) {
      if (spill_ != nullptr && spill_->Append(old.step, old.message->SerializeAsString()).ok()) {
        ++spilled_;
        spill_resend_ = spill_resend_ || old.sent_gen != gen_ || !connected_;
      } else {
        ++dropped_;
      }
    }
    memory_.pop_front();
  }
}

void Sender::PumpLoop() {
  for (;;) {
    Drain();
    absl::MutexLock lock(&mu_);
    if (stop_) break;
    // A write blocked for long means a server that stopped reading: cancel
    // the call so that the writer reconnects.
    const int64_t started = write_started_ms_.load();
    if (started > 0 && clock_->NowMs() - started > config_.stall_timeout_ms &&
        ctx_ != nullptr) {
      ctx_->TryCancel();
    }
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(5));
  }
  Drain();
}

// ---------------------------------------------------------------- writer

void Sender::HandleServerMessage(const v1::ServerMessage& m) {
  if (m.has_durability_ack()) {
    const v1::DurabilityAck& a = m.durability_ack();
    for (const std::string& id : a.undecided_incidents()) {
      std::fprintf(stderr,
                   "trainwatch agent: run %s: tier 3 incident %s still awaits a decision; this "
                   "job trains on without the rollback (twctl incident show %s)\n",
                   origin_.run_id.c_str(), id.c_str(), id.c_str());
    }
    absl::MutexLock lock(&mu_);
    if (!answered_) {
      answered_ = true;
      awaited_command_ = a.pending_command_id();
      if (a.has_run_last_step()) run_last_step_ = a.run_last_step();
    }
    // The first rules the server names are kept: the run's rules are fixed
    // by the server, and a rank that switched must not switch again.
    if (!config_.rules.has_value() && !a.rules_json().empty() && !server_rules_.has_value()) {
      absl::StatusOr<core::RuleConfig> rules =
          core::ParseRuleConfigJson(a.rules_json(), "the server's rules for the run");
      if (rules.ok()) {
        server_rules_ = *rules;
        server_rules_hash_.store(core::RuleConfigHash(*rules), std::memory_order_release);
        if (origin_.rank == 0) {
          std::fprintf(stderr, "trainwatch agent: run %s: the server judges by %s; switching to "
                       "them once every rank has them\n", origin_.run_id.c_str(),
                       a.rules_source().empty() ? "its rules" : a.rules_source().c_str());
        }
      } else {
        std::fprintf(stderr, "trainwatch agent: run %s: ignoring the server's rules: %s\n",
                     origin_.run_id.c_str(), std::string(rules.status().message()).c_str());
      }
    }
    auto it = a.durable_step().find(origin_.rank);
    if (it == a.durable_step().end()) return;
    if (it->second <= durable_) return;
    durable_ = it->second;
    while (!memory_.empty() && memory_.front().step <= durable_) {
      memory_.pop_front();
      ++acked_;
    }
    if (spill_ != nullptr) spill_->DiscardUpTo(durable_);
    return;
  }
  if (m.has_quarantined_shards()) {
    absl::MutexLock lock(&mu_);
    quarantine_.clear();
    for (const auto& r : m.quarantined_shards().shards().ranges()) {
      quarantine_.emplace_back(r.first(), r.last());
    }
    for (uint64_t id : m.quarantined_shards().shards().shard_ids()) {
      quarantine_.emplace_back(id, id);
    }
    quarantine_names_.clear();
    quarantine_names_.insert(m.quarantined_shards().shards().names().begin(),
                             m.quarantined_shards().shards().names().end());
    return;
  }
  if (m.has_command()) {
    const Command cmd = CommandOf(m.command());
    std::function<void(const Command&)> cb;
    {
      absl::MutexLock lock(&mu_);
      cb = callback_;
      if (!cb) commands_.push_back(cmd);
    }
    if (cb) cb(cmd);
    absl::MutexLock lock(&mu_);
    if (cmd.command_id == awaited_command_) awaited_command_.clear();
  }
}

v1::AgentMessage Sender::HelloMessage() const {
  v1::AgentMessage m;
  auto* h = m.mutable_hello();
  h->set_run_id(origin_.run_id);
  h->set_rank(origin_.rank);
  h->set_world_size(origin_.world_size);
  h->set_agent_version(absl::StrCat("trainwatch-agent ", kVersion));
  h->set_host_name(config_.host_name);
  h->add_capabilities(v1::CAPABILITY_SHARD_IDS);
  h->add_capabilities(v1::CAPABILITY_ROLLBACK);
  h->add_capabilities(v1::CAPABILITY_QUARANTINE);
  h->set_incarnation_id(origin_.incarnation);
  if (config_.resume_step) h->set_resume_step(*config_.resume_step);
  h->set_observed(config_.observed);
  h->set_attachment(config_.attachment);
  if (config_.rules.has_value()) h->set_rules_json(core::RuleConfigToJson(*config_.rules));
  return m;
}

v1::AgentMessage Sender::HeartbeatMessage() const {
  v1::AgentMessage m;
  auto* h = m.mutable_heartbeat();
  h->set_run_id(origin_.run_id);
  h->set_rank(origin_.rank);
  h->mutable_time()->set_seconds(clock_->NowMs() / 1000);
  h->set_agent_version(absl::StrCat("trainwatch-agent ", kVersion));
  h->set_host_name(config_.host_name);
  h->set_local_rank(config_.local_rank);
  h->set_device(config_.device);
  h->set_interval_ms(config_.heartbeat_ms);
  if (config_.liveness) {
    liveness_.Fill(h);
  } else {
    h->set_untimed(true);
  }
  absl::MutexLock lock(&mu_);
  h->set_queue_depth(static_cast<uint32_t>(memory_.size()));
  h->set_queue_capacity(static_cast<uint32_t>(config_.memory_records));
  h->set_dropped_total(static_cast<uint64_t>(dropped_ + ring_.dropped()));
  h->set_last_step(memory_.empty() ? durable_ : memory_.back().step);
  return m;
}

bool Sender::Write(Stream* stream, const v1::AgentMessage& m, bool more) {
  write_started_ms_ = clock_->NowMs();
  grpc::WriteOptions options;
  if (more) options.set_buffer_hint();
  const bool ok = stream->Write(m, options);
  write_started_ms_ = 0;
  return ok;
}

namespace {

constexpr int kReplicasMaxBackoffMs = 1'000;

// One channel per address, each with the client keepalive (server_addresses.h).
// A channel dials nothing until the writer streams on it. Its own reconnect
// backoff is held to the agent's: left to gRPC's (1 s growing by 1.6x), a
// standby's address refused a few times while it stood by was dialled again
// only seconds after it began to serve.
std::unique_ptr<v1::AgentService::Stub> StubFor(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& creds,
    int reconnect_initial_ms, int reconnect_max_ms) {
  grpc::ChannelArguments args;
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC reads it as the minimum
  // connect timeout, and 100 ms failed every dial of a loaded machine.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, reconnect_initial_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, reconnect_max_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kClientKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kClientKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  // The stream may go quiet for a heartbeat's interval: keep pinging it.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return v1::AgentService::NewStub(grpc::CreateCustomChannel(address, creds, args));
}

}  // namespace

void Sender::WriterLoop() {
  std::mt19937_64 rng(std::hash<std::string>()(origin_.run_id) + origin_.rank);
  int backoff_ms = config_.reconnect_initial_ms;
  // Agent::Create read these files already; one gone or changed since ends
  // the writer (records wait as for a server that is down) rather than
  // falling back to plaintext, which would send the token in clear.
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      wire::ClientCredentials({config_.ca_file, config_.cert_file, config_.key_file});
  // Create checked the list too; a config built without Create is the one
  // way to get here with a bad one.
  absl::StatusOr<std::vector<std::string>> addresses =
      ParseServerAddresses(config_.server_address);
  if (!creds.ok() || !addresses.ok()) {
    std::fprintf(stderr, "trainwatch agent: not connecting to %s: %s\n",
                 config_.server_address.c_str(),
                 std::string((creds.ok() ? addresses.status() : creds.status()).message()).c_str());
    return;
  }
  ServerRotation rotation(*std::move(addresses));
  // With several replicas, one is expected to serve again within a lease
  // (a standby taking over): a round of them is retried at least every
  // second rather than backing off to reconnect_max_ms.
  const int max_backoff_ms = rotation.addresses().size() > 1
                                 ? std::min(config_.reconnect_max_ms, kReplicasMaxBackoffMs)
                                 : config_.reconnect_max_ms;
  // Since when no server has answered (the start, or the last answer), for
  // the one warning that says where the records go meanwhile.
  int64_t unanswered_since = clock_->NowMs();
  bool warned_unanswered = false;
  std::vector<std::unique_ptr<v1::AgentService::Stub>> stubs;
  for (const std::string& address : rotation.addresses()) {
    stubs.push_back(StubFor(address, *creds, std::min(config_.reconnect_initial_ms, max_backoff_ms),
                            max_backoff_ms));
  }
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
    }
    auto context = std::make_unique<grpc::ClientContext>();
    if (!config_.token.empty()) context->AddMetadata("authorization", "Bearer " + config_.token);
    context->set_wait_for_ready(false);
    grpc::ClientContext* c = context.get();
    {
      absl::MutexLock lock(&mu_);
      ctx_ = std::move(context);
    }
    const std::string address = rotation.address();
    const size_t tried = rotation.index();
    auto stream = stubs[tried]->Stream(c);
    // Watched like every write: a server that accepts and never answers
    // must not hold the writer until the connect timeout.
    std::thread reader;
    // The server ended the call (its status is there for Finish() to read)
    // rather than this side breaking it.
    std::atomic<bool> server_ended{false};
    // The server answered on this stream: it serves the run.
    std::atomic<bool> answered{false};
    if (Write(stream.get(), HelloMessage())) {
      {
        absl::MutexLock lock(&mu_);
        connected_ = true;
        ++gen_;
        spill_resend_ = spill_ != nullptr && spill_->records() > 0;
      }
      reader = std::thread([this, &stream, &server_ended, &answered] {
        v1::ServerMessage m;
        while (stream->Read(&m)) {
          answered = true;
          HandleServerMessage(m);
        }
        server_ended = true;
        absl::MutexLock lock(&mu_);
        connected_ = false;
      });
      SendUntilBroken(stream.get());
    }
    // Disconnected: everything unacknowledged goes again next time.
    // A cancel would hide the server's status (a replaced incarnation's
    // FAILED_PRECONDITION) behind CANCELLED: a write that failed because the
    // server ended the call gives the reader a moment to see the end.
    {
      absl::MutexLock lock(&mu_);
      auto read_end = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !connected_ || stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&read_end), absl::Milliseconds(200));
    }
    if (reader.joinable() && server_ended) {
      reader.join();
    } else {
      c->TryCancel();
      if (reader.joinable()) reader.join();
    }
    const grpc::Status finished = stream->Finish();
    // The call's objects go before its context (ctx_, reset below): gRPC
    // requires the context to outlive the stream, and a stream destroyed
    // after it, at the end of this iteration or at the break that ends the
    // loop on Close(), could touch the freed call.
    stream.reset();
    // A server that answered and then broke off (a restart, a failover) is
    // reconnected to soon; only refusals and failed dials back off further.
    if (answered) backoff_ms = config_.reconnect_initial_ms;
    // A replica that refused the dial gets a fresh channel for the next
    // round: a failed channel waits out gRPC's own reconnect backoff before
    // it dials again, which held agents off a standby for seconds after it
    // began to serve.
    if (!answered && stubs.size() > 1) {
      stubs[tried] = StubFor(address, *creds, std::min(config_.reconnect_initial_ms, max_backoff_ms),
                             max_backoff_ms);
    }
    const ServerRotation::Next next = rotation.StreamEnded(finished.error_code());
    {
      absl::MutexLock lock(&mu_);
      connected_ = false;
      ctx_.reset();
      if (stop_) break;
      // The server's answer to a newer launch of the same run (or to a
      // protocol mistake): retrying cannot change it, so stop streaming
      // rather than reconnect in a loop. The step's local verdicts go on.
      if (next.replaced) {
        replaced_ = true;
        dropped_ += static_cast<int64_t>(memory_.size());
        memory_.clear();
        std::fprintf(stderr,
                     "trainwatch agent (run %s, rank %d): trainwatchd at %s ended the stream "
                     "for good: %s. Not streaming any more; local verdicts go on.\n",
                     origin_.run_id.c_str(), origin_.rank, address.c_str(),
                     finished.error_message().c_str());
        break;
      }
      ++reconnects_;
    }
    // A replica that served the run is gone: say once where the records go
    // now (rank 0 only: a job of thousands of ranks needs one line).
    if (answered && rotation.addresses().size() > 1 && origin_.rank == 0) {
      std::fprintf(stderr,
                   "trainwatch agent (run %s): the stream to trainwatchd at %s ended (%s); "
                   "trying %s, re-sending what was not acknowledged\n",
                   origin_.run_id.c_str(), address.c_str(),
                   finished.ok() ? "closed" : finished.error_message().c_str(),
                   rotation.address().c_str());
    }
    if (answered) {
      unanswered_since = clock_->NowMs();
      warned_unanswered = false;
    } else if (!warned_unanswered && origin_.rank == 0 &&
               clock_->NowMs() - unanswered_since >= kUnansweredWarnMs) {
      warned_unanswered = true;
      std::fprintf(stderr,
                   "trainwatch agent (run %s): no trainwatchd has answered at %s for %lld s; "
                   "verdicts go on locally, and the records wait %s until one answers\n",
                   origin_.run_id.c_str(), config_.server_address.c_str(),
                   static_cast<long long>((clock_->NowMs() - unanswered_since) / 1000),
                   config_.spill_dir.empty()
                       ? absl::StrCat("in memory (the last ", config_.memory_records,
                                      "; older ones are dropped: set TRAINWATCH_SPILL_DIR to "
                                      "keep them on disk)")
                             .c_str()
                       : absl::StrCat("in memory and in ", config_.spill_dir).c_str());
    }
    if (!next.back_off) continue;
    // Exponential backoff with full jitter.
    const int wait = std::uniform_int_distribution<int>(backoff_ms / 2, backoff_ms)(rng);
    backoff_ms = std::min(max_backoff_ms, backoff_ms * 2);
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(wait));
  }
}

void Sender::SendUntilBroken(Stream* stream) {
  int64_t last_heartbeat = clock_->NowMs();
  for (;;) {
    std::vector<Message> batch;
    bool closing = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stop_ || !connected_ || spill_resend_ || !control_.empty()) return true;
        return !memory_.empty() && memory_.back().sent_gen != gen_;
      };
      // Wakes at least every 20 ms for the heartbeat.
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(20));
      if (!connected_) return;
      closing = stop_ && memory_.empty() && control_.empty();
      if (!closing) {
        if (spill_resend_ && spill_ != nullptr) {
          spill_->ForEach([&](int64_t step, const std::string& bytes) {
            auto m = std::make_shared<v1::AgentMessage>();
            if (step > durable_ && m->ParseFromString(bytes)) batch.push_back(std::move(m));
          }).IgnoreError();
        }
        spill_resend_ = false;
        for (Entry& e : memory_) {
          if (e.sent_gen != gen_) {
            batch.push_back(e.message);
            e.sent_gen = gen_;
          }
        }
        while (!control_.empty()) {
          batch.push_back(std::move(control_.front()));
          control_.pop_front();
        }
      }
    }
    if (closing) break;
    // A burst goes out as few frames and syscalls as gRPC can make of it:
    // every write but the burst's last is hinted as one that may wait for
    // the next, and the last flushes them all. A lone record is its burst's
    // last, so it is never held back. What is acknowledged does not change:
    // the server acks what it made durable, whatever the framing.
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!Write(stream, *batch[i], i + 1 < batch.size())) return;
    }
    if (clock_->NowMs() - last_heartbeat >= config_.heartbeat_ms) {
      if (!Write(stream, HeartbeatMessage())) return;
      last_heartbeat = clock_->NowMs();
    }
    absl::MutexLock lock(&mu_);
    if (stop_ && memory_.empty() && control_.empty()) break;
  }
  // Everything is sent: the server hears that this rank's silence from now
  // on is the end of its job, not a lost rank.
  v1::AgentMessage last = HeartbeatMessage();
  last.mutable_heartbeat()->set_closing(true);
  Write(stream, last);
  absl::MutexLock lock(&mu_);
  closing_sent_ = true;
}

}  // namespace trainwatch::agent::internal
