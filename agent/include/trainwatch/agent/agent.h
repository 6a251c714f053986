// The in-process agent a trainer links: one call per step, before
// optimizer.step(), returns continue / skip_update / halt, decided by the
// shared rule engine on statistics reduced across ranks, identically on
// every rank. Everything else (streaming to trainwatchd, reconnects,
// spilling to disk, commands from the server) happens on background threads
// and never makes the step wait on the network.
//
//   trainwatch::agent::AgentConfig cfg = *AgentConfig::FromEnvironment();
//   auto agent = *Agent::Create(cfg, std::make_unique<SingleProcessReducer>());
//   StepInput in;  in.step = step;  in.loss = loss;  in.grad_sum_squares = ...;
//   absl::StatusOr<Verdict> v = agent->Step(in);
//   if (!v.ok() || v->decision == Decision::kHalt) stop();
//   else if (v->decision != Decision::kSkipUpdate) optimizer.step();
//
// Thread-safety: Step() and ReportCheckpoint() from the training thread
// only (the per-step path is single-producer); the rest from any thread.

#ifndef TRAINWATCH_AGENT_AGENT_H_
#define TRAINWATCH_AGENT_AGENT_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "trainwatch/agent/reducer.h"
#include "trainwatch/core/clock.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/rule_engine.h"
#include "trainwatch/core/shard_names.h"

