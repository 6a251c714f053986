// Hellos, incarnations and resumes. An incarnation is one launch of the job,
// named by the Hello's incarnation_id (the same on every rank of the
// launch); the run stores its current one and every one it saw
// (migration 4).
//   - A new incarnation says where it resumes: the step S after which it
//     trains on (Hello.resume_step; else the step of a checkpoint notice it
//     sends before its first step report; else its first step minus 1).
//     When S is below the run's last evaluated step, it opens attempt N+1
//     from S, as a rollback does (EngineSnapshots::OpenAttempt): the earlier
//     attempt keeps its records. While an approved rollback is under way
//     its own attempt governs and no resume attempt is opened.
//   - Within one incarnation a reconnect is not a resume: re-sent records
//     are duplicates. The DurabilityAck at Hello names the incarnation's own
//     records only, so a resumed agent does not skip its records as durable.
//   - Two incarnations streaming at once: the newer takes over (a preempted
//     job's streams can linger half-open for minutes, and refusing the
//     newcomer would block every restart). The older one's streams end with
//     FAILED_PRECONDITION naming the newer, its queued messages are dropped,
//     and a Hello of a replaced incarnation is refused the same way.
//   - An agent without an incarnation id is never a resume nor a conflict.
// The latest Hello also says whether the run is followed from its log
// (Hello.observed, runs.observed): observed, not enforced.
//
// Writer thread only.

#ifndef TRAINWATCH_SERVER_INGEST_INCARNATIONS_H_
#define TRAINWATCH_SERVER_INGEST_INCARNATIONS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ingest/batch.h"
#include "ingest/approvals.h"
#include "ingest/engine_snapshots.h"
#include "ingest/ingest_listener.h"
#include "ingest/per_run_rules.h"
#include "ingest/run_state.h"
#include "ingest/run_table.h"
#include "ingest/run_views.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::server {

class Incarnations {
 public:
  // REQUIRES: every pointer outlives this.
  Incarnations(RunTable* runs, PerRunRules* rules, Approvals* decisions,
               EngineSnapshots* snapshots, RunViews* views, Batch* batch)
      : runs_(runs), rules_(rules), approvals_(decisions), snapshots_(snapshots),
        views_(views), batch_(batch) {}
  // REQUIRES: before the first Hello.
  void set_listener(IngestListener* listener) { listener_ = listener; }

  // Takes a Hello: the incarnation it names, the run's mark, its rules, and
  // the answer (durable steps, pending command, quarantine) after commit.
  void HandleHello(const trainwatch::v1::Hello& h, uint64_t stream, int64_t now);
  // Whether `stream` is the current incarnation's, and the run still waits
  // for the step it resumes after.
  bool AwaitsResumeStep(const RunState& run, uint64_t stream) const;
  // The current incarnation resumes after `step`.
  void DecideResume(RunState& run, int64_t step, int64_t now);
  // A stream of a replaced incarnation: every message from it is dropped.
  bool IsSuperseded(uint64_t stream) const { return superseded_.count(stream) > 0; }
  // A failed batch forgets its takeovers: the newer incarnation's stream is
  // ended, and its next Hello takes over again.
  void ForgetTakeovers(const std::vector<std::pair<uint64_t, absl::Status>>& ending);
  // Forgets replaced streams older than a minute: an ended stream delivers
  // at most the one read already under way.
  void Expire(int64_t now);

 private:
  // False when the Hello's incarnation was replaced by a newer one: its
  // stream is ended. A new incarnation takes over the run.
  bool Admit(RunState& run, const trainwatch::v1::Hello& h, uint64_t stream, int64_t now);

  RunTable* runs_;
  PerRunRules* rules_;
  Approvals* approvals_;
  EngineSnapshots* snapshots_;
  RunViews* views_;
  Batch* batch_;
  IngestListener* listener_ = nullptr;
  // The current incarnation's stream of each rank, by run: ended when a
  // newer incarnation takes over. Apart from RunState, so that it survives
  // an eviction or a rebuild.
  std::map<std::string, std::map<int32_t, uint64_t>> streams_;
  // Streams of replaced incarnations -> when.
  std::map<uint64_t, int64_t> superseded_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_INCARNATIONS_H_
