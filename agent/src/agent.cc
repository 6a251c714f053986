#include "trainwatch/agent/agent.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "announce.h"
#include "reduction_layout.h"
#include "run_identity.h"
#include "sender.h"
#include "spill.h"
#include "step_message.h"
#include "trainwatch/agent/server_addresses.h"
#include "trainwatch/core/file_system.h"
#include "trainwatch/core/rule_config_hash.h"
#include "trainwatch/v1/agent.pb.h"
#include "trainwatch/wire/client_tls.h"
#include "trainwatch/wire/run_id.h"

namespace trainwatch::agent {

namespace v1 = trainwatch::v1;

// A NaN or inf scale is the scaler's failure: reported and judged
// (numerical_rule.cc), not refused.
absl::Status CheckLossScale(const StepInput& in) {
  if (in.loss_scale.has_value() && *in.loss_scale <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", in.step, ": loss_scale ", *in.loss_scale, " is not > 0"));
  }
  if (in.loss_scale_overflow && !in.loss_scale.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", in.step, ": loss_scale_overflow is set without a loss_scale"));
  }
  return absl::OkStatus();
}

using core::Signal;
using internal::Sender;
using internal::Slot;

// The step logic: the reduction, the local rule engine and what ResumeFrom()
// needs to rebuild it; the transport is the sender's.
class Agent::Impl {
 public:
  Impl(const AgentConfig& config, std::unique_ptr<Reducer> reducer,
       std::unique_ptr<SpillStore> spill, std::string incarnation)
      : config_(config),
        reducer_(std::move(reducer)),
        origin_{config.run_id, reducer_->rank(), reducer_->world_size(), std::move(incarnation)},
        rules_(config.rules.value_or(core::RuleConfig())),
        engine_(std::make_unique<core::RuleEngine>(rules_)),
        history_(config.resume_history_records),
        sender_(config, origin_, std::move(spill)) {
    if (!config_.server_address.empty()) sender_.Start();
  }

  absl::StatusOr<Verdict> Step(const StepInput& in);
  absl::Status StepObserved(const core::StepRecord& rec);
  void ReportCheckpoint(int64_t step, const std::string& uri);
  void Acknowledge(const std::string& command_id, AckStatus status, const std::string& message,
                   int64_t resumed_step);
  void ResumeFrom(int64_t step);
  AgentStats Stats() const {
    AgentStats s;
    sender_.FillStats(&s);
    s.steps = steps_.load();
    s.streaming = !config_.server_address.empty();
    s.server_rules_from_step = server_rules_from_.load();
    return s;
  }
  const core::StepOutcome& outcome() const { return outcome_; }
  const core::StepValues& values() const { return values_; }
  const std::string& run_id() const { return config_.run_id; }
  Sender& sender() { return sender_; }

 private:
  // The last reduced records, oldest first from history_head_ (a circular
  // buffer allocated once): what ResumeFrom() replays into a new engine.
  void Keep(const core::StepRecord& rec) {
    if (history_.empty()) return;
    history_[(history_head_ + history_count_) % history_.size()] =
        core::StepRecord(rec.step, rec);  // the values only: the spans die with the step
    if (history_count_ < history_.size()) {
      ++history_count_;
    } else {
      history_head_ = (history_head_ + 1) % history_.size();
    }
  }
  // The engine rebuilt by `rules` from the kept records up to `step`.
  std::unique_ptr<core::RuleEngine> Rebuild(const core::RuleConfig& rules, int64_t step);
  // Every rank's shard ids; a collective.
  absl::Status GatherShards(absl::Span<const uint64_t> mine, std::vector<uint64_t>* all);
  // Hands the step's record to the sender (rank 0: the run's; another rank:
  // its own nonfinite gradient).
  void Queue(const StepInput& in, const core::StepRecord& rec,
             const internal::StepReduction& reduced, std::vector<uint64_t> gathered);
  // The line a skip prints on rank 0 (stderr).
  // Rank 0's lines in the trainer's output (announce.h).
  void Announce(int64_t step);

