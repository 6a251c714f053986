#include "trainwatch/agent/agent.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spill.h"
#include "trainwatch/core/version.h"
#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::agent {

namespace v1 = trainwatch::v1;
using core::Signal;

namespace {

constexpr size_t kMaxShards = 32;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One step's record as it crosses from the training thread to the pump:
// plain data, no allocation in the steady state (gathered_shards is filled
// only on a skipped or halted step of a multi-rank run, tensor_report only
// when this rank's gradients held a nonfinite value).
struct Slot {
  enum Kind : uint8_t { kStep, kCheckpoint, kAck } kind = kStep;
  bool rank_scope = false;
  int64_t step = 0;
  double values[core::kNumSignals];
  uint32_t present = 0;
  double loss_ema_ratio = 0;
  uint64_t nonfinite = 0, elements = 0;
  uint8_t decision = 0, tier = 0, rule = 0;
  uint16_t shard_count = 0;
  uint64_t shards[kMaxShards];
  std::vector<uint64_t> gathered_shards;  // every rank's, when not empty
  // This rank's own report naming the tensors that held nonfinite values,
  // serialized, sent right after the step's record. It shares the record's
  // (run, rank, step) acknowledgement, so it must not overtake records of
  // earlier steps: an ack for its step would cover them before they are sent.
  std::string tensor_report;
  int64_t time_ms = 0;
};

// Single-producer single-consumer ring: the training thread pushes, the
// pump pops. Lock-free; full means the newest record is dropped (counted).
class Ring {
 public:
  explicit Ring(size_t capacity) {
    size_t cap = 1;
    while (cap < capacity) cap <<= 1;
    slots_.resize(cap);
    mask_ = cap - 1;
  }
  Slot* BeginPush() {
    const uint64_t head = head_.load(std::memory_order_relaxed);
    if (head - tail_.load(std::memory_order_acquire) > mask_) return nullptr;
    return &slots_[head & mask_];
  }
  void EndPush() { head_.store(head_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  const Slot* Front() {
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail == head_.load(std::memory_order_acquire)) return nullptr;
    return &slots_[tail & mask_];
  }
  void Pop() { tail_.store(tail_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }

 private:
  std::vector<Slot> slots_;
  size_t mask_;
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
};

v1::Rule RuleOf(core::EventKind k) {
  switch (k) {
    case core::EventKind::kDataAnomaly: return v1::RULE_GRAD_NORM_SPIKE;
    case core::EventKind::kLossRatioSkip: return v1::RULE_LOSS_EMA_RATIO_SKIP;
    case core::EventKind::kNonfiniteGradients: return v1::RULE_NONFINITE_GRADIENT;
    case core::EventKind::kNonfiniteValue: return v1::RULE_NONFINITE_METRIC;
    case core::EventKind::kLossExplosion: return v1::RULE_LOSS_ABOVE_LIMIT;
    default: return v1::RULE_UNSPECIFIED;
  }
}

}  // namespace

struct Agent::Impl {
  AgentConfig cfg;
  std::unique_ptr<Reducer> reducer;
  std::unique_ptr<core::RuleEngine> engine;
  // The last reduced records, oldest first from history_head (a circular
  // buffer allocated once): what ResumeFrom() replays into a new engine.
  struct Kept {
    int64_t step = 0;
    uint32_t present = 0;
    double values[core::kNumSignals] = {};
  };
  std::vector<Kept> history;
  size_t history_head = 0, history_count = 0;

  void Keep(const core::StepRecord& rec) {
    if (history.empty()) return;
    const size_t slot = (history_head + history_count) % history.size();
    Kept& k = history[slot];
    k.step = rec.step;
    k.present = rec.present();
    for (int i = 0; i < core::kNumSignals; ++i) k.values[i] = rec.Get(static_cast<Signal>(i));
    if (history_count < history.size()) {
      ++history_count;
    } else {
      history_head = (history_head + 1) % history.size();
    }
  }
  // The checkpoints reported, for a rule engine that starts over.
  std::vector<std::pair<int64_t, std::string>> checkpoints;
  core::StepOutcome outcome;
  Ring ring;
  std::atomic<int64_t> steps{0}, ring_dropped{0}, queued{0};

  std::mutex drain_mu;  // serialises the ring's consumers

