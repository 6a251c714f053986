// The incidents of one run. The rule engine speaks of episodes; an operator
// of incidents. This turns each event into the incident of its episode:
// opened, raised to a higher tier, resolved when the episode closes, and,
// after a rollback, resolved once the run passes the detection step again or
// re-opened when the failure comes back.
//
// Writer thread only; no store, no clock: the caller passes the time and
// collects the rows to write.

#ifndef TRAINWATCH_SERVER_INCIDENT_TRACKER_H_
#define TRAINWATCH_SERVER_INCIDENT_TRACKER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "incidents/incident_text.h"
#include "store/store.h"
#include "trainwatch/core/event.h"

namespace trainwatch::server {

// What happened to an incident, as its listeners hear it.
enum class IncidentChange {
  kOpened,
  kUpdated,       // new evidence; the state is as it was
  kStateChanged,  // resolved, re-opened, approved, rejected, ...
};

// Where a change goes: into the batch being written, and to the listeners
// once that batch is durable.
struct IncidentSink {
  WriteBatch* batch = nullptr;
  std::vector<std::pair<IncidentRow, IncidentChange>>* changes = nullptr;

  void Record(const IncidentRow& incident, IncidentChange change) const {
    batch->incidents.push_back(incident);
    changes->emplace_back(incident, change);
  }
};

// Ids are unique across runs; the ingestor owns the counters.
struct IdCounters {
  int64_t next_incident = 1;
  int64_t next_decision = 1;
};

class IncidentTracker {
 public:
  explicit IncidentTracker(std::string run_id) : run_id_(std::move(run_id)) {}

  // Episode numbers restart with each attempt's fresh engine; incidents are
  // keyed by both.
  static uint64_t EpisodeKey(int64_t attempt, uint64_t episode) {
    return (static_cast<uint64_t>(attempt) << 40) | episode;
  }

  // Takes back the run's incidents from the store: every one counts in the
  // totals, the ones not closed stay open. `episode` holds the key.
  void Restore(std::vector<IncidentRow> incidents);

  // Whether the run is followed (RunRow::observed): its incidents say so,
  // and a tier 1 or 3 action is recorded as recommended, not applied.
  void set_observed(bool observed) { observed_ = observed; }

  // The engine's events for a step of `attempt`.
  void OnEvents(int64_t attempt, const std::vector<core::Event>& events, int64_t now,
                IdCounters* ids, const IncidentSink& sink);
  // The run evaluated `last_step`: a watched rollback that held resolves.
  void OnEvaluated(int64_t last_step, int64_t now, const IncidentSink& sink);

  // After a completed rollback: the incident resolves once the run passes
  // `until_step` without a new tier 2 or 3 event, and re-opens otherwise.
  void Watch(int64_t incident_id, int64_t until_step);

  // The open incident with this id, or null.
  IncidentRow* FindOpen(int64_t incident_id);

  // The incidents trainwatchd raises itself from the agents' heartbeats (a
  // stall, a lost rank; liveness.h), not from the engine's events: at most
  // one open per kind, under an episode key no engine episode reaches.
  static constexpr uint64_t kServerEpisodes = uint64_t{1} << 62;
  // The open one of `kind`, or null.
  const IncidentRow* FindOpenServerIncident(core::EventKind kind) const;
  // Opens one (tier 2: paged), or gives an open one of `kind` a new title.
  void RaiseServerIncident(core::EventKind kind, int64_t step, const std::string& title,
                           int64_t now, IdCounters* ids, const IncidentSink& sink);
  // Resolves the open one of `kind`, if any, with its final title.
  void ResolveServerIncident(core::EventKind kind, const std::string& title, int64_t now,
                             const IncidentSink& sink);
  // Replaces an open incident by its new state, forgetting it once closed.
  void Update(const IncidentRow& incident);

  const std::map<uint64_t, IncidentRow>& open() const { return open_; }
  // Incidents ever opened, by tier (an incident raised counts in both).
  const int64_t* totals() const { return totals_; }

 private:
  struct Watched {
    int64_t incident_id = 0;
    uint64_t episode_key = 0;
    int64_t until_step = 0;
  };

  std::string run_id_;
  bool observed_ = false;
  std::map<uint64_t, IncidentRow> open_;  // by episode key
  std::optional<Watched> watch_;
  int64_t totals_[4] = {0, 0, 0, 0};
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_INCIDENT_TRACKER_H_
