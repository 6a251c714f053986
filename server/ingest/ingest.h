// The write path of trainwatchd. Streams hand every agent message to
// Submit() without waiting; one writer thread takes them in batches, keeps
// each run's state (the rule engine, per-rank aggregation, the incidents of
// its episodes), writes the batch to the store in one transaction, and only
// then tells the streams which steps are durable.
//
// The invariant: a record is acknowledged only once it is durable, and a
// run's in-memory state only ever reflects durable records. When a batch's
// transaction fails (disk full, the --db_max_bytes quota, an I/O error, a
// lock held past the busy timeout):
//   - nothing of it is acknowledged, and every run it touched is rebuilt
//     from the store (RecoverRun, as at a restart), so the engine, the
//     aggregation and the incidents forget the batch;
//   - every stream with a message in it is ended with UNAVAILABLE (the
//     listener's OnStreamFailed), and step reports still queued from such a
//     stream are dropped: its agent reconnects and re-sends everything after
//     its last acknowledged step, in order, so a NaN in the lost batch is
//     evaluated again and opens its incident;
//   - checkpoints and command acks (which agents send once and never again)
//     are kept and retried with the next batch;
//   - a decision in it is answered UNAVAILABLE, its command not sent;
//   - its pages never reach the outbox (same transaction); they are made
//     again when the re-sent records reopen the incident.
// While a rebuild itself fails (the store cannot even be read), every batch
// and decision is refused the same way until it succeeds.
//
// Per-run modes, fixed by the run's first step report:
//   global: rank 0 streams the reduced record (REPORT_SCOPE_GLOBAL); other
//           ranks' reports are rank-specific extras, stored but not merged.
//   ranks:  every rank streams its own record (REPORT_SCOPE_RANK); a step
//           completes when all world_size ranks reported or after the
//           aggregation timeout, and the missing ranks are named.
// The pieces it drives, each in its own file: step_aggregation.h (ranks
// mode), incident_tracker.h (events to incidents), rollback.h (decisions and
// commands); ingest_runs.cc holds the runs in memory, ingest_decisions.cc the
// decisions.
//
// Incarnations and resumes. An incarnation is one launch of the job, named
// by the Hello's incarnation_id (the same on every rank of the launch). The
// run stores its current incarnation and every one it saw (migration 4).
//   - A new incarnation says where it resumes: the step S after which it
//     trains on (Hello.resume_step; failing that the step of a checkpoint
//     notice it sends before its first step report; else its first step
//     minus 1). When S is below the run's last evaluated step, its records
//     would collide with the earlier job's: it opens attempt N+1 from S, as
//     a rollback does (StartAttempt): the earlier attempt keeps all its
//     records, the steps <= S are carried into the new one, the engine is
//     rebuilt from exactly those (core::EngineRebuilder), and the resumed
//     job's records are stored and judged in the new attempt. Otherwise it
//     continues the attempt. While an approved rollback is under way
//     (command sent, not yet applied by every rank) the rollback's own
//     attempt governs and no resume attempt is opened.
//   - Within one incarnation a reconnect is not a resume: re-sent records
//     are duplicates, as before. The DurabilityAck at Hello names the
//     incarnation's own records only (none for a new one), so a resumed
//     agent does not skip its records as already durable.
//   - Two incarnations streaming at once: the newer takes over. A
//     preempted job's streams can linger half-open for minutes, so refusing
//     the newcomer would block every restart. The older incarnation's
//     streams are ended with FAILED_PRECONDITION naming the newer one, its
//     messages still queued are dropped (they belong to a history the newer
//     job replaced), and a Hello of an incarnation the run saw replaced is
//     refused the same way; each is logged and counted
//     (incarnation_conflicts_total). The agent stops streaming on that
//     status, with one log line; its local verdicts go on.
//   - An agent without an incarnation id (older versions) is never a
//     resume and never a conflict: its records are handled as before.
//   The run keeps every incarnation id it saw (at most 64 bytes each, one per
//   launch of the job), and the ingestor the current incarnation's stream
//   per rank (a few bytes each).
//
// Followed runs (Hello.observed: `twctl follow` streams a job's log, and
// nothing reaches the trainer). The latest Hello marks the run (runs.observed,
// migration 7), so the mark survives a restart. Its records are observed, not
// enforced:
//   - a tier 1 verdict is stored as the engine gave it, but counted in
//     skips_recommended_total, never in skipped_total (the exporter's
//     trainwatch_skipped_steps_total counts skips taken), and its incident's
//     decision is recorded as "skip_recommended"; a tier 3 one as
//     "halt_recommended", and the run's state stays RUNNING;
//   - the server sends its streams no Command (today's only server-sent
//     commands are approved rollbacks; Halt and Resume are never sent) and
//     no quarantine list: an approval is recorded with
//     Decision.manual_restart, its command row kept (kind "manual_restart")
//     so a restart of trainwatchd still knows it, and the incident stays
//     ROLLING_BACK until a new incarnation of the job resumes after exactly
//     the plan's step, which completes the rollback as every rank's ack
//     would (a new attempt from that checkpoint). A resume from any other
//     step is a resume as usual and the rollback stays awaited.
//
// The run's rules (ingest_rules.cc). Each run is judged by one RuleConfig,
// recorded with the run (runs.rules_json and rules_source, migration 9) so
// that a restart rebuilds it by the same rules:
//   - an agent given rules of its own announces them in its Hello
//     (rules_json): the first such Hello before the run's first evaluated
//     step fixes them ("agent"), and the engine restarts on them; a later
//     Hello with other rules is logged and changes nothing (the run's
//     history was judged by the rules it has);
//   - otherwise the run takes the first --run_rules pattern matching its
//     id ("server --run_rules <pattern>"), else --rules ("server --rules"),
//     else the defaults ("server defaults"), when it is created;
//   - every answer to a Hello names them (DurabilityAck.rules_json), and an
//     agent without rules of its own switches to them (agent.h).
// Whatever an agent decided (a skip or a halt in a global record's verdict)
// is stored as a decision (DECISION_KIND_AGENT_*) with its rule, the
// engine's explanation and, when its StepReport.rules_hash names rules the
// server knows (the run's, or the defaults), those rules' JSON; whether the
// server's engine agreed or not. An evaluated step whose agent verdict
// differs from the server's is a divergence: logged and counted
// (RunSnapshot::decision_divergences_total; both counts restart at 0 with
// trainwatchd).
//
// Bounds, so that no agent can grow the server without limit:
//   runs in memory: at most max_runs_in_memory runs keep their engine state
//     (about 0.3 MB each with the default rules); the least recently used
//     is evicted and rebuilt from the store (RecoverRun) when a message or
//     a decision needs it again. At startup the most recently seen runs
//     that fit are rebuilt after the port opens (see "Restart" below) and
//     the rest are left to be rebuilt on demand. Every run keeps a RunSnapshot (a few hundred bytes), so the
//     operator API and the exporter see evicted runs too. One batch never
//     touches more runs than the bound (Loop splits it).
//   world_size: taken per attempt. Within an attempt it only grows (ranks
//     join); a rollback's command waits for the world of the latest Hello
//     while it is under way, and the new attempt starts with that world, so
//     a job restarted on fewer ranks completes its rollback.
//   far-future steps: a step more than max_step_jump past the run's last
//     evaluated step (or past 0 before the first) is stored, not evaluated,
//     with a log line and a count (far_steps_total), unless the record
//     before it was such a step and this one follows it within the bound: a
//     real jump (a resume from a checkpoint far ahead) costs one unevaluated
//     step, one bad record (step INT64_MAX) cannot blind detection.
//   command acknowledgements: an ack counts only for its own run's command
//     under way; one for another run's command, or for a command not
//     issued, is refused with a log line and a count (refused_acks_total)
//     and not stored.
//
// Restart. Recover() reads only the runs' rows and stored figures (no step
// is replayed), so trainwatchd listens at once whatever the history. The
// max_runs_in_memory most recently seen runs are then rebuilt on the writer
// thread, one at a time, most recent first, whenever it has nothing queued
// (RebuildNextAtStartup): a message never waits behind more than one run's
// rebuild. Meanwhile:
//   - a message (Hello, StepReport, CheckpointNotice, CommandAck) or a
//     decision for a run not yet rebuilt rebuilds that run first, as for an
//     evicted run (RunFor): nothing is ever judged by an empty engine, and
//     the agent's answers are those of a fully rebuilt server, only later;
//   - the operator API and /metrics answer at once from RunSnapshot: a run
//     not yet rebuilt shows its stored figures (last step, skips, overflows,
//     incidents, as for an evicted run) with RunSnapshot::rebuilding set
//     (RunInfo.rebuilding), and IngestStats::runs_rebuilding
//     (trainwatch_runs_rebuilding) counts those left.
//
// Thread-safety: Submit(), Snapshot(), Stats() and Flush() from any thread;
// everything else is the writer thread's.