  // ---- background state, under mu
  std::mutex mu;
  std::condition_variable pump_cv, writer_cv, flushed_cv;
  struct Entry {
    int64_t step;
    std::string bytes;  // a serialized AgentMessage
    uint64_t sent_gen;  // connection generation it was last sent on
  };
  std::deque<Entry> memory;      // unacknowledged step reports, oldest first
  // Checkpoints and command acks: sent once, not kept, ahead of the records.
  // Never a step report: the server's durable step is a watermark over the
  // records in step order, and a report sent out of order would cover
  // records not yet sent.
  std::deque<std::string> control;
  std::unique_ptr<SpillStore> spill;
  bool spill_resend = false;     // the spill must be re-sent on this connection
  int64_t durable = -1;
  int64_t acked = 0, spilled = 0, dropped = 0, reconnects = 0;
  bool connected = false;
  uint64_t gen = 0;
  bool stop = false;
  std::deque<Command> commands;
  std::function<void(const Command&)> callback;
  std::vector<std::pair<uint64_t, uint64_t>> quarantine;
  // The writer's blocking call, watched by the pump.
  std::atomic<int64_t> write_started_ms{0};
  std::unique_ptr<grpc::ClientContext> ctx;

  std::thread pump, writer;

  Impl(const AgentConfig& c, std::unique_ptr<Reducer> r)
      : cfg(c),
        reducer(std::move(r)),
        engine(std::make_unique<core::RuleEngine>(c.rules)),
        history(c.resume_history_records),
        ring(c.ring_records) {}

  // ------------------------------------------------------------- the pump

  // A failure path, allocation allowed: this rank's own report with the
  // tensors that hold nonfinite values.
  // A step report of this rank's, addressed (run, rank, world, step, scope).
  v1::StepReport* NewStepReport(v1::AgentMessage* m, int64_t step, bool rank_scope) {
    v1::StepReport* r = m->mutable_step_report();
    r->set_run_id(cfg.run_id);
    r->set_rank(reducer->rank());
    r->set_world_size(reducer->world_size());
    r->set_step(step);
    r->set_scope(rank_scope ? v1::REPORT_SCOPE_RANK : v1::REPORT_SCOPE_GLOBAL);
    return r;
  }

  std::string TensorReport(const StepInput& in) {
    v1::AgentMessage m;
    v1::StepReport* r = NewStepReport(&m, in.step, /*rank_scope=*/true);
    r->set_nonfinite_count(static_cast<uint64_t>(in.grad_nonfinite));
    r->set_element_count(static_cast<uint64_t>(in.grad_elements));
    r->mutable_metrics()->set_nan_frac(in.grad_elements > 0
                                           ? static_cast<double>(in.grad_nonfinite) /
                                                 static_cast<double>(in.grad_elements)
                                           : 0.0);
    int kept = 0;
    for (const core::TensorStat& t : in.tensors) {
      if (t.nonfinite <= 0 || kept++ >= 64) continue;
      auto* ts = r->add_tensors();
      ts->set_name(std::string(t.name));
      ts->set_sum_squares(t.sum_squares);
      ts->set_nonfinite_count(static_cast<uint64_t>(t.nonfinite));
      ts->set_element_count(static_cast<uint64_t>(t.elements));
    }
    return m.SerializeAsString();
  }

  std::string Serialize(const Slot& s) {
    v1::AgentMessage m;
    v1::StepReport* r = NewStepReport(&m, s.step, s.rank_scope);
    auto* mt = r->mutable_metrics();
    auto has = [&](Signal sig) { return (s.present & core::Bit(sig)) != 0; };
    auto val = [&](Signal sig) { return s.values[static_cast<int>(sig)]; };
    if (has(Signal::kLoss)) mt->set_loss(val(Signal::kLoss));
    if (has(Signal::kGradNorm)) mt->set_grad_norm(val(Signal::kGradNorm));
    if (has(Signal::kLogZ)) mt->set_log_z(val(Signal::kLogZ));
    if (has(Signal::kNanFrac)) mt->set_nan_frac(val(Signal::kNanFrac));
    if (!std::isnan(s.loss_ema_ratio)) mt->set_loss_ema_ratio(s.loss_ema_ratio);
    if (has(Signal::kLearningRate)) r->set_learning_rate(val(Signal::kLearningRate));
    if (has(Signal::kZLossAlpha)) r->set_z_loss_alpha(val(Signal::kZLossAlpha));
    if (has(Signal::kActivationMax)) r->set_activation_max(val(Signal::kActivationMax));
    if (has(Signal::kAttentionLogitP99)) {
      r->add_attention_logit_p99(val(Signal::kAttentionLogitP99));
    }
    r->set_nonfinite_count(s.nonfinite);
    r->set_element_count(s.elements);
    if (!s.gathered_shards.empty()) {
      for (uint64_t id : s.gathered_shards) r->add_shard_ids(id);
    } else {
      for (uint16_t i = 0; i < s.shard_count; ++i) r->add_shard_ids(s.shards[i]);
    }
    r->set_verdict(s.decision == static_cast<uint8_t>(Decision::kHalt)
                       ? v1::VERDICT_HALT
                   : s.decision == static_cast<uint8_t>(Decision::kSkipUpdate) ? v1::VERDICT_SKIP
                                                                               : v1::VERDICT_CONTINUE);
    r->set_update_skipped(s.decision == static_cast<uint8_t>(Decision::kSkipUpdate));
    if (s.decision != 0) {
      r->set_skip_rule(static_cast<v1::Rule>(s.rule));
      r->set_skip_tier(s.tier == 3 ? v1::TIER_NUMERICAL_FAILURE : v1::TIER_DATA_ANOMALY);
    }
    r->mutable_time()->set_seconds(s.time_ms / 1000);
    r->mutable_time()->set_nanos(static_cast<int32_t>(s.time_ms % 1000) * 1000000);
    return m.SerializeAsString();
  }