  const AgentConfig config_;
  const std::unique_ptr<Reducer> reducer_;
  const internal::Origin origin_;
  // What the engine judges by: the job's own, the defaults, or, from
  // server_rules_from_, the server's (AgentConfig::rules).
  core::RuleConfig rules_;
  uint32_t rules_hash_ = core::RuleConfigHash(rules_);  // told with each record
  std::atomic<int64_t> server_rules_from_{-1};
  std::unique_ptr<core::RuleEngine> engine_;
  std::vector<core::StepRecord> history_;
  size_t history_head_ = 0, history_count_ = 0;
  // The checkpoints reported, for a rule engine that starts over.
  std::vector<std::pair<int64_t, std::string>> checkpoints_;
  core::StepOutcome outcome_;
  core::StepValues values_;  // the last reduced record, for last_values()
  int64_t values_step_ = -1;  // its step, for StepObserved()'s order check
  std::atomic<int64_t> steps_{0};
  bool warm_up_announced_ = false, warming_up_ = true;
  uint32_t announced_rules_ = 0;  // the hash of the rules the last line named
  Sender sender_;
};

absl::Status Agent::Impl::GatherShards(absl::Span<const uint64_t> mine,
                                       std::vector<uint64_t>* all) {
  const int world = reducer_->world_size(), rank = reducer_->rank();
  if (rank < 0 || rank >= world) return absl::InvalidArgumentError("rank outside world size");
  internal::ShardGather gather(rank, world, mine);
  if (absl::Status s = reducer_->AllReduce(gather.sums(), gather.maxes()); !s.ok()) return s;
  *all = gather.Ids();
  return absl::OkStatus();
}

absl::StatusOr<Verdict> Agent::Impl::Step(const StepInput& in) {
  // Checked first, so that nothing is reduced or queued for a step refused.
  if (absl::Status s = core::CheckShardNames("step", in.shard_names); !s.ok()) return s;
  if (absl::Status s = CheckGradLayout(in, reducer_->world_size()); !s.ok()) return s;
  if (absl::Status s = CheckLossScale(in); !s.ok()) return s;
  steps_.fetch_add(1, std::memory_order_relaxed);
  internal::StepReduction reduced(in);
  // Without rules of its own, a streaming agent says whether it holds the
  // server's, so that every rank switches to them at the same step.
  const bool awaits_rules = !config_.rules.has_value() && server_rules_from_.load() < 0 &&
                            !config_.server_address.empty();
  if (awaits_rules) reduced.SetRulesHash(sender_.server_rules_hash());
  if (config_.liveness) sender_.liveness().InReduction(true);
  absl::Status reduce = reducer_->AllReduce(reduced.sums(), reduced.maxes());
  if (config_.liveness) sender_.liveness().InReduction(false);
  if (!reduce.ok()) {
    return absl::Status(reduce.code(),
                        absl::StrCat("cross-rank reduction failed: ", reduce.message()));
  }
  values_ = reduced.Values();
  if (const uint32_t agreed = reduced.AgreedRulesHash(); awaits_rules && agreed != 0) {
    // Every rank holds rules of this hash: the same rules, taken at the same
    // step, before this step is judged. The engine is rebuilt from the
    // steps before this one, as the server judged them.
    const core::RuleConfig* server = sender_.ServerRules();
    if (server != nullptr && core::RuleConfigHash(*server) == agreed) {
      rules_ = *server;
      rules_hash_ = agreed;
      engine_ = Rebuild(rules_, in.step - 1);
      server_rules_from_.store(in.step);
    }
  }
  core::StepRecord rec(in.step, values_);
  rec.shards = in.shards;
  rec.shard_names = in.shard_names;
  Keep(rec);
  if (absl::Status s = engine_->Judge(rec, &outcome_); !s.ok()) return s;
  if (origin_.rank == 0) Announce(in.step);
  // A skipped or halted step: the bad batch may sit on any rank, so rank 0's
  // record carries every rank's shard ids. Every rank reached this same
  // verdict from the same numbers, so every rank joins this second
  // collective, and only on such steps.
  std::vector<uint64_t> gathered;
  if (reducer_->world_size() > 1 && outcome_.verdict.decision != Decision::kContinue) {
    if (absl::Status s = GatherShards(in.shards, &gathered); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("cross-rank shard gather failed: ", s.message()));
    }
  }
  // Rank 0 streams the run's record; the others only what is theirs alone:
  // a nonfinite gradient, which localises the bad device.
  if (!config_.server_address.empty() && (origin_.rank == 0 || reduced.local_nonfinite() > 0)) {
    Queue(in, rec, reduced, std::move(gathered));
  }
  if (config_.liveness) sender_.liveness().StepDone(in.step);
  return outcome_.verdict;
}

