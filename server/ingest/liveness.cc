#include "ingest/liveness.h"

#include <algorithm>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;

namespace {

constexpr size_t kMaxTitle = 240;
// A run none of whose ranks was heard from for this long is forgotten.
constexpr int64_t kForgetMs = 3'600'000;

const char* PhaseName(v1::Phase p) {
  switch (p) {
    case v1::PHASE_FORWARD: return "forward";
    case v1::PHASE_BACKWARD: return "backward";
    case v1::PHASE_COLLECTIVE: return "a collective";
    case v1::PHASE_OPTIMIZER: return "the optimizer";
    case v1::PHASE_CHECKPOINT: return "a checkpoint";
    case v1::PHASE_EVAL: return "evaluation";
    case v1::PHASE_DATA: return "data loading";
    default: return "";
  }
}

std::string Seconds(int64_t ms) {
  if (ms < 120'000) return absl::StrFormat("%.0f s", ms / 1000.0);
  if (ms < 7'200'000) return absl::StrFormat("%d min %d s", ms / 60'000, ms / 1000 % 60);
  return absl::StrFormat("%d h %d min", ms / 3'600'000, ms / 60'000 % 60);
}

std::string Host(const v1::Heartbeat& h) {
  std::string s = absl::StrCat("rank ", h.rank());
  if (!h.host_name().empty()) absl::StrAppend(&s, " on host ", h.host_name());
  if (!h.device().empty()) {
    absl::StrAppend(&s, " (", h.device(), ")");
  } else if (h.local_rank() >= 0 && !h.host_name().empty()) {
    absl::StrAppend(&s, " (local rank ", h.local_rank(), ")");
  }
  return s;
}

// "in backward at train.py:57 in main", or less where less is known.
std::string Position(const v1::Heartbeat& h) {
  std::string s;
  if (const char* p = PhaseName(h.phase()); *p != '\0') absl::StrAppend(&s, " in ", p);
  if (!h.blocked_at().empty()) absl::StrAppend(&s, " at ", h.blocked_at());
  return s;
}

std::string Cut(std::string s) {
  if (s.size() > kMaxTitle) s = s.substr(0, kMaxTitle - 3) + "...";
  return s;
}

}  // namespace

double GpuHours(int64_t ms, int64_t ranks) {
  return static_cast<double>(ms) * static_cast<double>(ranks) / 3.6e6;
}

void Liveness::OnHeartbeat(const v1::Heartbeat& h, int64_t now) {
  Run& run = runs_[h.run_id()];
  if (run.first_seen_ms == 0) run.first_seen_ms = run.last_progress_ms = now;
  if (h.closing() || h.untimed()) {  // the rank's job ended (its silence is not a
                                     // loss), or it does not time its steps
    run.ranks.erase(h.rank());
    // The run ended when its last rank closed.
    run.ended = h.closing() && run.ranks.empty();
    return;
  }
  run.ended = run.end_shown = false;
  run.from_log = h.from_log();
  auto [it, added] = run.ranks.try_emplace(h.rank());
  RankLiveness& r = it->second;
  if (h.finished_step() < 0 && (added || r.heartbeat.finished_step() >= 0)) {
    // A rank's new launch, before its first step (started, or restarted
    // loading a checkpoint): the run's bound starts over from the startup
    // one, from now.
    run.steps_seen = 0;
    run.last_progress_ms = std::max(run.last_progress_ms, now);
  }
  r.rank = h.rank();
  r.heartbeat = h;
  r.received_ms = now;
  run.world_size = std::max(run.world_size, h.rank() + 1);
}

void Liveness::OnProgress(const std::string& run_id, int64_t last_step, int64_t now) {
  auto it = runs_.find(run_id);
  if (it == runs_.end()) {
    if (last_step < 0) return;
    it = runs_.emplace(run_id, Run()).first;
    it->second.first_seen_ms = now;
  }
  Run& run = it->second;
  // Any new last step is progress: after a rollback the run steps on from
  // its checkpoint, below the steps it had made.
  if (last_step == run.last_step) return;
  if (run.first_step < 0) {
    run.first_step = last_step;
    run.first_step_ms = now;
  }
  run.steps_seen += run.last_step >= 0 && last_step > run.last_step ? last_step - run.last_step : 1;
  run.last_step = last_step;
  run.last_progress_ms = now;
}

bool Liveness::Alive(const RankLiveness& r, int64_t now) const {
  const int64_t interval = r.heartbeat.interval_ms() > 0 ? r.heartbeat.interval_ms() : 5000;
  return now - r.received_ms <= std::max(options_.lost_heartbeats * interval, options_.lost_min_ms);
}

int64_t Liveness::Bound(const Run& run, int64_t now) const {
  int64_t median = 0, window = 0;
  bool long_phase = false;
  for (const auto& [rank, r] : run.ranks) {
    if (!Alive(r, now)) continue;
    median = std::max(median, r.heartbeat.step_ms_median());
    window = std::max<int64_t>(window, r.heartbeat.window_steps());
    long_phase |= r.heartbeat.phase() == v1::PHASE_CHECKPOINT ||
                  r.heartbeat.phase() == v1::PHASE_EVAL;
  }
  // A log's pace is learned from its writes, which may each hold many steps.
  const bool learned = run.from_log ? window >= kLearnedSteps : run.steps_seen >= kLearnedSteps;
  int64_t bound = learned && median > 0
                      ? static_cast<int64_t>(options_.stall_step_multiple *
                                             static_cast<double>(median))
                      : options_.stall_startup_ms;
  bound = std::max(bound, options_.stall_floor_ms);
  if (long_phase) bound = std::max(bound, options_.long_phase_ms);
  return bound;
}

std::string Liveness::Where(Run& run, int64_t now) const {
  std::vector<const RankLiveness*> alive;
  for (const auto& [rank, r] : run.ranks) {
    if (Alive(r, now)) alive.push_back(&r);
  }
  if (alive.empty()) return "no rank is heard from";
  int64_t lowest = alive[0]->heartbeat.finished_step();
  for (const RankLiveness* r : alive) lowest = std::min(lowest, r->heartbeat.finished_step());
  // Behind: of the ranks in the lowest step, those not waiting in a
  // collective for the others. Where that singles out none or all of them
  // (every one is in a collective; or none is known to be, as when DDP's
  // all-reduce runs inside backward), the smallest group of them by
  // position when it is a minority (one bad host among thousands), else
  // all of them.
  std::vector<const RankLiveness*> low, behind;
  for (const RankLiveness* r : alive) {
    if (r->heartbeat.finished_step() != lowest) continue;
    low.push_back(r);
    if (r->heartbeat.phase() != v1::PHASE_COLLECTIVE) behind.push_back(r);
  }
  if (behind.empty() || behind.size() == low.size()) {
    std::map<std::pair<int, std::string>, std::vector<const RankLiveness*>> by_position;
    for (const RankLiveness* r : low) {
      by_position[{r->heartbeat.phase(), r->heartbeat.blocked_at()}].push_back(r);
    }
    const std::vector<const RankLiveness*>* fewest = nullptr;
    for (const auto& [position, ranks] : by_position) {
      if (fewest == nullptr || ranks.size() < fewest->size()) fewest = &ranks;
    }
    behind = fewest->size() * 2 < low.size() ? *fewest : low;
  }
  std::vector<const RankLiveness*> waiting;
  for (const RankLiveness* r : alive) {
    if (std::find(behind.begin(), behind.end(), r) == behind.end()) waiting.push_back(r);
  }
  const v1::Heartbeat& first = behind.front()->heartbeat;
  run.stack = first.stack().empty() ? "" : absl::StrCat("Stack of ", Host(first),
                                                        ", innermost last:\n", first.stack());
  std::string s;
  if (behind.size() == 1) {
    s = absl::StrCat(Host(first), " is in step ", lowest + 1, Position(first));
  } else {
    std::vector<std::string> ranks;
    for (size_t i = 0; i < behind.size() && i < 4; ++i) {
      ranks.push_back(absl::StrCat(behind[i]->rank));
    }
    s = absl::StrCat(behind.size(), " ranks (", absl::StrJoin(ranks, ", "),
                     behind.size() > 4 ? ", ..." : "", ") are in step ", lowest + 1,
                     Position(first), "; ", Host(first));
  }
  // The others, by where they are.
  std::map<std::tuple<int64_t, int, std::string>, int> groups;
  for (const RankLiveness* r : waiting) {
    groups[{r->heartbeat.finished_step(), r->heartbeat.phase(), r->heartbeat.blocked_at()}]++;
  }
  for (const auto& [key, n] : groups) {
    v1::Heartbeat h;
    h.set_phase(static_cast<v1::Phase>(std::get<1>(key)));
    h.set_blocked_at(std::get<2>(key));
    absl::StrAppend(&s, "; ", n, n == 1 ? " rank waits" : " ranks wait", Position(h),
                    " (step ", std::get<0>(key) + 1, ")");
  }
  return s;
}

std::string Liveness::LogWhere(const Run& run, int64_t now) const {
  const RankLiveness* follower = nullptr;
  for (const auto& [rank, r] : run.ranks) {
    if (Alive(r, now)) follower = &r;
  }
  if (follower == nullptr) return "no follower is heard from";
  const v1::Heartbeat& h = follower->heartbeat;
  std::string s = absl::StrCat("the log has written no step after step ", h.finished_step(),
                               " for ", Seconds(h.in_step_ms() + now - follower->received_ms));
  if (h.step_ms_median() > 0) {
    absl::StrAppend(&s, " (it wrote every ", Seconds(h.step_ms_median()), ")");
  }
  if (!h.host_name().empty()) absl::StrAppend(&s, "; followed on host ", h.host_name());
  return s;
}

void Liveness::Check(int64_t now, const std::function<RunState*(const std::string&)>& run,
                     IdCounters* ids, const IncidentSink& sink) {
  if (now - last_check_ms_ < options_.check_interval_ms) return;
  last_check_ms_ = now;
  for (auto it = runs_.begin(); it != runs_.end();) {
    Run& r = it->second;
    int64_t heard = 0;
    for (const auto& [rank, l] : r.ranks) heard = std::max(heard, l.received_ms);
    const bool open = r.stall_started_ms > 0;
    if (!open && now - std::max(heard, r.last_progress_ms) > kForgetMs) {
      it = runs_.erase(it);
      continue;
    }
    if (!r.ranks.empty() || open) {
      if (RunState* state = run(it->first); state != nullptr) {
        LivenessView view;
        CheckRun(r, *state, now, ids, sink, &view);
        r.published = view.ranks_alive > 0;
        if (views_ != nullptr) views_->SetLiveness(it->first, std::move(view));
      }
    } else if (r.published || r.ended != r.end_shown) {  // its last agent closed:
      r.published = false;                                 // only that to show
      r.end_shown = r.ended;
      LivenessView view;
      view.ended = r.ended;
      if (views_ != nullptr) views_->SetLiveness(it->first, std::move(view));
    }
    ++it;
  }
}

void Liveness::CheckRun(Run& run, RunState& state, int64_t now, IdCounters* ids,
                        const IncidentSink& sink, LivenessView* view) {
  IncidentTracker& incidents = state.incidents;
  const int64_t ranks = std::max<int64_t>(state.row.world_size, run.world_size);
  int alive = 0;
  std::vector<const RankLiveness*> lost;
  for (const auto& [rank, r] : run.ranks) {
    if (Alive(r, now)) {
      ++alive;
    } else {
      lost.push_back(&r);
    }
  }
  // A stall: no step for longer than the bound, the ranks' agents alive.
  const int64_t quiet = now - run.last_progress_ms;
  if (run.stall_started_ms > 0 && (run.last_progress_ms > run.stall_started_ms || alive == 0)) {
    // From the last step before the stall to the step after it, or to the
    // job's end.
    const int64_t stalled =
        (alive == 0 ? now : run.last_progress_ms) - run.stall_since_progress_ms;
    incidents.ResolveServerIncident(
        core::EventKind::kStall,
        Cut(absl::StrFormat("stalled in step %d for %s, %s; cost %.3f GPU-hours (%d ranks)",
                            run.stall_step + 1, Seconds(stalled),
                            alive == 0 ? "then the job stopped" : "then it stepped on",
                            GpuHours(stalled, ranks), ranks)),
        now, sink);
    run.stall_started_ms = 0;
  } else if (alive > 0 && quiet > Bound(run, now)) {
    if (run.stall_started_ms == 0) {
      run.stall_started_ms = now;
      run.stall_since_progress_ms = run.last_progress_ms;
      run.stall_step = run.last_step;
    }
    incidents.RaiseServerIncident(
        core::EventKind::kStall, run.last_step + 1,
        Cut(absl::StrCat("stalled: ", run.from_log ? LogWhere(run, now) : Where(run, now))), now,
        ids, sink);
  } else if (const IncidentRow* restored =
                 incidents.FindOpenServerIncident(core::EventKind::kStall);
             restored != nullptr && run.stall_started_ms == 0 &&
             run.last_step >= restored->detection_step) {
    // Open from before a restart of trainwatchd (its start is not known
    // here), and the run finished the step it was stuck in.
    incidents.ResolveServerIncident(core::EventKind::kStall,
                                    Cut(absl::StrCat(restored->title, " (steps again)")), now,
                                    sink);
  }
  // Lost ranks: silent while others are heard from (a log's follower is
  // one, and no rank).
  if (!lost.empty() && alive > 0 && !run.from_log) {
    std::vector<std::string> names;
    for (const RankLiveness* r : lost) {
      if (names.size() == 3) {
        names.push_back(absl::StrCat("and ", lost.size() - 3, " more"));
        break;
      }
      names.push_back(absl::StrCat(Host(r->heartbeat), ", last heard ",
                                   Seconds(now - r->received_ms), " ago in step ",
                                   r->heartbeat.finished_step() + 1));
    }
    incidents.RaiseServerIncident(
        core::EventKind::kRankLost, run.last_step + 1,
        Cut(absl::StrCat(lost.size() == 1 ? "rank lost: " : "ranks lost: ",
                         absl::StrJoin(names, "; "))),
        now, ids, sink);
  } else if (const IncidentRow* open = incidents.FindOpenServerIncident(core::EventKind::kRankLost);
             open != nullptr) {
    incidents.ResolveServerIncident(
        core::EventKind::kRankLost,
        Cut(absl::StrCat(open->title, alive > 0 ? " (heard from again)" : " (the job stopped)")),
        now, sink);
  }
  view->last_step_ms = run.last_progress_ms;
  // Goodput: the run's net progress at its median step time, over the time
  // since its first step here; stalls and steps trained again after a
  // rollback lower it.
  view->bound_ms = Bound(run, now);
  view->stalled = run.stall_started_ms > 0;
  view->ranks_alive = alive;
  view->ranks_lost = alive > 0 ? static_cast<int32_t>(lost.size()) : 0;
  for (const auto& [rank, r] : run.ranks) {
    if (Alive(r, now)) view->step_ms_median = std::max(view->step_ms_median,
                                                       r.heartbeat.step_ms_median());
  }
  if (view->step_ms_median > 0 && run.first_step >= 0 && now > run.first_step_ms) {
    view->goodput = std::clamp(static_cast<double>(std::max<int64_t>(run.last_step - run.first_step, 0)) *
                                   static_cast<double>(view->step_ms_median) /
                                   static_cast<double>(now - run.first_step_ms),
                               0.0, 1.0);
  }
  if (!run.from_log) CheckPace(run, incidents, now, ids, sink, view);
  if (alive == 0) run.ranks.clear();  // the job stopped (or restarts): nothing is lost
}

std::vector<RankTiming> Liveness::Paces(const Run& run, int64_t now,
                                        int64_t* median_lead) const {
  std::vector<const RankLiveness*> timed;
  int64_t step = 0;
  for (const auto& [rank, r] : run.ranks) {
    if (!Alive(r, now) || r.heartbeat.window_steps() < kPaceWindow) continue;
    timed.push_back(&r);
    step = std::max(step, r.heartbeat.step_ms_median());
  }
  std::vector<RankTiming> paces;  // one rank alone is its own median
  if (timed.empty() || step <= 0) return paces;
  std::vector<int64_t> leads;
  int64_t longest = 0;
  for (const RankLiveness* r : timed) {
    leads.push_back(r->heartbeat.lead_ms_median());
    longest = std::max(longest, r->heartbeat.lead_ms_median());
  }
  std::nth_element(leads.begin(), leads.begin() + leads.size() / 2, leads.end());
  *median_lead = leads[leads.size() / 2];
  // Every rank waits for the slowest, then all do the step's common rest
  // together: a rank's own time is its lead plus that rest.
  const double rest = static_cast<double>(std::max<int64_t>(step - longest, 0));
  const double median_own = static_cast<double>(*median_lead) + rest;
  for (const RankLiveness* r : timed) {
    RankTiming t;
    t.rank = r->rank;
    t.host = r->heartbeat.host_name();
    t.lead_ms = r->heartbeat.lead_ms_median();
    t.ratio = median_own > 0 ? (static_cast<double>(t.lead_ms) + rest) / median_own : 1.0;
    paces.push_back(std::move(t));
  }
  std::sort(paces.begin(), paces.end(), [](const RankTiming& a, const RankTiming& b) {
    return a.ratio != b.ratio ? a.ratio > b.ratio : a.rank < b.rank;
  });
  return paces;
}

void Liveness::CheckPace(Run& run, IncidentTracker& incidents, int64_t now, IdCounters* ids,
                         const IncidentSink& sink, LivenessView* view) {
  int64_t median_lead = 0;
  std::vector<RankTiming> paces = Paces(run, now, &median_lead);
  // Past the ratio, and by a margin the clock and the scheduler cannot make
  // up: at least kStragglerMinMs, and a tenth of the step.
  const bool slow =
      !paces.empty() && paces[0].ratio >= options_.straggler_ratio &&
      paces[0].lead_ms - median_lead >= std::max<int64_t>(kStragglerMinMs,
                                                          view->step_ms_median / 10) &&
      run.stall_started_ms == 0;
  if (!slow) {
    run.straggler = -1;
    if (const IncidentRow* open = incidents.FindOpenServerIncident(core::EventKind::kStraggler);
        open != nullptr) {
      incidents.ResolveServerIncident(core::EventKind::kStraggler,
                                      Cut(absl::StrCat(open->title, " (keeps pace again)")),
                                      now, sink);
    }
  } else {
    const RankTiming& s = paces[0];
    if (run.straggler != s.rank) {
      run.straggler = s.rank;
      run.straggler_since_step = run.last_step;
    }
    const int64_t steps = run.last_step - run.straggler_since_step;
    const bool paged = run.straggler_paged == s.rank &&
                       incidents.FindOpenServerIncident(core::EventKind::kStraggler) != nullptr;
    if (steps >= options_.straggler_steps && !paged) {  // its ratio's drift is no news
      run.straggler_paged = s.rank;
      const v1::Heartbeat& h = run.ranks.at(s.rank).heartbeat;
      const double waited = view->step_ms_median > 0
                                ? 100.0 * static_cast<double>(s.lead_ms - median_lead) /
                                      static_cast<double>(view->step_ms_median)
                                : 0.0;
      incidents.RaiseServerIncident(
          core::EventKind::kStraggler, run.last_step + 1,
          Cut(absl::StrFormat("straggler: %s takes %.2fx the median rank's time per step (its "
                              "lead %d ms, the median %d ms): the other ranks wait %.0f%% of "
                              "each step",
                              Host(h), s.ratio, s.lead_ms, median_lead, waited)),
          now, ids, sink);
    }
  }
  if (paces.size() > kSlowestRanks) paces.resize(kSlowestRanks);
  view->slowest = std::move(paces);
}

std::string Liveness::PageDetail(const IncidentRow& incident, int64_t now) const {
  if (incident.kind != core::EventKind::kStall || incident.closed_ms != 0) return "";
  auto it = runs_.find(incident.run_id);
  if (it == runs_.end() || it->second.stall_started_ms == 0) return "";
  const Run& run = it->second;
  const int64_t quiet = now - run.stall_since_progress_ms;
  const int64_t ranks = std::max<int64_t>(run.world_size, 1);
  // A followed log does not say on how many GPUs its job runs.
  std::string s = absl::StrFormat(
      "No step for %s (the bound: %s). Cost so far: %.3f GPU-hours (%s).", Seconds(quiet),
      Seconds(Bound(run, now)), GpuHours(quiet, ranks),
      run.from_log ? "per GPU of the job" : absl::StrCat(ranks, " ranks idle"));
  if (!run.stack.empty()) absl::StrAppend(&s, "\n", run.stack);
  return s;
}

}  // namespace trainwatch::server
