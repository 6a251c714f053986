// Stalls and lost ranks, from the agents' heartbeats (docs/hangs.md). Every
// rank's agent reports, on its own thread, the step its training thread
// last finished, how long it has been in the next, its phase, and its stack
// once the step is late. From them, on the ingest writer:
//
//   stall: the run made no step for longer than its bound while its ranks'
//     agents are alive. The bound is learned from the run's own step times:
//     stall_step_multiple times the ranks' median step, at least
//     stall_floor_ms; before the run has kLearnedSteps steps (compilation,
//     the data pipeline's warm-up) it is stall_startup_ms, counted from a
//     launch's first heartbeat (a rank before its first step: a start or a
//     restart loading its checkpoint), and while a rank
//     is in a checkpoint or an evaluation (Phase) at least long_phase_ms.
//     The incident (tier 2, paged) names the ranks behind, their host,
//     phase and the line their training thread is blocked at, where the
//     others wait, and what the stall cost in GPU-hours so far; it resolves
//     by itself when the run steps again, with its whole cost.
//   rank lost: a rank's heartbeats stopped (lost_heartbeats intervals and
//     at least lost_min_ms) while other ranks of the run still send theirs: its process or host
//     is gone, which is not the same as stuck. It resolves when the rank's
//     heartbeats come back or the whole job's stop (a restart).
//   straggler: one rank's own time per step (its lead time, from the end of
//     a step to its first wait on the others, plus the step's common rest)
//     over the median rank's is at least straggler_ratio for
//     straggler_steps steps: the job runs at its pace. A warning page
//     naming its host and what share of each step the others wait; it
//     resolves when the rank keeps pace again. The slowest ranks' ratios
//     are published (RunView::liveness) for /metrics and `twctl status`.
//
// A run followed from its log (`twctl follow`, Heartbeat.from_log) has one
// "rank", its follower, whose step is the log's last and whose median is the
// time between the log's writes: it stalls as any run, learned from its
// writes (at least kLearnedSteps of them), with no lost ranks nor
// stragglers; a follower that says the log's writer is gone closes.
//
// Writer thread only.

#ifndef TRAINWATCH_SERVER_INGEST_LIVENESS_H_
#define TRAINWATCH_SERVER_INGEST_LIVENESS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "ingest/incident_tracker.h"
#include "ingest/ingest_options.h"
#include "ingest/run_state.h"
#include "ingest/run_views.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::server {

// One rank as its last heartbeat left it, and when that arrived.
struct RankLiveness {
  int32_t rank = 0;
  trainwatch::v1::Heartbeat heartbeat;
  int64_t received_ms = 0;
};

class Liveness {
 public:
  // Steps a run must have made before its step time counts as learned.
  static constexpr int64_t kLearnedSteps = 8;

  // The slowest ranks published per run.
  static constexpr size_t kSlowestRanks = 5;
  // Steps a rank's lead median must be over before it is compared.
  static constexpr int64_t kPaceWindow = 16;
  // The least a straggler's lead exceeds the median rank's by.
  static constexpr int64_t kStragglerMinMs = 10;

  // `views`: where each run's LivenessView is published; may be null.
  Liveness(const LivenessOptions& options, RunViews* views)
      : options_(options), views_(views) {}

  void OnHeartbeat(const trainwatch::v1::Heartbeat& h, int64_t now);
  // The run's last evaluated step, after a record of it was taken.
  void OnProgress(const std::string& run_id, int64_t last_step, int64_t now);

  // Opens, updates and resolves the runs' stall and lost-rank incidents;
  // does nothing more often than options.check_interval_ms. `run` gives a
  // run's state (null: unknown or not rebuildable).
  void Check(int64_t now, const std::function<RunState*(const std::string&)>& run,
             IdCounters* ids, const IncidentSink& sink);

  // The page's paragraph beyond an incident's title: the stuck rank's stack
  // and the cost so far. Empty for an incident not of a stall.
  std::string PageDetail(const IncidentRow& incident, int64_t now) const;

 private:
  struct Run {
    std::map<int32_t, RankLiveness> ranks;
    int64_t first_seen_ms = 0;
    int64_t last_step = -1;
    int64_t last_progress_ms = 0;
    int64_t first_step = -1;  // the last step when first seen, and when
    int64_t first_step_ms = 0;
    int64_t steps_seen = 0;
    int64_t stall_started_ms = 0;  // when the incident opened; 0: not stalled
    int64_t stall_since_progress_ms = 0;  // the run's last step before it
    int64_t stall_step = -1;
    std::string stack;             // of the first rank behind, for the page
    int32_t world_size = 0;
    int32_t straggler = -1;        // the slowest rank past the ratio, -1: none
    int64_t straggler_since_step = 0;
    int32_t straggler_paged = -1;  // the rank its open incident names
    bool published = false;        // a view with ranks heard from
    bool from_log = false;         // followed from its log
    bool ended = false;            // its ranks closed, and none has been heard since
    bool end_shown = false;        // its view says `ended`
  };
  bool Alive(const RankLiveness& r, int64_t now) const;
  int64_t Bound(const Run& run, int64_t now) const;
  void CheckRun(Run& run, RunState& state, int64_t now, IdCounters* ids,
                const IncidentSink& sink, LivenessView* view);
  // The alive ranks' paces, slowest first (those with a long enough window).
  std::vector<RankTiming> Paces(const Run& run, int64_t now, int64_t* median_lead) const;
  void CheckPace(Run& run, IncidentTracker& incidents, int64_t now, IdCounters* ids,
                 const IncidentSink& sink, LivenessView* view);
  // "rank 1 on host gpu-7 in backward at train.py:57 (in step 12 for 95 s); 3
  // ranks wait in collective at train.py:61", and the stack of the first
  // rank behind.
  std::string Where(Run& run, int64_t now) const;
  // "the log has written no step after step 12 for 95 s (it wrote every
  // 5 s); followed on host gpu-7".
  std::string LogWhere(const Run& run, int64_t now) const;

  const LivenessOptions options_;
  RunViews* const views_;
  std::map<std::string, Run> runs_;
  int64_t last_check_ms_ = 0;
};

// GPU-hours of `ms` milliseconds on `ranks` ranks (one device each).
double GpuHours(int64_t ms, int64_t ranks);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_LIVENESS_H_