namespace trainwatch::agent {

using core::Decision;
using core::Verdict;

// Where a rank's training thread is within its step, as its heartbeats tell
// the server (trainwatch.v1.Phase; docs/hangs.md).
enum class Phase : uint8_t {
  kUnspecified = 0,
  kForward = 1,
  kBackward = 2,
  kCollective = 3,  // the agent sets it around its own reduction
  kOptimizer = 4,
  kCheckpoint = 5,  // long by design: not a stall until a longer bound
  kEval = 6,        // likewise
  kData = 7,
};

// The training thread's timing, as the heartbeats report it.
struct LivenessInfo {
  int64_t finished_step = -1;  // the last step Step() returned for; -1: none
  int64_t in_step_ms = 0;      // since then (since Create, before the first)
  int64_t step_ms_median = 0;  // of the last 32 step intervals; 0: none yet
  // Of the same steps: from the end of the step before to the rank's first
  // wait on the others (SetPhase(kBackward or kCollective), else the
  // agent's reduction). The straggler's is the longest.
  int64_t lead_ms_median = 0;
  int64_t window_steps = 0;  // the steps behind the medians, up to 32
};

struct AgentConfig {
  // trainwatchd's address ("127.0.0.1:7070"), or the addresses of its
  // replicas separated by commas ("10.0.0.1:7070,10.0.0.2:7070"; each entry
  // as server_addresses.h says, an empty or malformed one is Create's
  // error); empty: no server, local decisions only. Env: TRAINWATCH_SERVER.
  // With several, the stream goes to the first; when a stream ends (the
  // server died, keepalive found it gone, or it refused the run) the agent
  // tries the next, and on every new stream re-sends each record after the
  // last step acknowledged durable, as after a server restart: nothing
  // acknowledged is lost, and what was not acknowledged is sent again. The
  // step never waits for any of it.
  std::string server_address;
  // The run this job's records belong to: 1 to 128 bytes of
  // [A-Za-z0-9._:-] (an id breaking the rule is Create's error). Env:
  // TRAINWATCH_RUN_ID. Left empty with a server address, Create() takes the
  // launcher's name for the job (torchrun's TORCHELASTIC_RUN_ID unless
  // "none", SLURM_ARRAY_JOB_ID + SLURM_ARRAY_TASK_ID, SLURM_JOB_ID) and rank
  // 0 says on stderr which; with none of those the agent does not stream (one
  // message on stderr says what to set) and decides locally only. There is
  // no default name: jobs sharing one would overwrite each other's steps.
  std::string run_id;
  std::string token;               // Env: TRAINWATCH_TOKEN
  std::string ca_file;             // TLS to the server; Env: TRAINWATCH_CA_FILE
  // Mutual TLS, for a trainwatchd started with --tls_client_ca: this
  // client's certificate chain and private key (PEM), given together. Env:
  // TRAINWATCH_CERT_FILE, TRAINWATCH_KEY_FILE. Create() reads every TLS file
  // first: a missing or non-PEM one, or a cert without its key, is an error
  // naming it.
  std::string cert_file;
  std::string key_file;
  // The thresholds of the local rule engine, when this job has its own.
  // Env: TRAINWATCH_RULES, a JSON object of RuleConfig fields
  // ('{"warmup_steps": 100}', recognised by its leading '{') or the path of
  // a file holding one; fields not given keep their defaults. A missing file
  // or bad JSON is FromEnvironment()'s error naming the variable.
  //
  // Precedence, highest first:
  //   1. the caller's own (set after FromEnvironment(), as
  //      trainwatch.Agent(rules=) does);
  //   2. TRAINWATCH_RULES;
  //   3. the server's rules for this run (trainwatchd --run_rules);
  //   4. the server's --rules;
  //   5. RuleConfig's defaults.
  // The job's own rules (1, 2) are announced in the hello (Hello.rules_json)
  // and the server judges the run by them: what the trainer configured is
  // what both sides run, so an operator reading an incident sees the
  // thresholds that actually skipped the step. With none (unset here), the
  // agent judges by the defaults until the server's answer to its hello
  // names the run's rules (3 to 5, DurabilityAck.rules_json), then switches
  // to them: every rank carries whether it holds them (a hash) in the step's
  // own all-reduce, and all switch at the first step where every rank holds
  // the same rules, so local decisions stay identical on every rank. The
  // step never waits for this; the switch rebuilds the engine from the kept
  // records (resume_history_records) by the new rules, as the server judged
  // them. That replay runs inside the switching step, once per run, and
  // costs in proportion to the records kept: small when the server answers
  // early. An agent without a server stays on the defaults.
  std::optional<core::RuleConfig> rules;
  // Records waiting for a durable ack, in memory; past this they spill.
  size_t memory_records = 16384;
  // Spill folder (Env: TRAINWATCH_SPILL_DIR); empty: no spilling, the
  // oldest unacknowledged records are dropped past memory_records, and those
  // still unacknowledged at Close() are dropped with a warning on stderr
  // giving their count. There is deliberately no default folder: a job of
  // thousands of ranks would write up to spill_max_bytes each into whatever
  // the default named (often a shared filesystem: 2,000 x 64 MB = 128 GB and
  // heavy metadata load), nothing would clean it up after the job, and a
  // later job started there would re-send another run's records. Point it at
  // node-local scratch that the job's epilogue removes.
  std::string spill_dir;
  size_t spill_max_bytes = 64u << 20;
  // The lock-free hand-off between the step and the sender thread.
  size_t ring_records = 4096;
  // How much nicer than the thread that starts the agent its sender's
  // threads run (the pump, the writer, its reader; capped at nice 19), on
  // top of SCHED_BATCH. SCHED_BATCH alone only stops a wake-up of theirs
  // from preempting the training thread at once; at the next tick they may
  // still take its core. Nicer, they take it less often, but they also get
  // less of a contended core: at a high step rate on a loaded host the ring
  // fills, records are dropped and the server's rules arrive thousands of
  // steps late (bench/agent: agent_overhead). Hence 0 by default; raise it
  // only where the sender's core share is safe (a few steps a second need
  // a tiny fraction of a core). 0..19. Env: TRAINWATCH_SENDER_NICE.
  int sender_nice = 0;
  // Backoff between reconnects; with several server addresses at most 1 s,
  // since a standby replica takes over within its lease.
  int reconnect_initial_ms = 100;
  int reconnect_max_ms = 30'000;
  // Every rank sends one on this interval, with where its training thread
  // is (the step, how long it has been in it, the phase, its stack when
  // late; docs/hangs.md): what trainwatchd detects a stall and a lost rank
  // from. 100..60000. Env: TRAINWATCH_HEARTBEAT_MS.
  int heartbeat_ms = 5000;
  // Whether the training thread's steps are timed for the heartbeats (two
  // clock reads a step). False: the heartbeats say nothing of the rank's
  // steps (Heartbeat.untimed) and trainwatchd judges no stall, lost rank
  // or straggler from them; for a side-by-side benchmark, or a job that
  // wants none. Env: TRAINWATCH_LIVENESS=0.
  bool liveness = true;
  // A write to the server blocked this long is cancelled and the agent
  // reconnects: a server that stopped reading must not hold the records.
  int stall_timeout_ms = 3000;
  // Time for the stall timer, the heartbeat and the records' stamps; must
  // outlive the agent. Tests pass a fake one.
  core::Clock* clock = core::SystemClock();
  std::string host_name;  // reported in hello; default: gethostname()
  // Reported in heartbeats, so that a page names where a stuck rank runs.
  // Default: LOCAL_RANK (-1 without it); the device the caller names
  // ("cuda:3"), empty when unknown.
  int local_rank = -1;
  std::string device;
  // The last reduced records kept so that ResumeFrom() rebuilds the local
  // rule engine from the steps up to the checkpoint, identically on every
  // rank, instead of warming up again with tier 1 off. About 128 bytes each;
  // 0: keep none (start over).
  size_t resume_history_records = 20000;
  // The step this launch of the job resumed after (it loaded the checkpoint
  // of that step and trains resume_step + 1 next), told to the server in the
  // hello. Unset: the server takes the step of a checkpoint reported before
  // the first Step(), or else the first step minus 1. A launch that resumes
  // before the run's last stored step opens a new attempt on the server, so
  // that both jobs' records are kept (see the incarnation note below).
  std::optional<int64_t> resume_step;
  // The records are of a job watched, not enforced: its log followed by
  // `twctl follow` (records through StepObserved()), or a trainer attached
  // observe-only (`trainwatch run --observe-only`, records through Step(),
  // whose verdicts are then recommendations the trainer does not act on).
  // Told to the server in the hello (Hello.observed), which marks the run
  // "observed, not enforced": no update was skipped nor the trainer halted,
  // so the server records tier 1 and tier 3 verdicts as recommended, not
  // applied, and sends the run no commands. Not read from the environment:
  // only the caller sets it. Default false.
  bool observed = false;
  // What `trainwatch run` found when it attached this job (or why it could
  // not), told to the server in the hello (Hello.attachment, at most 4 KiB)
  // for `twctl status`. Empty: the trainer attached the agent itself.
  std::string attachment;

