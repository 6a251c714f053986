// The operator's approvals (and rejections) of incidents' rollback plans,
// the rollback commands they become (the rules are in rollback.h), the
// agents' acknowledgements of those commands, and what a Hello must learn of them. A followed run's
// approved rollback is recorded, never sent: it completes when the job is
// restarted by hand after the plan's step (incarnations.h).
//
// An acknowledgement counts only for the command under way in its own run;
// any other is refused, logged, counted and not stored, so it cannot count
// after a restart either.
//
// Writer thread only.

#ifndef TRAINWATCH_SERVER_INGEST_APPROVALS_H_
#define TRAINWATCH_SERVER_INGEST_APPROVALS_H_

#include <cstdint>

#include "ingest/batch.h"
#include "ingest/engine_snapshots.h"
#include "ingest/rollback.h"
#include "ingest/run_state.h"
#include "ingest/run_table.h"
#include "ingest/run_views.h"
#include "store/store.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::server {

// What a hello is: a reconnect of the run's current incarnation, a new one
// (a restart), or unknown (an agent that sends no incarnation id).
enum class HelloKind { kReconnect, kRestart, kUnknown };

class Approvals {
 public:
  // REQUIRES: every pointer outlives this.
  Approvals(Store* store, RunTable* runs, EngineSnapshots* snapshots, RunViews* views,
            Batch* batch)
      : store_(store), runs_(runs), snapshots_(snapshots), views_(views), batch_(batch) {}

  // Records the operator's approval `r` in the batch; its command goes out
  // after the commit.
  ApprovalOutcome Run(const ApprovalRequest& r, int64_t now);
  // `run`: the ack's run, null when unknown. Stores and counts an ack of the
  // run's command under way; refuses (logs, counts, drops) any other.
  void HandleCommandAck(RunState* run, const trainwatch::v1::CommandAck& a, int64_t now);
  // Every rank applied the run's command (or a followed run was restarted
  // after its step): a new attempt from the plan's step.
  void CompleteRollback(RunState& run, int64_t now);
  void SendPendingCommand(RunState& run, uint64_t stream, int32_t rank);
  // Fills the answer to a hello with what a restarted job must know before
  // its first step: the id of the command that follows (SendPendingCommand)
  // and the tier 3 incidents still awaiting a decision. Rank 0's hello of a
  // restart (or of an unknown kind) with such an incident is recorded with
  // it: the job runs on undecided. A reconnect is told again, not recorded.
  void AnswerHello(RunState& run, const trainwatch::v1::Hello& hello, HelloKind kind,
                   int64_t now, trainwatch::v1::DurabilityAck* ack);

 private:
  Store* store_;
  RunTable* runs_;
  EngineSnapshots* snapshots_;
  RunViews* views_;
  Batch* batch_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INGEST_APPROVALS_H_