void Agent::Impl::Announce(int64_t step) {
  // At the first step, and again when trainwatchd's rules replace the
  // defaults (every rank at the same step).
  if (announced_rules_ != rules_hash_ || !warm_up_announced_) {
    const char* source = config_.rules.has_value()        ? "the job's own"
                         : server_rules_from_.load() >= 0   ? "trainwatchd's"
                         : config_.server_address.empty()  ? "the defaults"
                                                           : "the defaults, until trainwatchd's arrive";
    std::fputs(internal::WarmUpLine(rules_, source, engine_->first_step(), outcome_.warming_up)
                   .c_str(),
               stderr);
    warm_up_announced_ = true;
    announced_rules_ = rules_hash_;
  } else if (warming_up_ && !outcome_.warming_up) {
    std::fputs(internal::WarmUpOverLine(step).c_str(), stderr);
  }
  warming_up_ = outcome_.warming_up;
  if (outcome_.events.empty() && outcome_.verdict.decision == Decision::kContinue) return;
  std::fputs(internal::OutcomeLines(step, outcome_, config_.observed).c_str(), stderr);
}

void Agent::Impl::Queue(const StepInput& in, const core::StepRecord& rec,
                        const internal::StepReduction& reduced, std::vector<uint64_t> gathered) {
  Slot* slot = sender_.BeginRecord();
  if (slot == nullptr) return;  // the ring is full: dropped, and counted
  slot->rank_scope = origin_.rank != 0;
  static_cast<core::Step&>(*slot) = rec;
  if (slot->rank_scope && slot->Has(Signal::kNanFrac)) {  // this rank's own gradient
    slot->Set(Signal::kNanFrac, reduced.local_elements() > 0
                                    ? static_cast<double>(reduced.local_nonfinite()) /
                                          static_cast<double>(reduced.local_elements())
                                    : 0.0);
  }
  slot->loss_ema_ratio = outcome_.loss_ema_ratio;
  slot->nonfinite = slot->rank_scope ? static_cast<uint64_t>(reduced.local_nonfinite())
                                     : reduced.nonfinite();
  slot->elements = slot->rank_scope ? static_cast<uint64_t>(reduced.local_elements())
                                    : reduced.elements();
  slot->decided = true;
  slot->verdict = outcome_.verdict;
  // An observed agent judges but does not act: its skip is recommended, never
  // claimed as done.
  slot->update_skipped = outcome_.verdict.decision == Decision::kSkipUpdate && !config_.observed;
  slot->verdict_event.reset();
  if (outcome_.verdict.decision != Decision::kContinue) {
    for (const core::Event& e : outcome_.events) {
      if (e.kind == outcome_.verdict.rule) slot->verdict_event = e;
    }
  }
  slot->rules_hash = rules_hash_;
  slot->shard_count = static_cast<uint16_t>(std::min(in.shards.size(), Slot::kMaxShards));
  std::copy_n(in.shards.begin(), slot->shard_count, slot->shards);
  slot->shard_names.assign(in.shard_names.begin(), in.shard_names.end());
  slot->gathered_shards.clear();
  if (!slot->rank_scope && !gathered.empty()) slot->gathered_shards = std::move(gathered);
  slot->tensor_report.reset();
  if (reduced.local_nonfinite() > 0 && !in.tensors.empty()) {
    slot->tensor_report = internal::TensorReportMessage(origin_, in, reduced.local_nonfinite(),
                                                        reduced.local_elements());
  }
  slot->time_ms = config_.clock->NowMs();
  sender_.Commit(slot);
}