  // Moves what the training thread queued into the unacknowledged list,
  // spilling (or dropping) the oldest past the memory bound.
  void Drain() {
    // The ring has one consumer at a time: the pump, or Close()/ResumeFrom()
    // on the training thread.
    std::lock_guard<std::mutex> consumer(drain_mu);
    std::vector<std::pair<int64_t, std::string>> fresh;
    while (const Slot* s = ring.Front()) {
      fresh.emplace_back(s->step, Serialize(*s));
      if (!s->tensor_report.empty()) fresh.emplace_back(s->step, s->tensor_report);
      ring.Pop();
    }
    if (fresh.empty()) return;
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [step, bytes] : fresh) memory.push_back({step, std::move(bytes), 0});
    while (memory.size() > cfg.memory_records) {
      Entry& old = memory.front();
      if (old.step > durable) {
        if (spill != nullptr && spill->Append(old.step, old.bytes).ok()) {
          ++spilled;
          spill_resend = spill_resend || old.sent_gen != gen || !connected;
        } else {
          ++dropped;
        }
      }
      memory.pop_front();
    }
    writer_cv.notify_all();
  }

  void PumpLoop() {
    for (;;) {
      Drain();
      {
        std::unique_lock<std::mutex> lock(mu);
        if (stop) break;
        // A write blocked for long means a server that stopped reading:
        // cancel the call so that the writer reconnects.
        const int64_t started = write_started_ms.load();
        if (started > 0 && NowMs() - started > 3000 && ctx != nullptr) ctx->TryCancel();
        pump_cv.wait_for(lock, std::chrono::milliseconds(5));
      }
    }
    Drain();
  }

  // ----------------------------------------------------------- the writer

