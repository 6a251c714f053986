// Rule-engine snapshots (IngestOptions::engine_snapshot_steps): when a run's
// engine state is written to the store, and the replay a rebuild starts from
// it. A rebuild that would replay a run's whole history (a restart, an
// evicted run streaming again, a resume or rollback to a step) instead loads
// the attempt's newest snapshot at or before its step and replays only the
// steps after it. The engine is deterministic, so the two give the same
// engine, decision for decision (tests/server/engine_snapshot_test.cc); a
// snapshot that cannot be used is never half trusted: it is logged and the
// whole attempt is replayed. Writer thread only.

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ingest/ingest.h"
#include "common/log.h"

namespace trainwatch::server {

bool Ingestor::EngineReplay::Feed(const StepRow& s, const std::string& checkpoint_uri) {
  core::StepRecord rec = s.View();
  rec.checkpoint_uri = checkpoint_uri;
  if (!rebuild.Feed(rec)) return false;
  skipped += s.decision == static_cast<int>(core::Decision::kSkipUpdate);
  overflows += s.loss_scale_overflow();
  return true;
}

absl::StatusOr<Ingestor::EngineReplay> Ingestor::StartReplay(const std::string& run_id,
                                                             int64_t attempt, int64_t up_to,
                                                             const core::RuleConfig& rules) {
  if (options_.engine_snapshot_steps > 0) {
    absl::StatusOr<std::optional<EngineSnapshotRow>> snap =
        store_->LatestEngineSnapshot(run_id, attempt, up_to);
    if (!snap.ok()) return snap.status();
    if (snap->has_value()) {
      const EngineSnapshotRow& row = **snap;
      absl::StatusOr<std::unique_ptr<core::RuleEngine>> engine =
          core::RuleEngine::FromState(rules, row.state);
      // The blob's own last step must be the row's: anything else is a
      // snapshot of some other history.
      if (engine.ok() && (*engine)->last_step() != row.step) {
        engine = absl::InvalidArgumentError(absl::StrCat(
            "engine snapshot: its state ends at step ", (*engine)->last_step()));
      }
      absl::MutexLock lock(&snap_mu_);
      if (engine.ok()) {
        stats_.engine_snapshots_loaded_total++;
        return EngineReplay{core::EngineRebuilder(*std::move(engine), up_to), row.step,
                            row.skipped, row.overflows};
      }
      stats_.engine_snapshots_refused_total++;
      LOG(WARNING) << "run " << run_id << " attempt " << attempt
                   << ": the engine snapshot at step " << row.step
                   << " is not used (" << engine.status()
                   << "); replaying the attempt's whole history";
    }
  }
  return EngineReplay{core::EngineRebuilder(rules, up_to)};
}

void Ingestor::MaybeSnapshotEngine(RunState& run, bool force, int64_t now) {
  if (options_.engine_snapshot_steps <= 0 || run.engine == nullptr) return;
  const int64_t last = run.engine->last_step();
  if (last < 0 || last <= run.snapshot_step) return;
  // A forced one (eviction, shutdown) saves its rebuild the replay of the
  // steps since the last snapshot, and costs the whole windows, about
  // 170 KB with the default rules however short the run: 20,000 runs of a
  // few steps each, evicted in turn, made a 3.4 GB database of snapshots.
  // Under a tenth of the interval (1,000 steps by default: about a
  // millisecond, as the restart bench replays 4M steps in 3.7 s) the
  // rebuild replays them instead.
  const int64_t since = last - run.snapshot_step;
  if (since < (force ? options_.engine_snapshot_steps / 10 : options_.engine_snapshot_steps)) {
    return;
  }
  EngineSnapshotRow row;
  row.run_id = run.row.run_id;
  row.attempt = run.row.attempt;
  row.step = last;
  row.skipped = run.attempt_skipped;
  row.overflows = run.attempt_overflows;
  row.written_ms = now;
  row.state = run.engine->SaveState();
  // Written with the steps it has seen, in the same transaction: a failed
  // commit loses both, and the rebuild after it starts from an older one.
  batch_.engine_snapshots.push_back(std::move(row));
  run.snapshot_step = last;
}

}  // namespace trainwatch::server