#ifndef TRAINWATCH_SERVER_INGEST_H_
#define TRAINWATCH_SERVER_INGEST_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/clock.h"
#include "store/store.h"
#include "ingest/incident_tracker.h"
#include "ingest/rollback.h"
#include "ingest/step_aggregation.h"
#include "trainwatch/core/rule_engine.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::server {

struct IngestItem {
  uint64_t stream_id = 0;
  int64_t received_ms = 0;
  trainwatch::v1::AgentMessage message;
};

// The run whose state a message touches ("" for a heartbeat: none).
const std::string& RunIdOf(const trainwatch::v1::AgentMessage& m);

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

struct DecisionOutcome {
  // OK; FAILED_PRECONDITION when the incident's state refuses the decision
  // (the message says why); NOT_FOUND; INVALID_ARGUMENT.
  absl::Status status;
  std::string decision;  // the serialized trainwatch.v1.Decision
  bool replayed = false;
  IncidentState state = IncidentState::kOpen;
};

// What the exporter and the operator API read about a run.
struct RunSnapshot {
  RunRow row;
  bool rank_mode = false;
  StepRow latest;  // the last evaluated global step
  bool has_latest = false;
  int64_t skipped_total = 0;
  // A followed run's tier 1 verdicts: skips recommended, not applied.
  int64_t skips_recommended_total = 0;
  // Evaluated steps on which the fp16 loss scaler overflowed (and skipped).
  int64_t loss_scale_overflows_total = 0;
  int64_t incidents_total[4] = {0, 0, 0, 0};  // by tier
  int64_t open_incidents[4] = {0, 0, 0, 0};
  int64_t missing_rank_steps_total = 0;
  // Skips and halts agents decided (each stored as a decision), and steps
  // where the agent's verdict and the server's engine's differ.
  int64_t agent_decisions_total = 0;
  int64_t decision_divergences_total = 0;
  // After a restart, until the run's engine is rebuilt (see "Restart"): the
  // figures above are the store's.
  bool rebuilding = false;
};