absl::Status Agent::Impl::StepObserved(const core::StepRecord& rec) {
  if (!config_.observed) {
    return absl::FailedPreconditionError(
        "StepObserved() needs an agent created with observed = true");
  }
  if (steps_.load() > 0 && rec.step <= values_step_) {
    return absl::InvalidArgumentError(absl::StrCat("step ", rec.step, " is not above step ",
                                                   values_step_, ", the last observed"));
  }
  steps_.fetch_add(1, std::memory_order_relaxed);
  values_step_ = rec.step;
  values_ = rec;
  Keep(rec);
  // No local engine: nothing here could act on its verdict (the job is not
  // this process), and trainwatchd judges the run with the rules it was
  // announced, deriving loss_ema_ratio there. One engine, one verdict.
  if (config_.server_address.empty()) return absl::OkStatus();
  Slot* slot = sender_.BeginRecord();
  if (slot == nullptr) return absl::OkStatus();  // the ring is full: dropped, and counted
  slot->rank_scope = false;
  static_cast<core::Step&>(*slot) = rec;
  slot->loss_ema_ratio = std::numeric_limits<double>::quiet_NaN();  // the server's to derive
  slot->nonfinite = 0;  // a log gives nan_frac, never the counts behind it
  slot->elements = 0;
  slot->decided = false;  // a log's numbers: no agent decided (nor skipped, nor halted)
  slot->verdict = Verdict();
  slot->update_skipped = false;
  slot->shard_count = static_cast<uint16_t>(std::min(rec.shards.size(), Slot::kMaxShards));
  std::copy_n(rec.shards.begin(), slot->shard_count, slot->shards);
  slot->shard_names.assign(rec.shard_names.begin(), rec.shard_names.end());
  slot->gathered_shards.clear();
  slot->tensor_report.reset();
  slot->time_ms = config_.clock->NowMs();
  sender_.Commit(slot);
  sender_.liveness().LogStep(rec.step);
  return absl::OkStatus();
}

void Agent::Impl::ReportCheckpoint(int64_t step, const std::string& uri) {
  engine_->NoteCheckpoint(step, uri);
  checkpoints_.emplace_back(step, uri);
  if (checkpoints_.size() > 64) checkpoints_.erase(checkpoints_.begin());
  if (config_.server_address.empty() || origin_.rank != 0) return;
  v1::AgentMessage m;
  auto* c = m.mutable_checkpoint();
  c->set_run_id(origin_.run_id);
  c->set_rank(origin_.rank);
  c->set_step(step);
  c->set_uri(uri);
  sender_.SendControl(std::move(m));
}

void Agent::Impl::Acknowledge(const std::string& command_id, AckStatus status,
                              const std::string& message, int64_t resumed_step) {
  v1::AgentMessage m;
  auto* a = m.mutable_command_ack();
  a->set_command_id(command_id);
  a->set_run_id(origin_.run_id);
  a->set_rank(origin_.rank);
  a->set_status(static_cast<v1::AckStatus>(static_cast<int>(status)));
  a->set_message(message);
  if (resumed_step >= 0) a->set_resumed_step(resumed_step);
  sender_.SendControl(std::move(m));
}

std::unique_ptr<core::RuleEngine> Agent::Impl::Rebuild(const core::RuleConfig& rules,
                                                       int64_t step) {
  core::EngineRebuilder rebuild(rules, step);
  for (const auto& [s, uri] : checkpoints_) rebuild.NoteCheckpoint(s, uri);
  for (size_t i = 0; i < history_count_; ++i) {
    const core::StepRecord& rec = history_[(history_head_ + i) % history_.size()];
    if (rec.step > step) break;
    rebuild.Feed(rec);
  }
  return std::move(rebuild).Finish();
}