  void HandleServerMessage(const v1::ServerMessage& m) {
    if (m.has_durability_ack()) {
      auto it = m.durability_ack().durable_step().find(reducer->rank());
      if (it == m.durability_ack().durable_step().end()) return;
      std::lock_guard<std::mutex> lock(mu);
      if (it->second <= durable) return;
      durable = it->second;
      while (!memory.empty() && memory.front().step <= durable) {
        memory.pop_front();
        ++acked;
      }
      if (spill != nullptr) spill->DiscardUpTo(durable);
      flushed_cv.notify_all();
      return;
    }
    if (m.has_quarantined_shards()) {
      std::lock_guard<std::mutex> lock(mu);
      quarantine.clear();
      for (const auto& r : m.quarantined_shards().shards().ranges()) {
        quarantine.emplace_back(r.first(), r.last());
      }
      for (uint64_t id : m.quarantined_shards().shards().shard_ids()) {
        quarantine.emplace_back(id, id);
      }
      return;
    }
    if (m.has_command()) {
      const v1::Command& c = m.command();
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
        if (p.has_skip_steps()) cmd.skip_steps = {p.skip_steps().first(), p.skip_steps().last()};
        for (const auto& s : p.settings()) {
          if (s.has_z_loss_alpha()) cmd.z_loss_alpha = s.z_loss_alpha();
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
      std::function<void(const Command&)> cb;
      {
        std::lock_guard<std::mutex> lock(mu);
        cb = callback;
        if (!cb) commands.push_back(cmd);
      }
      if (cb) cb(cmd);
    }
  }

  std::shared_ptr<grpc::ChannelCredentials> Credentials() {
    if (cfg.ca_file.empty()) return grpc::InsecureChannelCredentials();
    grpc::SslCredentialsOptions ssl;
    std::ifstream in(cfg.ca_file);
    ssl.pem_root_certs.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return grpc::SslCredentials(ssl);
  }

  v1::AgentMessage HelloMessage() {
    v1::AgentMessage m;
    auto* h = m.mutable_hello();
    h->set_run_id(cfg.run_id);
    h->set_rank(reducer->rank());
    h->set_world_size(reducer->world_size());
    h->set_agent_version(absl::StrCat("trainwatch-agent ", kVersion));
    h->set_host_name(cfg.host_name);
    h->add_capabilities(v1::CAPABILITY_SHARD_IDS);
    h->add_capabilities(v1::CAPABILITY_ROLLBACK);
    h->add_capabilities(v1::CAPABILITY_QUARANTINE);
    return m;
  }

  v1::AgentMessage HeartbeatMessage() {
    v1::AgentMessage m;
    auto* h = m.mutable_heartbeat();
    h->set_run_id(cfg.run_id);
    h->set_rank(reducer->rank());
    const int64_t now = NowMs();
    h->mutable_time()->set_seconds(now / 1000);
    h->set_agent_version(absl::StrCat("trainwatch-agent ", kVersion));
    std::lock_guard<std::mutex> lock(mu);
    h->set_queue_depth(static_cast<uint32_t>(memory.size()));
    h->set_queue_capacity(static_cast<uint32_t>(cfg.memory_records));
    h->set_dropped_total(static_cast<uint64_t>(dropped + ring_dropped.load()));
    h->set_last_step(memory.empty() ? durable : memory.back().step);
    return m;
  }

  void WriterLoop() {
    std::mt19937_64 rng(std::hash<std::string>()(cfg.run_id) + reducer->rank());
    int backoff_ms = cfg.reconnect_initial_ms;
    auto channel = grpc::CreateChannel(cfg.server_address, Credentials());
    auto stub = v1::AgentService::NewStub(channel);
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stop) break;
      }
      // ---- connect
      auto context = std::make_unique<grpc::ClientContext>();
      if (!cfg.token.empty()) context->AddMetadata("authorization", "Bearer " + cfg.token);
      context->set_wait_for_ready(false);
      grpc::ClientContext* c = context.get();
      {
        std::lock_guard<std::mutex> lock(mu);
        ctx = std::move(context);
      }
      auto stream = stub->Stream(c);
      // Watched like every write: a server that accepts and never answers
      // must not hold the writer until the connect timeout.
      write_started_ms = NowMs();
      bool ok = stream->Write(HelloMessage());
      write_started_ms = 0;
      std::thread reader;
      if (ok) {
        {
          std::lock_guard<std::mutex> lock(mu);
          connected = true;
          ++gen;
          spill_resend = spill != nullptr && spill->records() > 0;
        }
        backoff_ms = cfg.reconnect_initial_ms;
        reader = std::thread([&] {
          v1::ServerMessage m;
          while (stream->Read(&m)) HandleServerMessage(m);
          std::lock_guard<std::mutex> lock(mu);
          connected = false;
          writer_cv.notify_all();
        });
      }
      int64_t last_heartbeat = NowMs();
      // ---- send until the connection breaks
      while (ok) {
        std::vector<std::string> batch;
        bool resend_spill = false;
        {
          std::unique_lock<std::mutex> lock(mu);
          writer_cv.wait_for(lock, std::chrono::milliseconds(20), [&] {
            if (stop || !connected || spill_resend || !control.empty()) return true;
            return !memory.empty() && memory.back().sent_gen != gen;
          });
          if (!connected) break;
          if (stop && memory.empty() && control.empty()) break;
          resend_spill = spill_resend;
          spill_resend = false;
          if (resend_spill && spill != nullptr) {
            spill->ForEach([&](int64_t step, const std::string& bytes) {
              if (step > durable) batch.push_back(bytes);
            }).IgnoreError();
          }
          for (Entry& e : memory) {
            if (e.sent_gen != gen) {
              batch.push_back(e.bytes);
              e.sent_gen = gen;
            }
          }
          while (!control.empty()) {
            batch.push_back(std::move(control.front()));
            control.pop_front();
          }
        }
        v1::AgentMessage m;
        for (const std::string& bytes : batch) {
          if (!m.ParseFromString(bytes)) continue;
          write_started_ms = NowMs();
          ok = stream->Write(m);
          write_started_ms = 0;
          if (!ok) break;
        }
        if (ok && NowMs() - last_heartbeat >= cfg.heartbeat_ms) {
          write_started_ms = NowMs();
          ok = stream->Write(HeartbeatMessage());
          write_started_ms = 0;
          last_heartbeat = NowMs();
        }
        bool stopping;
        {
          std::lock_guard<std::mutex> lock(mu);
          stopping = stop && memory.empty() && control.empty();
        }
        if (stopping) break;
      }
      // ---- disconnect: everything unacknowledged goes again next time
      c->TryCancel();
      if (reader.joinable()) reader.join();
      stream->Finish().IgnoreError();
      {
        std::lock_guard<std::mutex> lock(mu);
        connected = false;
        ctx.reset();
        if (stop) break;
        ++reconnects;
      }
      // Exponential backoff with full jitter.
      const int wait = std::uniform_int_distribution<int>(backoff_ms / 2, backoff_ms)(rng);
      backoff_ms = std::min(cfg.reconnect_max_ms, backoff_ms * 2);
      std::unique_lock<std::mutex> lock(mu);
      writer_cv.wait_for(lock, std::chrono::milliseconds(wait), [&] { return stop; });
    }
  }

  // ------------------------------------------------------------ per step

  // The reduced vector layout.
  enum SumIndex {
    kSumSq, kNonfinite, kElements, kHasGrad, kLossSum, kLossCount, kLossNonfinite,
    kLogZSum, kLogZRows, kLogZNonfinite, kNumSums
  };
  enum MaxIndex { kLr, kZLoss, kActMax, kAttnP99, kHasLr, kHasZLoss, kHasAct, kHasAttn, kNumMaxes };

  // Every rank's shard ids (at most kGatherShardsPerRank each), through the
  // reducer's sum: each rank fills its own row of a zero matrix, ids split in
  // 32-bit halves so that doubles carry them exactly. A collective: every
  // rank calls it at the same step.
  static constexpr size_t kGatherShardsPerRank = 16;
  absl::Status GatherShards(absl::Span<const uint64_t> mine, std::vector<uint64_t>* all) {
    const size_t stride = 1 + 2 * kGatherShardsPerRank;
    const int world = reducer->world_size(), rank = reducer->rank();
    if (rank < 0 || rank >= world) return absl::InvalidArgumentError("rank outside world size");
    std::vector<double> sums(static_cast<size_t>(world) * stride, 0.0);
    double maxes[1] = {0.0};
    const size_t n = std::min(mine.size(), kGatherShardsPerRank);
    double* row = sums.data() + static_cast<size_t>(rank) * stride;
    row[0] = static_cast<double>(n);
    for (size_t i = 0; i < n; ++i) {
      row[1 + 2 * i] = static_cast<double>(mine[i] >> 32);
      row[2 + 2 * i] = static_cast<double>(mine[i] & 0xffffffffu);
    }
    if (absl::Status s = reducer->AllReduce(absl::MakeSpan(sums), absl::MakeSpan(maxes));
        !s.ok()) {
      return s;
    }
    all->clear();
    for (int r = 0; r < world; ++r) {
      const double* rr = sums.data() + static_cast<size_t>(r) * stride;
      const size_t count = std::min(kGatherShardsPerRank, static_cast<size_t>(rr[0]));
      for (size_t i = 0; i < count; ++i) {
        all->push_back((static_cast<uint64_t>(rr[1 + 2 * i]) << 32) |
                       static_cast<uint64_t>(rr[2 + 2 * i]));
      }
    }
    std::sort(all->begin(), all->end());
    all->erase(std::unique(all->begin(), all->end()), all->end());
    return absl::OkStatus();
  }

  Verdict Step(const StepInput& in, std::string* error) {
    steps.fetch_add(1, std::memory_order_relaxed);
    double sums[kNumSums] = {};
    double maxes[kNumMaxes];
    std::fill(std::begin(maxes), std::end(maxes), -std::numeric_limits<double>::infinity());
    if (in.grad_sum_squares.has_value()) {
      sums[kSumSq] = *in.grad_sum_squares;
      sums[kHasGrad] = 1;
    }
    sums[kNonfinite] = static_cast<double>(in.grad_nonfinite);
    sums[kElements] = static_cast<double>(in.grad_elements);
    if (in.loss.has_value()) {
      if (std::isfinite(*in.loss)) {
        sums[kLossSum] = *in.loss;
        sums[kLossCount] = 1;
      } else {
        sums[kLossNonfinite] = 1;
      }
    }
    if (in.log_z_rows > 0) {
      if (std::isfinite(in.log_z_sum)) {
        sums[kLogZSum] = in.log_z_sum;
        sums[kLogZRows] = static_cast<double>(in.log_z_rows);
      } else {
        sums[kLogZNonfinite] = 1;
      }
    }
    auto put = [&](const std::optional<double>& v, int idx, int has) {
      if (v.has_value()) {
        maxes[idx] = *v;
        maxes[has] = 1;
      }
    };
    put(in.learning_rate, kLr, kHasLr);
    put(in.z_loss_alpha, kZLoss, kHasZLoss);
    put(in.activation_max, kActMax, kHasAct);
    put(in.attention_logit_p99, kAttnP99, kHasAttn);
    // A max over NaN is not defined the same way by every collective (NCCL's
    // is not): a nonfinite value travels as +inf, still nonfinite, still seen.
    for (double& m : maxes) {
      if (std::isnan(m)) m = std::numeric_limits<double>::infinity();
    }
    const bool local_nonfinite = in.grad_nonfinite > 0;
    if (absl::Status s = reducer->AllReduce(absl::MakeSpan(sums), absl::MakeSpan(maxes));
        !s.ok()) {
      if (error) *error = absl::StrCat("cross-rank reduction failed: ", s.message());
      return Verdict{Decision::kHalt, 3, core::EventKind::kNonfiniteValue};
    }
    core::StepRecord rec;
    rec.step = in.step;
    if (sums[kLossNonfinite] > 0) {
      rec.Set(Signal::kLoss, kNaN);
    } else if (sums[kLossCount] > 0) {
      rec.Set(Signal::kLoss, sums[kLossSum] / sums[kLossCount]);
    }
    if (sums[kHasGrad] > 0) rec.Set(Signal::kGradNorm, std::sqrt(sums[kSumSq]));
    if (sums[kElements] > 0) rec.Set(Signal::kNanFrac, sums[kNonfinite] / sums[kElements]);
    if (sums[kLogZNonfinite] > 0) {
      rec.Set(Signal::kLogZ, kNaN);
    } else if (sums[kLogZRows] > 0) {
      rec.Set(Signal::kLogZ, sums[kLogZSum] / sums[kLogZRows]);
    }
    if (maxes[kHasLr] > 0) rec.Set(Signal::kLearningRate, maxes[kLr]);
    if (maxes[kHasZLoss] > 0) rec.Set(Signal::kZLossAlpha, maxes[kZLoss]);
    if (maxes[kHasAct] > 0) rec.Set(Signal::kActivationMax, maxes[kActMax]);
    if (maxes[kHasAttn] > 0) rec.Set(Signal::kAttentionLogitP99, maxes[kAttnP99]);
    rec.shards = in.shards;
    Keep(rec);
    if (absl::Status s = engine->Observe(rec, &outcome); !s.ok()) {
      if (error) *error = std::string(s.message());
      return Verdict{Decision::kHalt, 3, core::EventKind::kNonfiniteValue};
    }
    // A skipped or halted step: the bad batch may sit on any rank, so rank 0's
    // record carries every rank's shard ids. Every rank reached this same
    // verdict from the same numbers, so every rank joins this second
    // collective, and only on such steps.
    std::vector<uint64_t> gathered;
    if (reducer->world_size() > 1 && outcome.verdict.decision != Decision::kContinue) {
      if (absl::Status s = GatherShards(in.shards, &gathered); !s.ok()) {
        if (error) *error = absl::StrCat("cross-rank shard gather failed: ", s.message());
        return Verdict{Decision::kHalt, 3, core::EventKind::kNonfiniteValue};
      }
    }
    // Rank 0 streams the run's record; the others only what is theirs alone:
    // a nonfinite gradient, which localises the bad device.
    if (!cfg.server_address.empty() && (reducer->rank() == 0 || local_nonfinite)) {
      Slot* slot = ring.BeginPush();
      if (slot == nullptr) {
        ring_dropped.fetch_add(1, std::memory_order_relaxed);
      } else {
        slot->kind = Slot::kStep;
        slot->rank_scope = reducer->rank() != 0;
        slot->step = in.step;
        for (int i = 0; i < core::kNumSignals; ++i) {
          slot->values[i] = rec.Get(static_cast<Signal>(i));
        }
        slot->present = rec.present();
        if (slot->rank_scope) {  // this rank's own gradient counts
          slot->values[static_cast<int>(Signal::kNanFrac)] =
              in.grad_elements > 0 ? static_cast<double>(in.grad_nonfinite) /
                                         static_cast<double>(in.grad_elements)
                                   : 0.0;
        }
        slot->loss_ema_ratio = outcome.loss_ema_ratio;
        slot->nonfinite = static_cast<uint64_t>(slot->rank_scope ? in.grad_nonfinite : sums[kNonfinite]);
        slot->elements = static_cast<uint64_t>(slot->rank_scope ? in.grad_elements : sums[kElements]);
        slot->decision = static_cast<uint8_t>(outcome.verdict.decision);
        slot->tier = static_cast<uint8_t>(outcome.verdict.tier);
        slot->rule = static_cast<uint8_t>(RuleOf(outcome.verdict.rule));
        slot->shard_count = static_cast<uint16_t>(std::min(in.shards.size(), kMaxShards));
        std::copy_n(in.shards.begin(), slot->shard_count, slot->shards);
        slot->gathered_shards.clear();
        if (!slot->rank_scope && !gathered.empty()) slot->gathered_shards = std::move(gathered);
        slot->tensor_report.clear();
        if (local_nonfinite && !in.tensors.empty()) slot->tensor_report = TensorReport(in);
        slot->time_ms = NowMs();
        const bool with_report = !slot->tensor_report.empty();
        ring.EndPush();
        queued.fetch_add(with_report ? 2 : 1, std::memory_order_relaxed);
      }
    }
    return outcome.verdict;
  }
};