struct IngestStats {
  int64_t records_total = 0;      // step reports taken
  int64_t duplicates_total = 0;   // step reports already stored
  int64_t late_total = 0;         // stored, not evaluated
  int64_t rejected_total = 0;     // malformed, dropped with a log line
  int64_t batches_total = 0;
  int64_t queue_depth = 0;
  int64_t store_errors_total = 0;
  double last_commit_seconds = 0;
  double commit_seconds_sum = 0;
  int64_t last_lag_ms = 0;        // receipt to durable, last batch
  int64_t refused_acks_total = 0;  // command acks for another run's or no command
  int64_t far_steps_total = 0;     // stored, not evaluated: past max_step_jump
  int64_t runs_in_memory = 0;      // runs holding engine state
  int64_t runs_evicted_total = 0;
  int64_t runs_rebuilt_total = 0;  // evicted (or left at startup), rebuilt on demand
  int64_t runs_rebuilding = 0;     // after a restart, still to be rebuilt (see "Restart")
  int64_t resumes_total = 0;       // attempts opened by a new incarnation
  // Older incarnations' streams ended by a newer one, and their Hellos refused.
  int64_t incarnation_conflicts_total = 0;
  // Rebuilds started from an engine snapshot, and snapshots refused (damaged,
  // another version or other rules: the whole history was replayed).
  int64_t engine_snapshots_loaded_total = 0;
  int64_t engine_snapshots_refused_total = 0;
};