void Agent::Impl::ResumeFrom(int64_t step) {
  // Replay the kept records up to the checkpoint; forget the rest. Every
  // rank kept the same reduced records, so every rank rebuilds the same
  // engine.
  engine_ = Rebuild(rules_, step);
  size_t kept = 0;
  while (kept < history_count_ && history_[(history_head_ + kept) % history_.size()].step <= step) {
    ++kept;
  }
  history_count_ = kept;
  sender_.AbandonAfter(step);
}

namespace {

// This launch's id, the same on every rank: rank 0 draws 64 random bits and
// the others learn them from one sum in which only rank 0 contributes, as
// two 32-bit halves (a double holds each exactly). A collective: every rank
// calls it once, at Create.
absl::StatusOr<std::string> AgreeIncarnation(Reducer& reducer) {
  double halves[2] = {0.0, 0.0};
  if (reducer.rank() == 0) {
    std::random_device rd;
    halves[0] = static_cast<double>(rd());
    halves[1] = static_cast<double>(rd());
  }
  if (absl::Status s = reducer.AllReduce(absl::MakeSpan(halves), {}); !s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("agreeing the incarnation id across ranks: ", s.message()));
  }
  const uint64_t id = (static_cast<uint64_t>(halves[0]) << 32) |
                      (static_cast<uint64_t>(halves[1]) & 0xffffffffu);
  return absl::StrCat(absl::Hex(id, absl::kZeroPad16));
}

}  // namespace

// ------------------------------------------------------------------ config

namespace {

// TRAINWATCH_RULES: inline JSON when it starts with '{' (a path never needs
// to), else a file holding the JSON. Every error names the variable (the
// parser also validates, naming its source), so a job launched with a typo
// stops at Create with the place to look.
absl::StatusOr<core::RuleConfig> RulesFromEnvironment(absl::string_view value) {
  const absl::string_view json = absl::StripLeadingAsciiWhitespace(value);
  if (absl::StartsWith(json, "{")) return core::ParseRuleConfigJson(json, "TRAINWATCH_RULES");
  const std::string path(value);
  absl::StatusOr<std::string> text = core::LocalFileSystem().ReadFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("TRAINWATCH_RULES: ", text.status().message()));
  }
  return core::ParseRuleConfigJson(*text, absl::StrCat("TRAINWATCH_RULES file ", path));
}

}  // namespace

absl::StatusOr<AgentConfig> AgentConfig::FromEnvironment() {
  return FromEnvironment(AgentConfig());
}

absl::StatusOr<AgentConfig> AgentConfig::FromEnvironment(AgentConfig c) {
  auto env = [](const char* name) -> const char* {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  if (const char* v = env("TRAINWATCH_SERVER")) {
    // Checked here too, so that the error names the variable to fix.
    if (absl::Status s = ParseServerAddresses(v).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("TRAINWATCH_SERVER: ", s.message()));
    }
    c.server_address = v;
  }
  if (const char* v = env("TRAINWATCH_RUN_ID")) c.run_id = v;
  if (const char* v = env("TRAINWATCH_TOKEN")) c.token = v;
  // The TLS files, read where twctl reads them too.
  const wire::ClientTlsFiles tls = wire::TlsFilesFromEnvironment();
  if (!tls.ca_file.empty()) c.ca_file = tls.ca_file;
  if (!tls.cert_file.empty()) c.cert_file = tls.cert_file;
  if (!tls.key_file.empty()) c.key_file = tls.key_file;
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
  if (const char* v = env("TRAINWATCH_SENDER_NICE")) {
    int n;
    if (!absl::SimpleAtoi(v, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("TRAINWATCH_SENDER_NICE=", v, " is not an integer (0..19)"));
    }
    c.sender_nice = n;  // its range is Create's to check, as for a config's
  }
  if (const char* v = env("TRAINWATCH_HEARTBEAT_MS")) {
    int n;
    if (!absl::SimpleAtoi(v, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("TRAINWATCH_HEARTBEAT_MS=", v, " is not a number of milliseconds"));
    }
    c.heartbeat_ms = n;  // its range is Create's to check
  }
  if (const char* v = env("TRAINWATCH_LIVENESS")) {
    const std::string s(v);
    if (s != "0" && s != "1") {
      return absl::InvalidArgumentError(
          absl::StrCat("TRAINWATCH_LIVENESS=", s, " is not 0 or 1"));
    }
    c.liveness = s == "1";
  }
  if (const char* v = env("LOCAL_RANK")) {
    int n;
    if (absl::SimpleAtoi(v, &n) && n >= 0) c.local_rank = n;
  }
  if (const char* v = env("TRAINWATCH_RULES")) {
    absl::StatusOr<core::RuleConfig> rules = RulesFromEnvironment(v);
    if (!rules.ok()) return rules.status();
    c.rules = *std::move(rules);
  }
  return c;
}