// ------------------------------------------------------------------ config

absl::StatusOr<AgentConfig> AgentConfig::FromEnvironment() {
  return FromEnvironment(AgentConfig());
}

absl::StatusOr<AgentConfig> AgentConfig::FromEnvironment(AgentConfig c) {
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  if (const char* v = env("TRAINWATCH_SERVER")) c.server_address = v;
  if (const char* v = env("TRAINWATCH_RUN_ID")) c.run_id = v;
  if (const char* v = env("TRAINWATCH_TOKEN")) c.token = v;
  if (const char* v = env("TRAINWATCH_CA_FILE")) c.ca_file = v;
  if (const char* v = env("TRAINWATCH_SPILL_DIR")) c.spill_dir = v;
  if (const char* v = env("TRAINWATCH_MEMORY_RECORDS")) {
    uint64_t n;
    if (!absl::SimpleAtoi(v, &n) || n == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("TRAINWATCH_MEMORY_RECORDS=", v, " is not a positive integer"));
    }
    c.memory_records = n;
  }
  if (const char* v = env("TRAINWATCH_SPILL_MAX_BYTES")) {
    uint64_t n;
    if (!absl::SimpleAtoi(v, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("TRAINWATCH_SPILL_MAX_BYTES=", v, " is not a byte count"));
    }
    c.spill_max_bytes = n;
  }
  return c;
}

