#include "api/service_state.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "api/agent_stream.h"
#include "trainwatch/wire/time.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl and gRPC codes are the same numbers.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::string AuthorizationOf(const grpc::CallbackServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

const RunViews& ServiceState::views() const {
  if (Ingestor* w = writer(); w != nullptr) return w->views();
  return standby_->views();
}

namespace {
constexpr absl::string_view kStandbyPayload = "trainwatch.standby";
}  // namespace

bool IsStandbyRefusal(const absl::Status& s) {
  return s.GetPayload(kStandbyPayload).has_value();
}

absl::Status ServiceState::RequireWriter(absl::string_view what) const {
  if (writer() != nullptr) return absl::OkStatus();
  const std::string owner = owner_ ? owner_() : std::string();
  if (owner == replica_) {
    // Its leases are taken, its writer not started yet: a moment.
    return absl::UnavailableError(absl::StrCat("trainwatchd replica ", replica_,
                                               " is taking over; try again in a moment"));
  }
  absl::Status refused = absl::AbortedError(absl::StrCat(
      "trainwatchd replica ", replica_, " is a standby and cannot ", what, "; ",
      owner.empty() ? std::string("no replica owns the runs at the moment (a takeover is due)")
                    : absl::StrCat("replica ", owner, " owns the runs"),
      ": try another address"));
  refused.SetPayload(kStandbyPayload, absl::Cord(replica_));
  return refused;
}

bool ServiceState::DescribeStandby(v1::StandbyAnswer* out) const {
  if (writer() != nullptr) return false;
  out->set_replica(replica_);
  out->set_owner(owner_ ? owner_() : std::string());
  // Unset until the first refresh is complete.
  if (const int64_t as_of = standby_->as_of_ms(); as_of > 0) {
    wire::SetTime(as_of, out->mutable_as_of());
  }
  return true;
}

void ServiceState::OnDurable(uint64_t stream_id, const std::string& run_id, int32_t rank,
                           int64_t step) {
  std::shared_ptr<Session> s = sessions_.Find(stream_id);
  if (s == nullptr) return;  // gone; the agent re-sends on reconnect
  {
    absl::MutexLock lock(&s->mu);
    auto& v = s->acks[{run_id, rank}];
    v = std::max(v, step);
  }
  absl::MutexLock lock(&undelivered_mu_);
  // The ingestor calls a stream's keys one after the other (by stream id).
  if (undelivered_.empty() || undelivered_.back() != s) undelivered_.push_back(std::move(s));
}

void ServiceState::OnAcksDone() { PostUndelivered(); }

void ServiceState::PostUndelivered() {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&undelivered_mu_);
    if (undelivered_.empty()) return;
    sessions.swap(undelivered_);
  }
  deliveries_posted_.fetch_add(1, std::memory_order_relaxed);
  deliveries_.Post([sessions = std::move(sessions)] {
    for (const auto& s : sessions) AgentStream::Deliver(s);
  });
}

void ServiceState::OnStreamFailed(uint64_t stream_id, const absl::Status& status) {
  std::shared_ptr<Session> s = sessions_.Find(stream_id);
  if (s == nullptr) return;  // gone already: the agent reconnects anyway
  // After the writes posted before it: what the stream was told is durable
  // reaches it before the end.
  PostUndelivered();
  deliveries_posted_.fetch_add(1, std::memory_order_relaxed);
  deliveries_.Post([s = std::move(s), status = ToGrpc(status)]() mutable {
    AgentStream::FinishWhenIdle(s, std::move(status));
  });
}

void ServiceState::OnServerMessage(const std::string& run_id, uint64_t stream_id,
                                 const std::string& serialized) {
  const std::vector<std::shared_ptr<Session>> targets = sessions_.Sessions(stream_id);
  // In the writer's order: acks gathered so far are posted before.
  PostUndelivered();
  for (const auto& s : targets) {
    {
      absl::MutexLock lock(&s->mu);
      if (s->run_id != run_id || s->done) continue;
      s->outgoing.push_back(serialized);
    }
    deliveries_posted_.fetch_add(1, std::memory_order_relaxed);
    deliveries_.Post([s] { AgentStream::Deliver(s); });
  }
}

void ServiceState::OnIncident(const IncidentRow& incident, IncidentChange change) {
  const v1::IncidentEventKind kind =
      change == IncidentChange::kOpened         ? v1::INCIDENT_EVENT_KIND_OPENED
      : change == IncidentChange::kStateChanged ? v1::INCIDENT_EVENT_KIND_STATE_CHANGED
                                                : v1::INCIDENT_EVENT_KIND_UPDATED;
  absl::MutexLock lock(&watch_mu_);
  for (IncidentWatcher* w : watchers_) w->Push(incident, kind);
}

}  // namespace trainwatch::server
