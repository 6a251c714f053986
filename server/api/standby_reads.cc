#include "api/standby_reads.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <vector>

#include "common/log.h"
#include "ingest/run_table.h"

namespace trainwatch::server {

namespace {

// Every incident the filter matches, page by page.
absl::StatusOr<std::vector<IncidentRow>> AllIncidents(Store* store, IncidentFilter f) {
  constexpr int kPage = 1000;
  f.limit = kPage;
  std::vector<IncidentRow> all;
  for (;;) {
    absl::StatusOr<std::vector<IncidentRow>> page = store->ListIncidents(f);
    if (!page.ok()) return page.status();
    all.insert(all.end(), page->begin(), page->end());
    if (static_cast<int>(page->size()) < kPage) return all;
    f.after_id = page->back().id;
  }
}

}  // namespace

StandbyReads::StandbyReads(Store* store, IngestListener* listener, core::Clock* clock,
                           int64_t refresh_ms)
    : store_(store), listener_(listener), clock_(clock), refresh_ms_(refresh_ms) {}

StandbyReads::~StandbyReads() { Stop(); }

int64_t StandbyReads::as_of_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return as_of_ms_;
}

void StandbyReads::Start() {
  thread_ = std::thread([this] {
    bool failing = false;
    for (;;) {
      absl::Status s = Refresh();
      if (!s.ok() && !failing) {
        LOG(WARNING) << "standby: reading the store for the operator API: " << s
                     << "; its answers stay as of the last refresh until one succeeds";
      } else if (s.ok() && failing) {
        LOG(INFO) << "standby: the store is read again";
      }
      failing = !s.ok();
      std::unique_lock<std::mutex> lock(mu_);
      if (wake_.wait_for(lock, std::chrono::milliseconds(refresh_ms_),
                         [&] { return stopping_; })) {
        return;
      }
    }
  });
}

void StandbyReads::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::Status StandbyReads::Refresh() {
  const int64_t began = clock_->NowMs();
  absl::StatusOr<std::vector<RunRow>> runs = store_->LoadRuns();
  if (!runs.ok()) return runs.status();
  // The incidents newer than the newest seen (at the first refresh: only
  // that newest id, what is there already is not news), then the open ones.
  // Read in this order, one committed between the two reads is open and
  // newer than max_id: it is left to the next refresh, which tells it as
  // opened.
  int64_t max_id = max_incident_id_;
  std::vector<IncidentRow> opened;
  if (first_) {
    absl::StatusOr<int64_t> newest = store_->MaxIncidentId();
    if (!newest.ok()) return newest.status();
    max_id = *newest;
  } else {
    IncidentFilter new_filter;
    new_filter.after_id = max_incident_id_;
    absl::StatusOr<std::vector<IncidentRow>> all = AllIncidents(store_, new_filter);
    if (!all.ok()) return all.status();
    opened = *std::move(all);
  }
  IncidentFilter open_filter;
  open_filter.open_only = true;
  absl::StatusOr<std::vector<IncidentRow>> open = AllIncidents(store_, open_filter);
  if (!open.ok()) return open.status();

  // What changed since the last refresh, told in the writer's words once
  // the views show it.
  std::vector<std::pair<IncidentRow, IncidentChange>> changes;
  std::set<std::string> touched;  // runs whose incidents changed
  // The open incidents as last seen: at the last refresh, or just now among
  // the new ones.
  std::map<int64_t, Seen> seen = open_;
  for (const IncidentRow& r : opened) {
    changes.emplace_back(r, IncidentChange::kOpened);
    touched.insert(r.run_id);
    max_id = std::max(max_id, r.id);
    if (r.state != IncidentState::kResolved && r.state != IncidentState::kDismissed) {
      seen[r.id] = {r.state, r.updated_ms};
    }
  }
  std::map<int64_t, Seen> still_open;
  for (const IncidentRow& r : *open) {
    if (r.id > max_id) continue;  // committed after the first read: next time
    still_open[r.id] = {r.state, r.updated_ms};
    auto was = seen.find(r.id);
    if (was == seen.end()) continue;  // there at the first refresh: not news
    if (was->second.state != r.state) {
      changes.emplace_back(r, IncidentChange::kStateChanged);
    } else if (was->second.updated_ms != r.updated_ms) {
      changes.emplace_back(r, IncidentChange::kUpdated);
    } else {
      continue;
    }
    touched.insert(r.run_id);
  }
  for (const auto& [id, last] : seen) {
    if (still_open.count(id) > 0) continue;
    // Closed since (resolved, dismissed): its final row.
    absl::StatusOr<std::optional<IncidentRow>> row = store_->GetIncident(id);
    if (!row.ok()) return row.status();
    if (!row->has_value()) continue;
    changes.emplace_back(**row, IncidentChange::kStateChanged);
    touched.insert((*row)->run_id);
  }

  std::map<std::string, RunRow> rows;
  for (RunRow& row : *runs) {
    auto before = rows_.find(row.run_id);
    if (first_ || before == rows_.end() || !(before->second == row) ||
        touched.count(row.run_id) > 0) {
      absl::StatusOr<RunView> view = RunTable::StoredView(store_, row);
      if (!view.ok()) return view.status();
      views_.Set(row.run_id, *std::move(view));
    }
    rows.emplace(row.run_id, std::move(row));
  }
  for (const auto& [id, row] : rows_) {
    if (rows.count(id) == 0) views_.Erase(id);
  }

  // Only now is the refresh taken: one that failed above is done again in
  // full, and its changes told then.
  rows_ = std::move(rows);
  open_ = std::move(still_open);
  max_incident_id_ = max_id;
  first_ = false;
  for (const auto& [row, change] : changes) listener_->OnIncident(row, change);
  std::lock_guard<std::mutex> lock(mu_);
  as_of_ms_ = began;
  return absl::OkStatus();
}

}  // namespace trainwatch::server
