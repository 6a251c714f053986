// The engine snapshots' policy (when one is written) and the replays a
// rebuild, a rollback or a resume starts from (engine_snapshots.h).

#include "ingest/engine_snapshots.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace trainwatch::server {

bool EngineReplay::Feed(const StepRow& s, const std::string& checkpoint_uri) {
  core::StepRecord rec = s.View();
  rec.checkpoint_uri = checkpoint_uri;
  if (!rebuild.Feed(rec)) return false;
  skipped += s.decision == static_cast<int>(core::Decision::kSkipUpdate);
  overflows += s.loss_scale_overflow();
  return true;
}

absl::StatusOr<EngineReplay> EngineSnapshots::StartReplay(const std::string& run_id,
                                                          int64_t attempt, int64_t up_to,
                                                          const core::RuleConfig& rules) {
  if (options_->engine_snapshot_steps > 0) {
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
      if (engine.ok()) {
        views_->Count(&IngestStats::engine_snapshots_loaded_total);
        return EngineReplay{core::EngineRebuilder(*std::move(engine), up_to), row.step,
                            row.skipped, row.overflows};
      }
      views_->Count(&IngestStats::engine_snapshots_refused_total);
      LOG(WARNING) << "run " << run_id << " attempt " << attempt
                   << ": the engine snapshot at step " << row.step
                   << " is not used (" << engine.status()
                   << "); replaying the attempt's whole history";
    }
  }
  return EngineReplay{core::EngineRebuilder(rules, up_to)};
}

void EngineSnapshots::MaybeSave(RunState& run, bool force, int64_t now) {
  if (options_->engine_snapshot_steps <= 0 || run.engine == nullptr) return;
  const int64_t last = run.engine->last_step();
  if (last < 0 || last <= run.snapshot_step) return;
  // A forced one (eviction, shutdown) saves its rebuild the replay of the
  // steps since the last snapshot, but costs the whole windows however short
  // the run: runs of a few steps each, evicted in turn, would fill the
  // database with snapshots. Under a tenth of the interval the rebuild
  // replays the steps instead, which is cheaper (make bench: restart).
  const int64_t since = last - run.snapshot_step;
  if (since < (force ? options_->engine_snapshot_steps / 10 : options_->engine_snapshot_steps)) {
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
  batch_->rows.engine_snapshots.push_back(std::move(row));
  run.snapshot_step = last;
}

int64_t EngineSnapshots::OpenAttempt(RunState& run, int64_t up_to_step, AttemptStart start,
                                     int64_t incident_id, int32_t world_size, int64_t now) {
  AttemptCopy copy;
  copy.run_id = run.row.run_id;
  copy.from_attempt = run.row.attempt;
  copy.to_attempt = run.row.attempt + 1;
  copy.up_to_step = up_to_step;
  copy.start = start;
  copy.incident_id = incident_id;
  if (start == AttemptStart::kResume) copy.incarnation = run.row.incarnation;
  copy.started_ms = now;
  batch_->rows.attempt_copies.push_back(copy);
  run.has_latest = false;
  // From the old attempt's newest engine snapshot at or before the step,
  // when one is usable.
  absl::StatusOr<EngineReplay> started =
      StartReplay(copy.run_id, copy.from_attempt, copy.up_to_step, run.rules);
  if (!started.ok()) {
    LOG(ERROR) << "run " << copy.run_id << ": reading the engine snapshots: " << started.status();
    started = EngineReplay{core::EngineRebuilder(run.rules, copy.up_to_step)};
  }
  EngineReplay& replay = *started;
  auto feed = [&](const StepRow& s, const std::string& ckpt) {
    if (replay.Feed(s, ckpt) || s.step == replay.snapshot_step) {
      run.latest = s;
      run.has_latest = true;
    }
  };
  absl::Status st =
      store_->ForEachStep(copy.run_id, copy.from_attempt, feed, replay.after());
  if (!st.ok()) LOG(ERROR) << "run " << copy.run_id << ": rebuilding the engine: " << st;
  // The old attempt's records evaluated in this batch are not in the store
  // yet; the copy takes them (it runs after the steps), and so must the
  // engine. They come after the stored ones, in step order.
  const int64_t stored_last = run.has_latest ? run.latest.step : -1;
  for (const WriteBatch::Step& w : batch_->rows.steps) {
    if (w.run_id == copy.run_id && w.attempt == copy.from_attempt && !w.step.late &&
        w.step.step > stored_last) {
      feed(w.step, "");
    }
  }
  absl::StatusOr<std::vector<CheckpointRow>> cks = store_->Checkpoints(copy.run_id);
  if (cks.ok()) {
    for (const CheckpointRow& c : *cks) replay.rebuild.NoteCheckpoint(c.step, c.uri);
  }
  for (const CheckpointRow& c : batch_->rows.checkpoints) {
    if (c.run_id == copy.run_id) replay.rebuild.NoteCheckpoint(c.step, c.uri);
  }
  const int64_t fed = replay.rebuild.fed();
  run.engine = std::move(replay.rebuild).Finish();
  // The new attempt holds copies of these steps; its first snapshot comes
  // with its next evaluated step.
  run.attempt_skipped = replay.skipped;
  run.attempt_overflows = replay.overflows;
  run.snapshot_step = -1;
  run.row.attempt = copy.to_attempt;
  run.row.world_size = world_size;
  run.row.last_step = copy.up_to_step;
  run.row_dirty = true;
  run.pending.clear();
  return fed;
}

}  // namespace trainwatch::server
