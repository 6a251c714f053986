// Stalls and lost ranks from heartbeats (server/ingest/liveness.h), on a
// run's state alone, times given: the learned bound, who is named, the
// checkpoint phase, the cost arithmetic, lost and closing ranks.

#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "ingest/liveness.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;

class LivenessFixture {
 public:
  LivenessFixture() : state_(Row()), liveness_(Options(), &views_) {
    RunView v;
    v.row = Row();
    views_.Set("job", v);
  }

  static RunRow Row() {
    RunRow r;
    r.run_id = "job";
    r.world_size = 4;
    return r;
  }
  static LivenessOptions Options() {
    LivenessOptions o;
    o.stall_floor_ms = 10'000;
    o.stall_step_multiple = 10;
    o.stall_startup_ms = 600'000;
    o.long_phase_ms = 1'800'000;
    o.check_interval_ms = 0;
    o.lost_min_ms = 0;  // 4 intervals of 1 s
    return o;
  }

  void Beat(int rank, int64_t now, int64_t finished, v1::Phase phase = v1::PHASE_UNSPECIFIED,
            const std::string& at = "", int64_t median_ms = 500, bool closing = false) {
    v1::Heartbeat h;
    h.set_run_id("job");
    h.set_rank(rank);
    h.set_host_name("gpu-" + std::to_string(rank));
    h.set_local_rank(rank);
    h.set_finished_step(finished);
    h.set_phase(phase);
    h.set_blocked_at(at);
    h.set_stack(at.empty() ? "" : "train.py:10 in <module>\n" + at);
    h.set_step_ms_median(median_ms);
    h.set_interval_ms(1000);
    h.set_closing(closing);
    liveness_.OnHeartbeat(h, now);
  }
  // Every rank beats at `now` with the run stepping at `step`.
  void Healthy(int64_t now, int64_t step) {
    liveness_.OnProgress("job", step, now);
    for (int r = 0; r < 4; ++r) Beat(r, now, step);
  }
  std::vector<std::pair<IncidentRow, IncidentChange>> Check(int64_t now) {
    changes_.clear();
    liveness_.Check(now, [&](const std::string&) { return &state_; }, &ids_,
                    IncidentSink{&rows_, &changes_});
    return changes_;
  }
  const IncidentRow* Open(core::EventKind kind) const {
    return state_.incidents.FindOpenServerIncident(kind);
  }
  Liveness& liveness() { return liveness_; }
  RunState& state() { return state_; }
  LivenessView view() const { return views_.Get("job")->liveness; }

 private:
  RunViews views_;
  RunState state_;
  Liveness liveness_;
  IdCounters ids_;
  WriteBatch rows_;
  std::vector<std::pair<IncidentRow, IncidentChange>> changes_;
};