// Rules for the runs whose id matches `pattern` (a glob: * ? [...], as
// fnmatch(3)); trainwatchd --run_rules.
struct RunRules {
  std::string pattern;
  core::RuleConfig rules;
};

struct IngestOptions {
  // The rules of a run whose agent announces none and that no run_rules
  // pattern matches (trainwatchd --rules), and how runs record their source.
  core::RuleConfig rules;
  std::string rules_source = "server defaults";
  // Tried in order; the first match wins (see "The run's rules" above).
  std::vector<RunRules> run_rules;
  int64_t aggregation_timeout_ms = 30'000;
  // Upper bound on one batch, to keep commits short under a flood.
  size_t max_batch_items = 50'000;
  // Group commit (trainwatchd --commit_interval_ms): a batch of fewer than
  // kCommitEarlyItems records waits for more until this long after the
  // previous batch began (why: Ingestor::LingerForMore). 0: commit as soon
  // as anything is queued.
  int64_t commit_interval_ms = 5;
  // Runs holding their engine state in memory (trainwatchd
  // --max_runs_in_memory); the least recently used beyond it is evicted and
  // rebuilt from the store on demand. At least 1.
  size_t max_runs_in_memory = 256;
  // A step further than this past the run's last step is stored, not
  // evaluated, unless the next record confirms the jump (trainwatchd
  // --max_step_jump). At least 1. Small on purpose: a bad record within the
  // bound is evaluated and makes the run's next real steps late (stored, not
  // evaluated) for up to this many steps, while a real jump costs one step's
  // evaluation whatever the bound.
  int64_t max_step_jump = 1'000;
  // A run's rule-engine state is snapshotted into the store every this many
  // evaluated steps (trainwatchd --engine_snapshot_steps), and at eviction
  // and at a clean shutdown when a tenth of them passed since; a rebuild
  // (restart, eviction, resume, rollback) loads the newest snapshot at or
  // before its step and replays only the steps after it
  // (engine_snapshots.cc). 0 turns snapshots off: every rebuild replays the
  // attempt's whole history. A snapshot costs one SaveState
  // (~0.3 MB with the default windows, well under a millisecond) per this
  // many steps.
  int64_t engine_snapshot_steps = 10'000;
};

class Ingestor {
 public:
  Ingestor(Store* store, const IngestOptions& options, core::Clock* clock);
  ~Ingestor();
  // Fixed at construction; any thread.
  const IngestOptions& options() const { return options_; }
  Ingestor(const Ingestor&) = delete;
  Ingestor& operator=(const Ingestor&) = delete;

  // Reads the runs from the store: each gets its stored snapshot, and the
  // max_runs_in_memory most recently seen are queued to be rebuilt by the
  // writer thread after Start() (see "Restart"): the rule engine by feeding
  // it the stored records again (deterministic, so windows and episodes come
  // back exactly), open incidents by episode, pending per-rank steps. The
  // others are rebuilt when first needed.
  // REQUIRES: before Start().
  absl::Status Recover();

  // REQUIRES: listener outlives the Ingestor; set before Start().
  void SetListener(IngestListener* listener) { listener_ = listener; }
  // Pages go into the outbox with the incident changes that cause them.
  // REQUIRES: pager outlives the Ingestor; set before Start().
  void SetPager(class Pager* pager) { pager_ = pager; }
  void Start();
  // Drains what was submitted, writes it, and joins the writer.
  void Stop();

  // Never blocks on the store.
  void Submit(IngestItem item);
  // Waits until everything submitted before the call is durable (tests,
  // shutdown).
  void Flush();

  // A batch this large commits without waiting for the commit interval.
  static constexpr size_t kCommitEarlyItems = 1000;

  std::vector<RunSnapshot> Snapshot() const;
  IngestStats Stats() const;

  // Queues a decision; `done` runs on the writer thread once it is durable
  // (or refused). Never blocks.
  void Decide(DecisionRequest request, std::function<void(DecisionOutcome)> done);