// ------------------------------------------------------------------- Agent

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(const AgentConfig& config,
                                                     std::unique_ptr<Reducer> reducer) {
  if (reducer == nullptr) return absl::InvalidArgumentError("a reducer is required");
  if (absl::Status s = core::Validate(config.rules); !s.ok()) return s;
  if (config.run_id.empty()) return absl::InvalidArgumentError("run_id is empty");
  if (config.memory_records == 0 || config.ring_records == 0) {
    return absl::InvalidArgumentError("memory_records and ring_records must be positive");
  }
  auto impl = std::make_unique<Impl>(config, std::move(reducer));
  if (impl->cfg.host_name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    impl->cfg.host_name = host;
  }
  if (!config.spill_dir.empty()) {
    absl::StatusOr<std::unique_ptr<SpillStore>> spill = SpillStore::Open(
        config.spill_dir,
        absl::StrCat(config.run_id, ".rank", impl->reducer->rank()), config.spill_max_bytes);
    if (!spill.ok()) return spill.status();
    impl->spill = *std::move(spill);
  }
  Impl* p = impl.get();
  if (!config.server_address.empty()) {
    p->pump = std::thread([p] { p->PumpLoop(); });
    p->writer = std::thread([p] { p->WriterLoop(); });
  }
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::~Agent() { Close(0); }

Verdict Agent::Step(const StepInput& input, std::string* error) {
  return impl_->Step(input, error);
}

void Agent::ReportCheckpoint(int64_t step, const std::string& uri) {
  impl_->engine->NoteCheckpoint(step, uri);
  impl_->checkpoints.emplace_back(step, uri);
  if (impl_->checkpoints.size() > 64) impl_->checkpoints.erase(impl_->checkpoints.begin());
  if (impl_->cfg.server_address.empty() || impl_->reducer->rank() != 0) return;
  v1::AgentMessage m;
  auto* c = m.mutable_checkpoint();
  c->set_run_id(impl_->cfg.run_id);
  c->set_rank(impl_->reducer->rank());
  c->set_step(step);
  c->set_uri(uri);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->control.push_back(m.SerializeAsString());
  impl_->writer_cv.notify_all();
}

void Agent::SetCommandCallback(std::function<void(const Command&)> callback) {
  std::deque<Command> pending;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->callback = callback;
    if (callback) pending.swap(impl_->commands);
  }
  for (const Command& c : pending) callback(c);
}