TEST_CASE("liveness: a rank stuck outside the collective is named - the others wait",
          "[server][liveness]") {
  LivenessFixture f;
  for (int s = 0; s < 20; ++s) f.Healthy(s * 500, s);  // learned: 500 ms steps
  // From t = 10 s no step: rank 2 is stuck, the others in the all-reduce.
  const int64_t t0 = 9'500;
  for (int64_t t = t0 + 1000; t <= t0 + 10'000; t += 1000) {
    f.Beat(0, t, 19, v1::PHASE_COLLECTIVE, "train.py:80 in main");
    f.Beat(1, t, 19, v1::PHASE_COLLECTIVE, "train.py:80 in main");
    f.Beat(2, t, 19, v1::PHASE_UNSPECIFIED, "data.py:12 in fetch");
    f.Beat(3, t, 19, v1::PHASE_COLLECTIVE, "train.py:80 in main");
    CHECK(f.Check(t).empty());  // within the bound: max(10 s floor, 10 x 500 ms)
  }
  f.Beat(2, t0 + 10'500, 19, v1::PHASE_UNSPECIFIED, "data.py:12 in fetch");
  auto changes = f.Check(t0 + 10'500);
  REQUIRE(changes.size() == 1);
  const IncidentRow& inc = changes[0].first;
  CHECK(changes[0].second == IncidentChange::kOpened);
  CHECK(inc.kind == core::EventKind::kStall);
  CHECK(inc.tier == 2);
  CHECK(inc.detection_step == 20);
  CHECK(inc.title ==
        "stalled: rank 2 on host gpu-2 (local rank 2) is in step 20 at data.py:12 in fetch; "
        "3 ranks wait in a collective at train.py:80 in main (step 20)");
  // The page: how long, the bound, the cost so far (4 ranks x 11 s), the stack.
  const std::string page = f.liveness().PageDetail(inc, t0 + 11'000);
  CHECK(page ==
        "No step for 11 s (the bound: 10 s). Cost so far: 0.012 GPU-hours (4 ranks idle).\n"
        "Stack of rank 2 on host gpu-2 (local rank 2), innermost last:\n"
        "train.py:10 in <module>\ndata.py:12 in fetch");
  // Still stuck, the same picture: no new change (paged once).
  CHECK(f.Check(t0 + 12'000).empty());
}

TEST_CASE("liveness: the stall resolves when the run steps - with its cost", "[server][liveness]") {
  LivenessFixture f;
  for (int s = 0; s < 20; ++s) f.Healthy(s * 500, s);
  for (int64_t t = 10'000; t <= 22'000; t += 1000) {
    for (int r = 0; r < 4; ++r) f.Beat(r, t, 19);
    f.Check(t);
  }
  REQUIRE(f.Open(core::EventKind::kStall) != nullptr);
  // Step 20 arrives 3,600 s after step 19 (t = 9.5 s): 4 ranks for an hour
  // are 4 GPU-hours.
  const int64_t resumed = 9'500 + 3'600'000;
  for (int r = 0; r < 4; ++r) f.Beat(r, resumed - 500, 19);
  f.Check(resumed - 500);
  f.Healthy(resumed, 20);
  auto changes = f.Check(resumed + 1);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].second == IncidentChange::kStateChanged);
  CHECK(changes[0].first.state == IncidentState::kResolved);
  CHECK(changes[0].first.title ==
        "stalled in step 20 for 60 min 0 s, then it stepped on; cost 4.000 GPU-hours (4 ranks)");
  CHECK(f.Open(core::EventKind::kStall) == nullptr);
  CHECK(GpuHours(90 * 60'000, 8) == Approx(12.0));
}

TEST_CASE("liveness: after a rollback the run steps below its old steps - progress - not a stall",
          "[server][liveness]") {
  LivenessFixture f;
  for (int s = 0; s <= 100; ++s) f.Healthy(s * 500, s);
  f.Check(50'000);
  // Rolled back to step 40 at t = 60 s: steps 41.. again, no stall.
  for (int s = 41; s <= 80; ++s) {
    const int64_t t = 60'000 + (s - 41) * 500;
    f.Healthy(t, s);
    CHECK(f.Check(t).empty());
  }
  // Goodput: net progress 80 steps x 500 ms over 79.5 s since the first.
  const LivenessView v = f.view();
  CHECK(v.ranks_alive == 4);
  CHECK(v.step_ms_median == 500);
  CHECK(v.goodput == Approx(80 * 500.0 / 79'500));
  CHECK_FALSE(v.stalled);
}

TEST_CASE("liveness: a checkpoint or an evaluation in progress has the long bound",
          "[server][liveness]") {
  for (const v1::Phase phase : {v1::PHASE_CHECKPOINT, v1::PHASE_EVAL, v1::PHASE_UNSPECIFIED}) {
    LivenessFixture f;
    for (int s = 0; s < 20; ++s) f.Healthy(s * 500, s);
    for (int64_t t = 10'000; t <= 70'000; t += 1000) {
      f.Beat(0, t, 19, phase, "save.py:3 in save");
      for (int r = 1; r < 4; ++r) f.Beat(r, t, 19, v1::PHASE_COLLECTIVE, "train.py:80 in main");
      f.Check(t);
    }
    INFO("phase " << phase);
    CHECK((f.Open(core::EventKind::kStall) != nullptr) == (phase == v1::PHASE_UNSPECIFIED));
  }
}

TEST_CASE("liveness: before the step time is learned the startup bound holds",
          "[server][liveness]") {
  LivenessFixture f;
  f.Healthy(0, 0);
  f.Healthy(500, 1);  // 2 steps: not learned (compilation, warm-up)
  for (int64_t t = 1000; t < 600'000; t += 10'000) {
    for (int r = 0; r < 4; ++r) f.Beat(r, t, 1);
    CHECK(f.Check(t).empty());
  }
  for (int r = 0; r < 4; ++r) f.Beat(r, 601'000, 1);
  CHECK(f.Check(601'000).size() == 1);
}

TEST_CASE("liveness: a rank whose heartbeats stop is lost - not stuck - and a closing one is neither",
          "[server][liveness]") {
  LivenessFixture f;
  for (int s = 0; s < 20; ++s) f.Healthy(s * 500, s);
  // Rank 3 says it is closing; rank 1 falls silent; the run goes on.
  f.Beat(3, 9'600, 19, v1::PHASE_UNSPECIFIED, "", 500, /*closing=*/true);
  auto step_on = [&](int64_t t) {
    const int64_t step = 19 + (t - 9'500) / 100;
    f.liveness().OnProgress("job", step, t);
    f.Beat(0, t, step);
    f.Beat(2, t, step);
  };
  for (int64_t t = 10'000; t <= 13'500; t += 500) {  // within 4 intervals of 1 s
    step_on(t);
    CHECK(f.Check(t).empty());
  }
  step_on(14'100);
  CHECK(f.Check(14'100).size() == 1);
  REQUIRE(f.Open(core::EventKind::kRankLost) != nullptr);
  const std::string title = f.Open(core::EventKind::kRankLost)->title;
  CHECK(title == "rank lost: rank 1 on host gpu-1 (local rank 1), last heard 5 s ago in step 20");
  CHECK(f.Open(core::EventKind::kStall) == nullptr);
  // Its heartbeats come back: resolved.
  step_on(14'500);
  f.Beat(1, 14'500, 69);
  auto changes = f.Check(14'500);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].first.state == IncidentState::kResolved);
  CHECK(changes[0].first.title == title + " (heard from again)");
}

TEST_CASE("liveness: a run ends when every rank's agent closes - not when some are silent",
          "[server][liveness]") {
  LivenessFixture f;
  for (int s = 0; s < 20; ++s) f.Healthy(s * 500, s);
  f.Check(10'000);
  CHECK_FALSE(f.view().ended);
  // Ranks 0 to 2 close; rank 3 is silent (killed): the run has not ended.
  for (int r = 0; r < 3; ++r) f.Beat(r, 10'100, 19, v1::PHASE_UNSPECIFIED, "", 500, true);
  f.Check(10'200);
  CHECK_FALSE(f.view().ended);
  // Rank 3 closes too: ended, and said once the ranks are gone.
  f.Beat(3, 10'300, 19, v1::PHASE_UNSPECIFIED, "", 500, true);
  f.Check(10'400);
  CHECK(f.view().ended);
  CHECK(f.view().ranks_alive == 0);
  f.Check(20'000);
  CHECK(f.view().ended);
  // A new launch heartbeats: the run is no longer ended.
  f.Beat(0, 30'000, -1);
  f.Check(30'100);
  CHECK_FALSE(f.view().ended);
  CHECK(f.view().ranks_alive == 1);
}

TEST_CASE("liveness: ranks that stop seconds apart at the job's end are not lost",
          "[server][liveness]") {
  RunRow row = LivenessFixture::Row();
  RunState state(row);
  LivenessOptions o = LivenessFixture::Options();
  o.lost_min_ms = LivenessOptions().lost_min_ms;
  Liveness liveness(o, nullptr);
  IdCounters ids;
  WriteBatch rows;
  std::vector<std::pair<IncidentRow, IncidentChange>> changes;
  auto beat = [&](int rank, int64_t now) {
    v1::Heartbeat h;
    h.set_run_id("job");
    h.set_rank(rank);
    h.set_finished_step(99);
    h.set_interval_ms(1000);
    liveness.OnHeartbeat(h, now);
  };
  for (int r = 0; r < 4; ++r) beat(r, 0);
  // Ranks 0 and 2 exit first (no closing heartbeat: killed), 1 and 3 go on
  // for 20 s more.
  for (int64_t t = 1000; t <= 20'000; t += 1000) {
    beat(1, t);
    beat(3, t);
    liveness.Check(t, [&](const std::string&) { return &state; }, &ids,
                   IncidentSink{&rows, &changes});
  }
  CHECK(changes.empty());
  CHECK(state.incidents.FindOpenServerIncident(core::EventKind::kRankLost) == nullptr);
}

TEST_CASE("liveness: a straggler is named after the set steps - and not for a few ms of noise",
          "[server][liveness]") {
  // (the other ranks' lead, rank 3's extra, the common rest), in ms: 1.5x
  // by 30 ms; 2.5x by 6 ms, within a scheduler's noise on tiny steps.
  for (const auto& [lead, extra, rest] : {std::tuple<int64_t, int64_t, int64_t>{40, 30, 20},
                                          std::tuple<int64_t, int64_t, int64_t>{2, 6, 2}}) {
    LivenessFixture f;
    std::vector<std::pair<IncidentRow, IncidentChange>> raised;
    for (int s = 0; s <= 150; ++s) {
      const int64_t t = s * 100;
      f.liveness().OnProgress("job", s, t);
      for (int r = 0; r < 4; ++r) {
        v1::Heartbeat h;
        h.set_run_id("job");
        h.set_rank(r);
        h.set_host_name("gpu-" + std::to_string(r));
        h.set_local_rank(r);
        h.set_finished_step(s);
        h.set_interval_ms(1000);
        h.set_window_steps(32);
        h.set_step_ms_median(lead + extra + rest);  // everyone waits for rank 3
        h.set_lead_ms_median(r == 3 ? lead + extra : lead);
        f.liveness().OnHeartbeat(h, t);
      }
      for (auto& c : f.Check(t)) raised.push_back(c);
    }
    INFO("extra " << extra);
    const LivenessView v = f.view();
    REQUIRE(v.slowest.size() == 4);
    CHECK(v.slowest[0].rank == 3);
    // Own time: lead + the common rest (step - the longest lead).
    CHECK(v.slowest[0].ratio == Approx(double(lead + extra + rest) / double(lead + rest)));
    if (extra < Liveness::kStragglerMinMs) {
      CHECK(raised.empty());
      continue;
    }
    // 1.5x for 100 steps (the fixture's straggler_steps): one page, at step 100.
    REQUIRE(raised.size() == 1);
    CHECK(raised[0].first.kind == core::EventKind::kStraggler);
    CHECK(raised[0].first.detection_step == 101);
    CHECK(raised[0].first.title ==
          "straggler: rank 3 on host gpu-3 (local rank 3) takes 1.50x the median rank's time per "
          "step (its lead 70 ms, the median 40 ms): the other ranks wait 33% of each step");
  }
}

TEST_CASE("liveness: a stall open from before a restart resolves when the run steps",
          "[server][liveness]") {
  LivenessFixture f;
  IdCounters ids;
  WriteBatch rows;
  std::vector<std::pair<IncidentRow, IncidentChange>> opened;
  f.state().incidents.RaiseServerIncident(core::EventKind::kStall, 20, "stalled: rank 2", 0, &ids,
                                          IncidentSink{&rows, &opened});
  // Re-sent records up to step 19 after the restart: still stuck in step 20.
  for (int s = 10; s < 20; ++s) f.Healthy(s * 50, s);
  CHECK(f.Check(1'000).empty());
  f.Healthy(1'500, 20);  // step 20 done
  auto changes = f.Check(1'500);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].first.state == IncidentState::kResolved);
  CHECK(changes[0].first.title == "stalled: rank 2 (steps again)");
}

TEST_CASE("liveness: a restart loading its checkpoint is not a stall - its first steps have the "
          "startup bound", "[server][liveness]") {
  LivenessFixture f;
  for (int s = 0; s < 20; ++s) f.Healthy(s * 500, s);  // learned: 500 ms steps
  // The job halts at 10 s (its agents close) and its new launch's agents
  // are heard from at 60 s, before their first step.
  for (int r = 0; r < 4; ++r) f.Beat(r, 10'000, 19, v1::PHASE_UNSPECIFIED, "", 500, true);
  CHECK(f.Check(10'000).empty());
  for (int64_t t = 60'000; t <= 600'000; t += 1'000) {
    for (int r = 0; r < 4; ++r) f.Beat(r, t, -1, v1::PHASE_UNSPECIFIED, "", 0);
    CHECK(f.Check(t).empty());  // within the startup bound (600 s) from 60 s
  }
  for (int r = 0; r < 4; ++r) f.Beat(r, 661'000, -1, v1::PHASE_UNSPECIFIED, "", 0);
  auto changes = f.Check(661'000);  // stuck before its first step: a stall all the same
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].first.kind == core::EventKind::kStall);
}

TEST_CASE("liveness: a run observed - not enforced - stalls as any other", "[server][liveness]") {
  LivenessFixture f;
  f.state().row.observed = true;  // `trainwatch run --observe-only`: its ranks are the trainer's
  for (int s = 0; s < 20; ++s) f.Healthy(s * 500, s);
  for (int r = 0; r < 4; ++r) f.Beat(r, 20'000, 19);
  auto changes = f.Check(20'000);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].first.kind == core::EventKind::kStall);
}

// The follower of a log (`twctl follow`): one heartbeat source, rank 0, whose
// step is the log's last and whose median is the time between its writes.
void LogBeat(Liveness& l, int64_t now, int64_t last_step, int64_t in_step_ms, int64_t median_ms,
             int32_t writes, bool writer_gone = false) {
  v1::Heartbeat h;
  h.set_run_id("job");
  h.set_rank(0);
  h.set_host_name("login-1");
  h.set_from_log(true);
  h.set_finished_step(last_step);
  h.set_in_step_ms(in_step_ms);
  h.set_step_ms_median(median_ms);
  h.set_window_steps(writes);
  h.set_interval_ms(1000);
  h.set_closing(writer_gone);
  l.OnHeartbeat(h, now);
}

TEST_CASE("liveness: a followed log stalls from the timing of its writes alone",
          "[server][liveness]") {
  LivenessFixture f;
  f.state().row.observed = true;
  // A write of 10 steps every 5 s. Before 8 writes the pace is not learned:
  // a silence of 100 s is within the startup bound (600 s).
  for (int w = 0; w < 8; ++w) {
    f.liveness().OnProgress("job", w * 10 + 9, w * 5'000);
    LogBeat(f.liveness(), w * 5'000, w * 10 + 9, 0, w > 0 ? 5'000 : 0, w);
  }
  LogBeat(f.liveness(), 135'000, 79, 100'000, 5'000, 7);
  CHECK(f.Check(135'000).empty());
  // The 8th interval: learned, the bound is 10 x 5 s.
  f.liveness().OnProgress("job", 89, 140'000);
  LogBeat(f.liveness(), 140'000, 89, 0, 5'000, 8);
  LogBeat(f.liveness(), 189'000, 89, 49'000, 5'000, 8);
  CHECK(f.Check(189'000).empty());
  LogBeat(f.liveness(), 191'000, 89, 51'000, 5'000, 8);
  auto changes = f.Check(191'000);
  REQUIRE(changes.size() == 1);
  const IncidentRow& inc = changes[0].first;
  CHECK(inc.kind == core::EventKind::kStall);
  CHECK(inc.detection_step == 90);
  CHECK(inc.title ==
        "stalled: the log has written no step after step 89 for 51 s (it wrote every 5 s); "
        "followed on host login-1");
  // One source, so no lost rank nor straggler; the page's cost is per GPU.
  CHECK(f.liveness().PageDetail(inc, 191'000) ==
        "No step for 51 s (the bound: 50 s). Cost so far: 0.014 GPU-hours (per GPU of the job).");
  // The follower sees the log's writer gone: the job ended, the stall
  // resolves as a job that stopped, and nothing new opens.
  LogBeat(f.liveness(), 200'000, 89, 60'000, 5'000, 8, /*writer_gone=*/true);
  changes = f.Check(200'000);
  REQUIRE(changes.size() == 1);
  CHECK(changes[0].first.state == IncidentState::kResolved);
  CHECK(changes[0].first.title.find("then the job stopped") != std::string::npos);
  for (int64_t t = 201'000; t < 400'000; t += 1'000) {
    LogBeat(f.liveness(), t, 89, t - 140'000, 5'000, 8, true);
    CHECK(f.Check(t).empty());
  }
}

}  // namespace
}  // namespace trainwatch::server