// ------------------------------------------------------------------- Agent

namespace {

// Fills an empty run id from the launcher, for an agent with a server, or
// leaves the agent without one (so nothing streams) when no launcher names
// the job. Rank 0 says on stderr which it did: every rank reads the same
// launcher variables, and a job of thousands of ranks needs one line, not
// thousands. A given id is only checked.
absl::Status ResolveRunId(AgentConfig* cfg, int rank) {
  if (!cfg->run_id.empty()) {
    absl::Status s = wire::CheckRunId(cfg->run_id);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("AgentConfig: ", s.message()));
    return absl::OkStatus();
  }
  if (cfg->server_address.empty()) return absl::OkStatus();  // local only: no name needed
  absl::StatusOr<std::optional<internal::LauncherRunId>> launcher =
      internal::RunIdFromLauncher([](const char* name) { return std::getenv(name); });
  if (!launcher.ok()) return launcher.status();
  if (launcher->has_value()) {
    cfg->run_id = (*launcher)->id;
    if (rank == 0) std::fprintf(stderr, "%s\n", (*launcher)->note.c_str());
    return absl::OkStatus();
  }
  if (rank == 0) {
    std::fprintf(stderr, "%s\n", internal::NoRunIdMessage(cfg->server_address).c_str());
  }
  cfg->server_address.clear();  // every send path checks it: nothing streams
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(const AgentConfig& config,
                                                     std::unique_ptr<Reducer> reducer) {
  if (reducer == nullptr) return absl::InvalidArgumentError("a reducer is required");
  if (config.rules.has_value()) {
    if (absl::Status s = core::Validate(*config.rules); !s.ok()) return s;
  }
  if (config.memory_records == 0 || config.ring_records == 0) {
    return absl::InvalidArgumentError("memory_records and ring_records must be positive");
  }
  if (config.clock == nullptr) return absl::InvalidArgumentError("clock is null");
  // Below 0 would put the sender above the training thread (and needs a
  // privilege); above 19 is no nice value at all.
  if (config.heartbeat_ms < 100 || config.heartbeat_ms > 60'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat_ms ", config.heartbeat_ms, " is outside 100..60000"));
  }
  if (config.sender_nice < 0 || config.sender_nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("sender_nice ", config.sender_nice, " is outside 0..19"));
  }
  if (!config.server_address.empty()) {
    if (absl::Status s = ParseServerAddresses(config.server_address).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("server_address: ", s.message()));
    }
    // The sender builds its channel from the same files; reading them here
    // makes a mistake Create's error, not a handshake that fails forever.
    absl::Status tls = wire::ClientCredentials({config.ca_file, config.cert_file, config.key_file}).status();
    if (!tls.ok()) return tls;
  }
  AgentConfig cfg = config;
  if (absl::Status s = ResolveRunId(&cfg, reducer->rank()); !s.ok()) return s;
  if (cfg.host_name.empty()) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    cfg.host_name = host;
  }
  if (cfg.resume_step && *cfg.resume_step < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("resume_step ", *cfg.resume_step, " is below -1 (nothing trained yet)"));
  }
  // Only a streaming agent needs the id, and only then is Create a
  // collective (see agent.h).
  std::string incarnation;
  if (!cfg.server_address.empty()) {
    absl::StatusOr<std::string> id = AgreeIncarnation(*reducer);
    if (!id.ok()) return id.status();
    incarnation = *std::move(id);
  }
  std::unique_ptr<SpillStore> spill;
  if (!cfg.spill_dir.empty() && !cfg.run_id.empty()) {  // the file is named by the run
    absl::StatusOr<std::unique_ptr<SpillStore>> opened = SpillStore::Open(
        cfg.spill_dir, absl::StrCat(cfg.run_id, ".rank", reducer->rank()), cfg.spill_max_bytes);
    if (!opened.ok()) return opened.status();
    spill = *std::move(opened);
  }
  return std::unique_ptr<Agent>(
      new Agent(std::make_unique<Impl>(cfg, std::move(reducer), std::move(spill),
                                       std::move(incarnation))));
}

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::~Agent() { Close(0); }