  // Overrides the fields above from TRAINWATCH_* variables (and RANK /
  // WORLD_SIZE are the reducer's business, not the config's). Bad values
  // are errors naming the variable.
  static absl::StatusOr<AgentConfig> FromEnvironment(AgentConfig defaults);
  static absl::StatusOr<AgentConfig> FromEnvironment();
};

// Gradient layout: how many ranks hold an identical copy of each gradient.
// The agent keeps one all-reduce over the whole world and makes it exact for
// every layout by having each rank contribute each group's sums divided by
// its copies, so that every distinct gradient element counts once:
//   replicated (DDP: identical gradients on every rank after its
//     all-reduce): copies = world_size;
//   sharded (FSDP, ZeRO: each rank holds its own slice): copies = 1;
//   hybrid (tensor/pipeline-parallel shards within a model-parallel group,
//     replicated across data parallel): copies = data-parallel size for the
//     tensor-parallel shards, data-parallel x tensor-parallel size for the
//     parameters every tensor-parallel rank holds whole (norms, biases).
// The nonfinite and element counts are rounded to integers once, after the
// reduction, so they come out exact.
//
// Where a nonfinite gradient can be localised: in a sharded layout only the
// rank holding the shard sees it, so that rank's own record (and its
// per-tensor report, StepInput::tensors) names the bad device. After a
// replicated all-reduce every rank holding a copy sees the same NaN: the
// record says which tensor, but not which rank produced it.
struct GradGroup {
  double sum_squares = 0.0;  // over finite elements
  int64_t nonfinite = 0;     // 0 <= nonfinite <= elements
  int64_t elements = 0;
  int copies = 1;            // 1 <= copies <= world_size
};

// This rank's statistics of one step. Every field is optional: a NaN loss is
// "reported NaN", an unset one unknown.
//
// Loss and log Z are means over the ranks (log Z weighted by rows) in every
// layout, every rank that reports them counted once: in a hybrid layout the
// ranks of one model-parallel group report the same loss (and the same rows,
// once the logits are gathered), and since every data-parallel replica is
// then counted by the same number of ranks the mean is the data-parallel
// mean. Ranks without a loss (early pipeline stages) leave it unset.
struct StepInput {
  int64_t step = 0;
  std::optional<double> loss;
  // Gradient statistics of this rank's gradients before clipping: sum of
  // squares over finite elements, nonfinite count, element count (from the
  // statistics kernels, or the trainer's own). Given this way they are one
  // group with copies = 1: the sharded layout.
  std::optional<double> grad_sum_squares;
  int64_t grad_nonfinite = 0;
  int64_t grad_elements = 0;
  // Or, for another layout, the same statistics per group of gradients with
  // the copies of each (see GradGroup). Step() refuses both forms at once,
  // and a group with copies outside [1, world_size] or nonfinite outside
  // [0, elements], with INVALID_ARGUMENT before any collective.
  absl::Span<const GradGroup> grad_groups;
  // Sum and count of per-row log Z (so ranks with different row counts
  // reduce to the true mean); or a ready mean with count 1.
  double log_z_sum = 0.0;
  int64_t log_z_rows = 0;
  std::optional<double> learning_rate;
  std::optional<double> z_loss_alpha;
  std::optional<double> activation_max;
  std::optional<double> attention_logit_p99;
  // fp16 dynamic loss scaling: the scaler's scale for this step (its
  // get_scale()) and whether it found inf/NaN in this rank's gradients and
  // so skips the update. Unset for bf16 and fp32 runs. Reduced as maxes over
  // the ranks: one rank's overflow is the step's, since the scaler skips on
  // every rank. The statistics above are of the unscaled gradients.
  std::optional<double> loss_scale;
  bool loss_scale_overflow = false;
  absl::Span<const uint64_t> shards;
  // This rank's batch's shards as names, for loaders that name their data
  // with strings (a webdataset url, "train-00012-of-01024.parquet:7"); may
  // be given with `shards`. At most core::kMaxShardNamesPerRecord (1,024),
  // each 1 to core::kMaxShardNameBytes (256) bytes (shard_names.h): Step()
  // refuses more with INVALID_ARGUMENT, before any collective, rather than
  // cut them. Unlike the ids, names are not gathered from the other ranks
  // on a skipped step: the run's record names rank 0's batch.
  absl::Span<const std::string> shard_names;
  // Optional per-tensor statistics of this rank's gradients (names, sums of
  // squares, nonfinite counts). Sent to the server only when this rank saw a
  // nonfinite gradient: they name the source tensor and the bad device.
  absl::Span<const core::TensorStat> tensors;
};

// OK, or INVALID_ARGUMENT naming the field: gradient statistics given both
// as scalars and as groups, a group's copies outside [1, world_size], or its
// counts negative or nonfinite > elements. Step() checks it first; the
// Python binding too, to raise the caller's error instead of halting.
absl::Status CheckGradLayout(const StepInput& in, int world_size);

// INVALID_ARGUMENT, naming the step, for a loss_scale not above 0 or an
// overflow without a loss_scale (which could not be told from a numerical
// failure). Step() checks it first, before any collective; callers that turn
// Step()'s errors into halts (the Python binding) check it before.
absl::Status CheckLossScale(const StepInput& in);

struct Command {
  enum class Kind { kRollback, kHalt, kResume };
  Kind kind = Kind::kHalt;
  std::string command_id;
  std::string incident_id;
  int64_t target_step = -1;
  std::string checkpoint_uri;
  std::vector<std::pair<uint64_t, uint64_t>> quarantine;  // inclusive ranges
  std::vector<std::string> quarantine_names;              // named shards
  // Steps (inclusive) whose batches this rank's loader must not serve again:
  // whatever data this rank read at those steps, quarantined by the trainer.
  std::optional<std::pair<int64_t, int64_t>> skip_steps;
  std::optional<double> z_loss_alpha;
  // Modules to run in another precision after loading, in order: (module
  // name as the trainer knows it, "fp32" | "bf16" | "fp16").
  std::vector<std::pair<std::string, std::string>> precision;
  // Factor on every parameter group's learning rate after loading.
  std::optional<double> lr_scale;
  std::string reason;
};

enum class AckStatus { kReceived = 1, kApplied = 2, kFailed = 3 };

struct AgentStats {
  int64_t steps = 0;
  int64_t records_queued = 0;      // handed to the sender
  int64_t records_acked = 0;       // durable at the server
  int64_t records_spilled = 0;
  // Lost: memory and spill full, ring full, or unacknowledged at Close()
  // without a spill folder.
  int64_t records_dropped = 0;
  int64_t reconnects = 0;
  int64_t durable_step = -1;
  bool connected = false;
  // Records go to a server: false without a server address, or with one but
  // no run id to stream under (see AgentConfig::run_id).
  bool streaming = false;
  size_t unacked = 0;
  size_t spill_bytes = 0;
  // A newer incarnation of the run took over on the server: not streaming.
  bool replaced = false;
  // The step from which the local engine judges by the server's rules for
  // the run (AgentConfig::rules, 3 to 5); -1 while on its own or defaults.
  int64_t server_rules_from_step = -1;
  // The run's last step stored at the server when this launch said hello
  // (DurabilityAck.run_last_step; -1: none, or not answered yet).
  int64_t run_last_step = -1;
};

// Incarnations: each Create() with a server address is one launch of the
// job, named by a random 64-bit id that rank 0 draws and every rank learns
// through the reducer (one all-reduce at Create, so with a server every rank
// must call Create, as it must call Step). trainwatchd uses it to tell a
// restart of the job (a new attempt when it resumes before the last stored
// step) from a reconnect (re-sent records, deduplicated). When a newer
// launch of the same run streams, the server ends this one's stream with
// FAILED_PRECONDITION: the agent logs one line, stops streaming and keeps
// no more records (Stats().replaced); its local verdicts go on. With several
// server addresses this is believed once every address in a row answered
// so, since a replica that does not own the run may answer the same.
class Agent {
 public:
  static absl::StatusOr<std::unique_ptr<Agent>> Create(const AgentConfig& config,
                                                       std::unique_ptr<Reducer> reducer);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Reduces this rank's statistics across ranks, runs the rule engine and
  // queues the record for the server. Never waits on the network. A failed
  // collective or a rejected step (not increasing) is an error, and the
  // trainer must halt on it: a rank that cannot agree must not train on.
  absl::StatusOr<Verdict> Step(const StepInput& input);