std::optional<Command> Agent::PollCommand() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->commands.empty()) return std::nullopt;
  Command c = std::move(impl_->commands.front());
  impl_->commands.pop_front();
  return c;
}

void Agent::Acknowledge(const std::string& command_id, AckStatus status,
                        const std::string& message, int64_t resumed_step) {
  v1::AgentMessage m;
  auto* a = m.mutable_command_ack();
  a->set_command_id(command_id);
  a->set_run_id(impl_->cfg.run_id);
  a->set_rank(impl_->reducer->rank());
  a->set_status(static_cast<v1::AckStatus>(static_cast<int>(status)));
  a->set_message(message);
  if (resumed_step >= 0) a->set_resumed_step(resumed_step);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->control.push_back(m.SerializeAsString());
  impl_->writer_cv.notify_all();
}

void Agent::ResumeFrom(int64_t step) {
  Impl& p = *impl_;
  p.engine = std::make_unique<core::RuleEngine>(p.cfg.rules);
  for (const auto& [s, uri] : p.checkpoints) {
    if (s <= step) p.engine->NoteCheckpoint(s, uri);
  }
  // Replay the kept records up to the checkpoint; forget the rest. Every
  // rank kept the same reduced records, so every rank rebuilds the same
  // engine.
  size_t kept = 0;
  core::StepOutcome scratch;
  for (size_t i = 0; i < p.history_count; ++i) {
    const Impl::Kept& k = p.history[(p.history_head + i) % p.history.size()];
    if (k.step > step) break;
    core::StepRecord rec;
    rec.step = k.step;
    for (int j = 0; j < core::kNumSignals; ++j) {
      const auto sig = static_cast<Signal>(j);
      if (k.present & core::Bit(sig)) rec.Set(sig, k.values[j]);
    }
    p.engine->Observe(rec, &scratch).IgnoreError();
    ++kept;
  }
  p.history_count = kept;
  // Records still in the ring belong to the abandoned steps too.
  p.Drain();
  std::lock_guard<std::mutex> lock(p.mu);
  while (!p.memory.empty() && p.memory.back().step > step) p.memory.pop_back();
  if (p.spill != nullptr && p.spill->records() > 0) {
    // The spill is a FIFO; keep only what is at or below the checkpoint.
    std::vector<std::pair<int64_t, std::string>> keep;
    p.spill->ForEach([&](int64_t s, const std::string& bytes) {
      if (s <= step) keep.emplace_back(s, bytes);
    }).IgnoreError();
    p.spill->DiscardUpTo(std::numeric_limits<int64_t>::max());
    for (const auto& [s, bytes] : keep) p.spill->Append(s, bytes).IgnoreError();
  }
  if (p.durable > step) p.durable = step;
}