absl::StatusOr<Verdict> Agent::Step(const StepInput& input) { return impl_->Step(input); }

absl::Status Agent::StepObserved(const core::StepRecord& record) {
  return impl_->StepObserved(record);
}

void Agent::ReportCheckpoint(int64_t step, const std::string& uri) {
  impl_->ReportCheckpoint(step, uri);
}

void Agent::SetPhase(Phase phase) { impl_->sender().liveness().SetPhase(phase); }

void Agent::SetStack(int64_t finished_step, std::string stack, std::string blocked_at,
                     Phase phase) {
  impl_->sender().liveness().SetStack(finished_step, std::move(stack), std::move(blocked_at),
                                      phase);
}

LivenessInfo Agent::Liveness() const { return impl_->sender().liveness().Info(); }

void Agent::SourceCaughtUp() { impl_->sender().liveness().CaughtUp(); }

void Agent::SourceEnded(bool ended) { impl_->sender().liveness().SetEnded(ended); }

void Agent::SetCommandCallback(std::function<void(const Command&)> callback) {
  impl_->sender().SetCommandCallback(std::move(callback));
}

std::optional<Command> Agent::PollCommand() { return impl_->sender().PollCommand(); }

bool Agent::WaitForServer(int timeout_ms) { return impl_->sender().WaitForServer(timeout_ms); }

void Agent::Acknowledge(const std::string& command_id, AckStatus status,
                        const std::string& message, int64_t resumed_step) {
  impl_->Acknowledge(command_id, status, message, resumed_step);
}

void Agent::ResumeFrom(int64_t step) { impl_->ResumeFrom(step); }

std::vector<std::pair<uint64_t, uint64_t>> Agent::QuarantinedShards() const {
  return impl_->sender().QuarantinedShards();
}

const std::string& Agent::run_id() const { return impl_->run_id(); }

std::vector<std::string> Agent::QuarantinedShardNames() const {
  return impl_->sender().QuarantinedShardNames();
}

bool Agent::IsQuarantined(uint64_t shard) const {
  for (const auto& [first, last] : impl_->sender().QuarantinedShards()) {
    if (first <= shard && shard <= last) return true;
  }
  return false;
}

bool Agent::IsQuarantined(absl::string_view shard_name) const {
  return impl_->sender().IsQuarantined(shard_name);
}

const core::StepOutcome& Agent::last_outcome() const { return impl_->outcome(); }

const core::StepValues& Agent::last_values() const { return impl_->values(); }

AgentStats Agent::Stats() const { return impl_->Stats(); }

void Agent::Close(int timeout_ms) { impl_->sender().Close(timeout_ms); }

}  // namespace trainwatch::agent