  // A followed job's step as its log reported it (AgentConfig::observed):
  // the record is streamed as given, with no reduction (the follower is one
  // process reading the whole job's numbers) and no local engine (nothing
  // here could act on a verdict: trainwatchd judges the run and derives its
  // loss_ema_ratio); the record says no update was skipped. A step
  // not above the last is INVALID_ARGUMENT (a restart is a new Agent with
  // resume_step), as is a call on an agent not created observed.
  absl::Status StepObserved(const core::StepRecord& record);

  // The trainer saved a checkpoint at `step`.
  void ReportCheckpoint(int64_t step, const std::string& uri);

  // Liveness (docs/hangs.md). SetPhase: where the training thread is, told
  // in the heartbeats; a checkpoint or an evaluation set here is not taken
  // for a stall. It lasts until set again or the next Step() returns. The
  // first kBackward or kCollective of a step marks the rank's arrival at
  // its first wait on the others (a straggler arrives last). A few atomic
  // operations: any thread, also on the step path.
  void SetPhase(Phase phase);
  // The training thread's stack, read by a watchdog thread while the step
  // was late (the Python agent's: trainwatch/_liveness.py), and its
  // innermost frame in the trainer's own code, and the phase the stack
  // shows (where the trainer set none): the heartbeats carry them while the
  // rank is still in the step after `finished_step`. Any thread.
  void SetStack(int64_t finished_step, std::string stack, std::string blocked_at,
                Phase phase = Phase::kUnspecified);
  LivenessInfo Liveness() const;
  // A followed log's liveness (AgentConfig::observed, `twctl follow`).
  // SourceCaughtUp: the follower has read all there is, so the next step
  // it reads is new; the log's interval is measured between such steps
  // only (lines read together, a buffered write or the history read at
  // start, are one write). SourceEnded: no process has the log open for
  // writing any more (the job ended: its silence is not a stall), or,
  // false, one has again.
  void SourceCaughtUp();
  void SourceEnded(bool ended);