 private:
  // One run's state, rebuilt by Recover() after a restart.
  struct RunState {
    explicit RunState(const RunRow& r) : row(r), incidents(r.run_id) {
      incidents.set_observed(r.observed);
    }
    RunRow row;
    core::RuleConfig rules;  // what the engine judges by (row.rules_json)
    bool mode_known = false;
    bool rank_mode = false;
    std::unique_ptr<core::RuleEngine> engine;
    core::StepOutcome out;
    std::map<int64_t, StepAggregate> pending;  // ranks mode: steps not complete
    IncidentTracker incidents;
    StepRow latest;
    bool has_latest = false;
    bool row_dirty = false;
    int64_t skipped_total = 0;
    int64_t skips_recommended_total = 0;  // followed runs' tier 1 verdicts
    int64_t loss_scale_overflows_total = 0;
    int64_t missing_rank_steps_total = 0;
    // The current attempt's counts as a replay of it gives them (the totals
    // above carry over attempts), for the engine snapshots; and the step of
    // the newest snapshot written or loaded, -1 for none.
    int64_t attempt_skipped = 0;
    int64_t attempt_overflows = 0;
    int64_t snapshot_step = -1;
    int64_t agent_decisions_total = 0;
    int64_t decision_divergences_total = 0;
    // The approved rollback being carried out, until every rank applied it.
    std::optional<RollbackCommand> command;
    ShardQuarantine quarantined;
    // A step refused as too far ahead, which the next record may confirm.
    std::optional<int64_t> far_step;
    // Every incarnation the run has seen (the current one included).
    std::set<std::string> incarnations;
    uint64_t last_batch = 0;  // the batch that last touched it, for eviction
  };

