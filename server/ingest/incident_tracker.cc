#include "ingest/incident_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainwatch/v1/common.pb.h"

namespace trainwatch::server {

namespace {

IncidentState InitialState(const core::Event& e) {
  if (e.action == core::Action::kPage || e.action == core::Action::kHalt) {
    return IncidentState::kAwaitingDecision;
  }
  // A transient, or a loss-scale overflow the scaler already skipped, is
  // over when it is reported: a record, not an open matter.
  if (e.kind == core::EventKind::kTransient || e.kind == core::EventKind::kLossScaleOverflow) {
    return IncidentState::kResolved;
  }
  return IncidentState::kOpen;
}

int TierIndex(int tier) { return std::clamp(tier, 0, 3); }

}  // namespace

void IncidentTracker::Restore(std::vector<IncidentRow> incidents) {
  for (IncidentRow& i : incidents) {
    totals_[TierIndex(i.tier)]++;
    if (!IsClosed(i.state)) open_[i.episode] = std::move(i);
  }
}

void IncidentTracker::Watch(int64_t incident_id, int64_t until_step) {
  for (const auto& [key, inc] : open_) {
    if (inc.id == incident_id) watch_ = Watched{incident_id, key, until_step};
  }
}

IncidentRow* IncidentTracker::FindOpen(int64_t incident_id) {
  for (auto& [key, inc] : open_) {
    if (inc.id == incident_id) return &inc;
  }
  return nullptr;
}

const IncidentRow* IncidentTracker::FindOpenServerIncident(core::EventKind kind) const {
  auto it = open_.find(kServerEpisodes | static_cast<uint64_t>(kind));
  return it == open_.end() ? nullptr : &it->second;
}

void IncidentTracker::RaiseServerIncident(core::EventKind kind, int64_t step,
                                          const std::string& title, int64_t now, IdCounters* ids,
                                          const IncidentSink& sink) {
  const uint64_t key = kServerEpisodes | static_cast<uint64_t>(kind);
  auto it = open_.find(key);
  if (it != open_.end()) {
    if (it->second.title == title) return;
    it->second.title = title;
    it->second.detection_step = step;
    it->second.updated_ms = now;
    sink.Record(it->second, IncidentChange::kUpdated);
    return;
  }
  IncidentRow inc;
  inc.id = ids->next_incident++;
  inc.run_id = run_id_;
  inc.episode = key;
  inc.tier = 2;
  inc.state = IncidentState::kOpen;
  inc.kind = kind;
  inc.title = title;
  inc.onset_step = step;
  inc.detection_step = step;
  inc.opened_ms = now;
  inc.updated_ms = now;
  inc.observed = observed_;
  totals_[TierIndex(inc.tier)]++;
  sink.Record(open_.emplace(key, std::move(inc)).first->second, IncidentChange::kOpened);
}

void IncidentTracker::ResolveServerIncident(core::EventKind kind, const std::string& title,
                                            int64_t now, const IncidentSink& sink) {
  auto it = open_.find(kServerEpisodes | static_cast<uint64_t>(kind));
  if (it == open_.end()) return;
  IncidentRow& inc = it->second;
  inc.title = title;
  inc.state = IncidentState::kResolved;
  inc.updated_ms = now;
  inc.closed_ms = now;
  sink.Record(inc, IncidentChange::kStateChanged);
  open_.erase(it);
}

void IncidentTracker::Update(const IncidentRow& incident) {
  for (auto it = open_.begin(); it != open_.end(); ++it) {
    if (it->second.id != incident.id) continue;
    if (IsClosed(incident.state)) {
      open_.erase(it);
    } else {
      it->second = incident;
    }
    return;
  }
}

void IncidentTracker::OnEvaluated(int64_t last_step, int64_t now, const IncidentSink& sink) {
  if (!watch_ || last_step < watch_->until_step) return;
  auto w = open_.find(watch_->episode_key);
  if (w != open_.end()) {
    IncidentRow inc = w->second;
    inc.state = IncidentState::kResolved;
    inc.closed_ms = now;
    inc.updated_ms = now;
    sink.Record(inc, IncidentChange::kStateChanged);
    open_.erase(w);
  }
  watch_.reset();
}

void IncidentTracker::OnEvents(int64_t attempt, const std::vector<core::Event>& events,
                               int64_t now, IdCounters* ids, const IncidentSink& sink) {
  for (const core::Event& e : events) {
    const uint64_t key = EpisodeKey(attempt, e.episode);
    if (watch_ && e.tier >= 2 && e.action != core::Action::kNone) {
      // The failure came back after the rollback: the incident re-opens.
      auto w = open_.find(watch_->episode_key);
      if (w != open_.end()) {
        w->second.state = IncidentState::kAwaitingDecision;
        w->second.updated_ms = now;
        w->second.title = absl::StrCat("recurred after rollback: ", w->second.title);
        sink.Record(w->second, IncidentChange::kStateChanged);
      }
      watch_.reset();
    }
    auto it = open_.find(key);
    bool opened = false;
    if (it == open_.end()) {
      if (e.action == core::Action::kNone) {
        // A note about an episode whose incident already closed.
        sink.batch->events.push_back({run_id_, 0, e, now});
        continue;
      }
      IncidentRow inc;
      inc.id = ids->next_incident++;
      inc.run_id = run_id_;
      inc.episode = key;
      inc.tier = e.tier;
      inc.state = InitialState(e);
      inc.kind = e.kind;
      inc.onset_step = e.onset_step;
      inc.opened_ms = now;
      inc.observed = observed_;
      if (IsClosed(inc.state)) inc.closed_ms = now;
      it = open_.emplace(key, std::move(inc)).first;
      totals_[TierIndex(e.tier)]++;
      opened = true;
    }
    IncidentRow& inc = it->second;
    const IncidentState before = inc.state;
    if (opened && (e.action == core::Action::kSkipUpdate || e.action == core::Action::kHalt)) {
      // The agents acted on their own (same rules, same numbers): recorded
      // like a human decision, with the rule as the actor. In a followed
      // run nothing could act: the record says what was recommended.
      const bool halt = e.action == core::Action::kHalt;
      const int64_t did = ids->next_decision++;
      trainwatch::v1::Decision d;
      d.set_decision_id(absl::StrCat("D-", did));
      d.set_incident_id(inc.public_id());
      d.set_run_id(run_id_);
      d.mutable_actor()->set_kind(trainwatch::v1::ACTOR_KIND_SERVER);
      d.mutable_actor()->set_id(absl::StrCat("rule:", core::EventKindName(e.kind)));
      d.mutable_actor()->set_via(observed_ ? "follow" : "agent");
      d.mutable_decided_at()->set_seconds(now / 1000);
      const std::string comment =
          observed_ ? absl::StrCat(halt ? "halt" : "skip", " recommended, not applied (",
                                   kObservedNotEnforced, "): ", e.reason)
                    : e.reason;
      d.set_comment(comment);
      const char* kind = observed_ ? (halt ? "halt_recommended" : "skip_recommended")
                                   : (halt ? "halt" : "skip_update");
      sink.batch->decisions.push_back(
          {did, inc.id, run_id_, d.actor().id(), kind, comment, d.SerializeAsString(), "", now});
    }
    if (e.action != core::Action::kNone && (opened || e.tier >= inc.tier)) {
      // The event with the highest tier so far defines the incident.
      if (e.tier > inc.tier) totals_[TierIndex(e.tier)]++;
      inc.tier = e.tier;
      inc.kind = e.kind;
      inc.title = absl::StrFormat("tier %d %s at step %d: %s", e.tier,
                                  core::EventKindName(e.kind), e.step, e.reason);
      if (inc.title.size() > 240) inc.title = inc.title.substr(0, 237) + "...";
      inc.onset_step = std::min(inc.onset_step, e.onset_step);
      inc.detection_step = e.step;
      inc.recommended_checkpoint_step = e.recommended_checkpoint_step;
      inc.recommended_checkpoint_uri = e.recommended_checkpoint_uri;
      if (!e.shards.empty()) inc.shards = e.shards;
      if (!e.shard_names.empty()) inc.shard_names = e.shard_names;
      inc.actions = e.recommended_actions;
      if (!opened && (e.action == core::Action::kPage || e.action == core::Action::kHalt) &&
          !IsClosed(inc.state) && inc.state != IncidentState::kRollingBack) {
        inc.state = IncidentState::kAwaitingDecision;
      }
    }
    if (e.closes_episode && !IsClosed(inc.state) && inc.state != IncidentState::kRollingBack) {
      inc.state = IncidentState::kResolved;
      inc.closed_ms = now;
    }
    inc.updated_ms = now;
    sink.batch->events.push_back({run_id_, inc.id, e, now});
    sink.Record(inc, opened                 ? IncidentChange::kOpened
                     : inc.state != before ? IncidentChange::kStateChanged
                                           : IncidentChange::kUpdated);
    if (IsClosed(inc.state)) open_.erase(it);
  }
}

}  // namespace trainwatch::server