  // Commands from the server: by callback (called on a background thread)
  // and by poll. Each command is delivered once either way.
  void SetCommandCallback(std::function<void(const Command&)> callback);
  std::optional<Command> PollCommand();
  // At startup, before the first Step(): waits up to `timeout_ms` for the
  // server's answer to this rank's hello and for the command that answer
  // says follows (the pending rollback of a restarted job), so that the
  // trainer loads the checkpoint before step 0 instead of training a step
  // of the abandoned attempt. True once both arrived (the command is then
  // waiting for PollCommand() or went to the callback); false on timeout,
  // without a server, or after Close(): the trainer may start anyway, and a
  // command arrives later as usual. The answer also names the tier 3
  // incidents still awaiting a decision; the agent warns about each on
  // stderr.
  bool WaitForServer(int timeout_ms);
  void Acknowledge(const std::string& command_id, AckStatus status,
                   const std::string& message = "", int64_t resumed_step = -1);
  // The run's quarantined shards, for the data loader: id ranges, names,
  // and whether one shard is among them (a name matches exactly).
  std::vector<std::pair<uint64_t, uint64_t>> QuarantinedShards() const;
  std::vector<std::string> QuarantinedShardNames() const;
  bool IsQuarantined(uint64_t shard) const;
  bool IsQuarantined(absl::string_view shard_name) const;

  // After loading the checkpoint of `step` (a rollback): the next Step() may
  // be step + 1 again. Records of the abandoned steps not yet acknowledged
  // are dropped (the server starts a new attempt from the checkpoint), and
  // the local rule engine is rebuilt from the kept records up to `step`
  // (resume_history_records), so tier 1 protects the very next step. Call
  // it before acknowledging the rollback command. Training thread only.
  void ResumeFrom(int64_t step);

  // The run id records are streamed under (given, or the launcher's); empty
  // when there was none.
  const std::string& run_id() const;
  // The last step's derived numbers (what was reported).
  const core::StepOutcome& last_outcome() const;
  // The last step's record as the engine judged it: reduced across ranks,
  // so the same on every rank (absent signals are absent, Get() is NaN).
  const core::StepValues& last_values() const;
  AgentStats Stats() const;
  // Waits up to `timeout_ms` for every record to be durable, then stops the
  // background threads. Records not acknowledged stay in the spill folder;
  // without one they are lost, and a warning on stderr gives their count.
  void Close(int timeout_ms = 5000);

 private:
  class Impl;
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainwatch::agent

#endif  // TRAINWATCH_AGENT_AGENT_H_