  void Loop();
  // With the lock held and something queued: waits, up to the commit
  // interval since the last batch began, for a batch worth committing
  // (IngestOptions::commit_interval_ms).
  void LingerForMore() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Processes `items` in batches that each touch at most max_runs_in_memory
  // runs.
  void ProcessInBatches(std::vector<IngestItem>& items);
  void ProcessBatch(std::vector<IngestItem>& items);
  // The failure path of ProcessBatch (see the invariant above): the runs
  // the batch touched are rebuilt, the streams of `items` ended, control
  // messages kept for the next batch.
  void FailBatch(std::vector<IngestItem>& items, const absl::Status& st, int64_t now);
  // Rebuilds the runs in stale_runs_ from the store; OK when none is left.
  absl::Status RebuildStaleRuns();
  // ingest_runs.cc: the runs held in memory.
  absl::StatusOr<RunState*> RecoverRun(const RunRow& row);
  // The run's state, creating the run when `create`, rebuilding it from the
  // store when it was evicted; null for an unknown run (when !create) or when
  // the rebuild failed (logged).
  RunState* RunFor(const std::string& run_id, int32_t world_size, int64_t now,
                   bool create = true);
  // Rebuilds the evicted run `it` (RecoverRun) and takes it out of
  // evicted_ and rebuilding_; logs and returns null when the store fails.
  RunState* RebuildEvicted(std::map<std::string, RunRow>::iterator it);
  // Rebuilds the next run queued by Recover() that is still evicted, while
  // room is left (a background rebuild never evicts); true when one was.
  bool RebuildNextAtStartup();
  // Evicts the least recently used run not touched by the current batch
  // while more than max_runs_in_memory - 1 runs are held.
  void MakeRoom();
  // engine_snapshots.cc. A replay of one attempt's history into a fresh
  // engine, or into one restored from the attempt's newest snapshot at or
  // before the replay's end: the caller feeds the stored steps after
  // `after()` (ForEachStep's after_step), the snapshot's own row included
  // (the engine refuses it; the caller still sees the latest row), then the
  // checkpoints, then finishes.
  struct EngineReplay {
    core::EngineRebuilder rebuild;
    int64_t snapshot_step = -1;  // -1: a full replay
    int64_t skipped = 0;         // the attempt's counts up to the last row taken
    int64_t overflows = 0;
    int64_t after() const { return snapshot_step - 1; }
    // True when the engine took the row.
    bool Feed(const StepRow& s, const std::string& checkpoint_uri);
  };
  // A snapshot that does not decode or was built under other rules than
  // `rules` (the run's) is logged and a full replay happens; an error only
  // when the store cannot be read.
  absl::StatusOr<EngineReplay> StartReplay(const std::string& run_id, int64_t attempt,
                                           int64_t up_to, const core::RuleConfig& rules);
  // Adds the run's engine snapshot to batch_ when engine_snapshot_steps
  // passed since the last, or when `force` (eviction, shutdown) and a tenth
  // of them did.
  void MaybeSnapshotEngine(RunState& run, bool force, int64_t now);
  // The snapshot of a run built from the store alone (startup, beyond the
  // bound).
  absl::StatusOr<RunSnapshot> StoredSnapshot(const RunRow& row);
  static RunSnapshot SnapshotOf(const RunState& run);
  // True when `step` is too far ahead of the run to be evaluated (counted
  // and logged); `rank_scope`: another rank's record of a confirmed step is
  // taken too.
  bool FarAhead(RunState& run, int64_t step, bool rank_scope);
  void Handle(IngestItem& item, int64_t now);
  // ingest_incarnations.cc: a Hello, the incarnation it names, and resumes.
  void HandleHello(const trainwatch::v1::Hello& h, uint64_t stream, int64_t now);
  // False when the Hello's incarnation was replaced by a newer one: its
  // stream is ended. A new incarnation takes over the run.
  bool AdmitIncarnation(RunState& run, const trainwatch::v1::Hello& h, uint64_t stream,
                        int64_t now);
  // Whether `stream` is the current incarnation's, and the run still waits
  // for the step it resumes after.
  bool AwaitsResumeStep(const RunState& run, uint64_t stream) const;
  // The current incarnation resumes after `step` (see above).
  void DecideResume(RunState& run, int64_t step, int64_t now);
  // Opens the run's next attempt from `up_to_step` (a rollback of
  // `incident_id`, or a resume by the current incarnation): the copy goes
  // into the batch, the engine is rebuilt from the old attempt's records up
  // to that step, the run continues from it with `world_size` ranks.
  // Returns the number of records rebuilt from.
  int64_t StartAttempt(RunState& run, int64_t up_to_step, AttemptStart start,
                       int64_t incident_id, int32_t world_size, int64_t now);
  void HandleStep(RunState& run, const trainwatch::v1::StepReport& r, uint64_t stream,
                  int64_t now);
  // ingest_rules.cc: the run's rules (see above). A new run's, by the
  // options.
  void AssignRules(RunState& run) const;
  // A run read from the store: its recorded rules (a damaged column is an
  // error), or, for a run from before migration 9, AssignRules.
  absl::Status RestoreRules(RunState& run) const;
  // A Hello's rules, when it announces any.
  void AdoptHelloRules(RunState& run, const trainwatch::v1::Hello& h);
  // The agent's verdict in an evaluated global record against the
  // server's (run.out): stored as a decision when a skip or a halt, counted
  // and logged when they differ.
  void RecordAgentVerdict(RunState& run, const trainwatch::v1::StepReport& r, int64_t now);
  // `tensors`: the report's per-tensor statistics, if any (names the source
  // of a numerical failure).
  void Evaluate(RunState& run, StepRow step, int64_t now,
                absl::Span<const core::TensorStat> tensors = {});
  void CompletePending(RunState& run, int64_t now, bool force);
  // Incident changes are written with this batch and heard after commit.
  IncidentSink sink() { return {&batch_, &changed_incidents_}; }
  void PublishSnapshot();
  // ingest_decisions.cc: the operator's decisions and the commands they
  // become.
  DecisionOutcome RunDecision(const DecisionRequest& r, int64_t now);
  // `run`: the ack's run, null when unknown. Stores and counts an ack of the
  // run's command under way; refuses (logs, counts, drops) any other.
  void HandleCommandAck(RunState* run, const trainwatch::v1::CommandAck& a, int64_t now);
  void CompleteRollback(RunState& run, int64_t now);
  void SendPendingCommand(RunState& run, uint64_t stream, int32_t rank);
  // What a hello is: a reconnect of the run's current incarnation, a new
  // one (a restart), or unknown (an agent that sends no incarnation id).
  enum class HelloKind { kReconnect, kRestart, kUnknown };
  // Fills the answer to a hello with what a restarted job must know before
  // its first step: the id of the command that follows (SendPendingCommand)
  // and the tier 3 incidents still awaiting a decision. Rank 0's hello of a
  // restart (or of an unknown kind) with such an incident is recorded with
  // it: the job runs on undecided. A reconnect is told again, not recorded.
  void AnswerHello(RunState& run, const trainwatch::v1::Hello& hello, HelloKind kind,
                   int64_t now, trainwatch::v1::DurabilityAck* ack);