std::vector<std::pair<uint64_t, uint64_t>> Agent::QuarantinedShards() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->quarantine;
}

const core::StepOutcome& Agent::last_outcome() const { return impl_->outcome; }

AgentStats Agent::Stats() const {
  AgentStats s;
  s.steps = impl_->steps.load();
  s.records_queued = impl_->queued.load();
  std::lock_guard<std::mutex> lock(impl_->mu);
  s.records_acked = impl_->acked;
  s.records_spilled = impl_->spilled;
  s.records_dropped = impl_->dropped + impl_->ring_dropped.load() +
                      (impl_->spill ? impl_->spill->dropped() : 0);
  s.reconnects = impl_->reconnects;
  s.durable_step = impl_->durable;
  s.connected = impl_->connected;
  s.unacked = impl_->memory.size() + (impl_->spill ? impl_->spill->records() : 0);
  s.spill_bytes = impl_->spill ? impl_->spill->bytes() : 0;
  return s;
}

void Agent::Close(int timeout_ms) {
  Impl& p = *impl_;
  if (!p.pump.joinable() && !p.writer.joinable()) return;
  p.Drain();
  {
    std::unique_lock<std::mutex> lock(p.mu);
    p.flushed_cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
      return p.memory.empty() && (p.spill == nullptr || p.spill->records() == 0);
    });
    p.stop = true;
    // Unacknowledged records survive in the spill folder for the next run.
    if (p.spill != nullptr) {
      for (const auto& e : p.memory) {
        if (e.step > p.durable) p.spill->Append(e.step, e.bytes).IgnoreError();
      }
      p.memory.clear();
    }
    if (p.ctx != nullptr) p.ctx->TryCancel();
    p.pump_cv.notify_all();
    p.writer_cv.notify_all();
  }
  if (p.pump.joinable()) p.pump.join();
  if (p.writer.joinable()) p.writer.join();
}

}  // namespace trainwatch::agent
