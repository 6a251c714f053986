// A standby replica's reads (trainwatchd --replica while another replica
// owns the shards). The owner's writer keeps the run views and tells the
// incident watchers of each change as it commits; a standby has no writer,
// so this rebuilds both from the store the owner writes to, every
// refresh_ms:
//   - the runs' rows, one query; a run whose row changed (the owner writes
//     it with every batch that touches the run) or whose incidents changed
//     gets its view rebuilt from the store (RunTable::StoredView), the same
//     view a restarted trainwatchd shows before its engines are rebuilt;
//   - the incidents opened since the last refresh, and the open ones whose
//     state or evidence changed or that closed, handed to the listener as
//     the writer would (opened, state changed, updated).
// A standby's answers therefore lag the owner's by up to refresh_ms plus a
// refresh. A refresh costs a few queries for the incidents and about four
// per run that streamed since the last one, on the store's read
// connection. What only the owner's memory holds (the open agent streams)
// a standby does not know.
//
// Thread-safe: one thread refreshes; views() may be read from any. It reads
// the store as its writer thread would (Store::LoadRuns, MaxIncidentId), so
// nothing may write through `store` meanwhile: on a standby nothing does,
// and Stop() comes before its writer starts at a takeover.

#ifndef TRAINWATCH_SERVER_API_STANDBY_READS_H_
#define TRAINWATCH_SERVER_API_STANDBY_READS_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "ingest/ingest_listener.h"
#include "ingest/run_views.h"
#include "store/store.h"
#include "trainwatch/core/clock.h"

namespace trainwatch::server {

class StandbyReads {
 public:
  // REQUIRES: `store`, `listener` and `clock` outlive this; no writer on
  // `store` until Stop().
  StandbyReads(Store* store, IngestListener* listener, core::Clock* clock, int64_t refresh_ms);
  // Stops the thread.
  ~StandbyReads();
  StandbyReads(const StandbyReads&) = delete;
  StandbyReads& operator=(const StandbyReads&) = delete;

  // Refreshes once now, then every refresh_ms on a thread of its own; a
  // refresh that fails (the database failing over) is logged once per
  // streak and tried again at the next.
  void Start();
  void Stop();

  // One refresh. The first only learns what is there: the incidents it
  // finds are not news, a watcher gets them as its snapshot.
  absl::Status Refresh();

  const RunViews& views() const { return views_; }
  // The clock's time when the last refresh began (what the views are as
  // of); 0 before the first succeeded.
  int64_t as_of_ms() const;

 private:
  // What a refresh compares an incident by.
  struct Seen {
    IncidentState state = IncidentState::kOpen;
    int64_t updated_ms = 0;
  };

  Store* const store_;
  IngestListener* const listener_;
  core::Clock* const clock_;
  const int64_t refresh_ms_;
  RunViews views_;

  // The refreshing thread's (or Refresh's caller's) from here on.
  bool first_ = true;
  std::map<std::string, RunRow> rows_;  // by run id, as last read
  std::map<int64_t, Seen> open_;        // open incidents, by id
  int64_t max_incident_id_ = 0;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by mu_
  int64_t as_of_ms_ = 0;   // guarded by mu_
  std::thread thread_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_API_STANDBY_READS_H_