  Store* store_;
  IngestOptions options_;
  core::Clock* clock_;
  IngestListener* listener_ = nullptr;
  class Pager* pager_ = nullptr;

  mutable absl::Mutex mu_;
  std::vector<IngestItem> queue_ ABSL_GUARDED_BY(mu_);
  struct Task {
    DecisionRequest request;
    std::function<void(DecisionOutcome)> done;
  };
  std::vector<Task> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int flushing_ ABSL_GUARDED_BY(mu_) = 0;  // Flush() calls waiting
  absl::Time last_batch_start_;            // writer thread
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;

  // Writer thread only.
  std::map<std::string, std::unique_ptr<RunState>> runs_;
  // Runs known to the store but not held in memory, by id.
  std::map<std::string, RunRow> evicted_;
  // Runs Recover() queued to be rebuilt, most recently seen first, the next
  // at startup_next_; and those of them not yet rebuilt (by any path).
  std::vector<std::string> startup_order_;
  size_t startup_next_ = 0;
  std::set<std::string> rebuilding_;
  uint64_t batch_seq_ = 0;
  IdCounters ids_;
  std::vector<std::pair<std::function<void(DecisionOutcome)>, DecisionOutcome>> answers_;
  std::vector<std::tuple<std::string, uint64_t, std::string>> outgoing_;  // after commit
  WriteBatch batch_;
  // (stream, run, rank) -> highest step in this batch, for acks; looked up
  // by the report's run id as a string_view (std::less<>), so that the id is
  // copied once per key and batch, not once per record.
  std::map<std::tuple<uint64_t, std::string, int32_t>, int64_t, std::less<>> acks_;
  int64_t batch_records_ = 0;  // step reports taken, into stats_ once per batch
  std::vector<std::pair<IncidentRow, IncidentChange>> changed_incidents_;
  // Runs whose in-memory state may hold a failed batch's effects, until
  // rebuilt from the store.
  std::set<std::string> stale_runs_;
  // Streams ended after a failed batch -> when; their step reports still in
  // the queue are dropped (the agent re-sends them in order). Kept a minute:
  // an ended stream delivers at most the one read already under way.
  std::map<uint64_t, int64_t> ended_streams_;
  // The current incarnation's stream of each rank, by run: ended when a
  // newer incarnation takes over. Outside RunState so that it survives an
  // eviction or a rebuild.
  std::map<std::string, std::map<int32_t, uint64_t>> incarnation_streams_;
  // Streams of replaced incarnations -> when; every message still queued
  // from them is dropped. Kept a minute, as ended_streams_.
  std::map<uint64_t, int64_t> superseded_streams_;
  // Streams to end after this batch's commit, and why.
  std::vector<std::pair<uint64_t, absl::Status>> ending_;
  // Checkpoints and command acks of failed batches (stream 0), retried
  // first in the next one: agents send them once. Few: one per checkpoint
  // or rollback per rank while the store fails.
  std::vector<IngestItem> carried_;

  mutable absl::Mutex snap_mu_;
  // Every run, held in memory or evicted, by id (operator reads page by id).
  std::map<std::string, RunSnapshot> snapshot_ ABSL_GUARDED_BY(snap_mu_);
  IngestStats stats_ ABSL_GUARDED_BY(snap_mu_);
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_H_
