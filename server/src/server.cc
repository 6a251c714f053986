#include "trainwatch/server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>
#include <prometheus/exposer.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "log.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "convert.h"
#include "trainwatch/core/json.h"
#include "trainwatch/server/auth.h"
#include "trainwatch/server/pager.h"
#include "trainwatch/v1/agent.grpc.pb.h"
#include "trainwatch/v1/operator.grpc.pb.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;

namespace {

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

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class AgentStream;

// One agent stream's state shared with the writer thread. The reactor stays
// alive while a write is in flight (gRPC calls OnDone only after Finish, and
// Finish waits for the write), which is what makes Deliver() safe.
struct Session {
  absl::Mutex mu;
  AgentStream* reactor ABSL_GUARDED_BY(mu) = nullptr;
  bool done ABSL_GUARDED_BY(mu) = false;
  bool writing ABSL_GUARDED_BY(mu) = false;
  bool finish_pending ABSL_GUARDED_BY(mu) = false;
  grpc::Status finish_status ABSL_GUARDED_BY(mu);
  // Highest durable step per (run, rank) not yet sent: acks coalesce.
  std::map<std::pair<std::string, int32_t>, int64_t> acks ABSL_GUARDED_BY(mu);
  // Commands and quarantine lists, sent before acks, in order.
  std::deque<std::string> outgoing ABSL_GUARDED_BY(mu);
  v1::ServerMessage out ABSL_GUARDED_BY(mu);
  // For run status.
  std::string run_id ABSL_GUARDED_BY(mu);
  int32_t rank ABSL_GUARDED_BY(mu) = -1;
  v1::Hello hello ABSL_GUARDED_BY(mu);
  v1::Heartbeat heartbeat ABSL_GUARDED_BY(mu);
};

class ServiceState;

class AgentStream : public grpc::ServerBidiReactor<v1::AgentMessage, v1::ServerMessage> {
 public:
  AgentStream(ServiceState* state, grpc::CallbackServerContext* ctx);
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;
  void OnCancel() override {}

  // Queues acks and starts a write if none is in flight. Any thread.
  static void Deliver(const std::shared_ptr<Session>& s);
  // Ends the stream once no write is in flight.
  void FinishWhenIdle(grpc::Status status);

 private:
  absl::Status Validate(const v1::AgentMessage& m);

  ServiceState* state_;
  grpc::CallbackServerContext* ctx_;
  uint64_t id_ = 0;
  std::shared_ptr<Session> session_;
  Principal principal_;
  v1::AgentMessage in_;
};

// Everything the services share. Thread-safe.
class ServiceState : public IngestListener {
 public:
  ServiceState(Ingestor* ingestor, Store* store, Pager* pager, Authenticator auth, Clock* clock,
               std::string grafana_url)
      : ingestor_(ingestor),
        pager_(pager),
        store_(store),
        auth_(std::move(auth)),
        clock_(clock),
        grafana_url_(std::move(grafana_url)) {}

  Ingestor* ingestor() { return ingestor_; }
  Store* store() { return store_; }
  Pager* pager() { return pager_; }
  const Authenticator& auth() const { return auth_; }
  Clock* clock() { return clock_; }
  const std::string& grafana_url() const { return grafana_url_; }

  uint64_t Register(std::shared_ptr<Session> s) {
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_id_++;
    sessions_[id] = std::move(s);
    return id;
  }
  void Unregister(uint64_t id) {
    absl::MutexLock lock(&mu_);
    sessions_.erase(id);
  }
  std::vector<std::shared_ptr<Session>> Sessions() {
    absl::MutexLock lock(&mu_);
    std::vector<std::shared_ptr<Session>> out;
    for (const auto& [id, s] : sessions_) out.push_back(s);
    return out;
  }
  // Per run: connected ranks.
  std::map<std::string, std::set<int32_t>> ConnectedRanks() {
    std::map<std::string, std::set<int32_t>> out;
    for (const auto& s : Sessions()) {
      absl::MutexLock lock(&s->mu);
      if (!s->run_id.empty() && !s->done) out[s->run_id].insert(s->rank);
    }
    return out;
  }

  // IngestListener (writer thread).
  void OnDurable(uint64_t stream_id, const std::string& run_id, int32_t rank,
                 int64_t step) override {
    std::shared_ptr<Session> s;
    {
      absl::MutexLock lock(&mu_);
      auto it = sessions_.find(stream_id);
      if (it == sessions_.end()) return;  // gone; the agent re-sends on reconnect
      s = it->second;
    }
    {
      absl::MutexLock lock(&s->mu);
      auto& v = s->acks[{run_id, rank}];
      v = std::max(v, step);
    }
    AgentStream::Deliver(s);
  }
  void OnIncident(const IncidentRow& incident, IncidentChange change) override;
  void OnServerMessage(const std::string& run_id, uint64_t stream_id,
                       const std::string& serialized) override {
    std::vector<std::shared_ptr<Session>> targets;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, s] : sessions_) {
        if (stream_id == 0 || id == stream_id) targets.push_back(s);
      }
    }
    for (const auto& s : targets) {
      {
        absl::MutexLock lock(&s->mu);
        if (s->run_id != run_id || s->done) continue;
        s->outgoing.push_back(serialized);
      }
      AgentStream::Deliver(s);
    }
  }

  // Watchers of incident changes.
  class Watcher;
  void AddWatcher(Watcher* w) {
    absl::MutexLock lock(&watch_mu_);
    watchers_.insert(w);
  }
  void RemoveWatcher(Watcher* w) {
    absl::MutexLock lock(&watch_mu_);
    watchers_.erase(w);
  }

  std::atomic<int64_t> streams_rejected{0};

 private:
  Ingestor* ingestor_;
  Pager* pager_;
  Store* store_;
  Authenticator auth_;
  Clock* clock_;
  std::string grafana_url_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  absl::Mutex watch_mu_;
  std::set<Watcher*> watchers_ ABSL_GUARDED_BY(watch_mu_);
};

// ------------------------------------------------------------- AgentStream

AgentStream::AgentStream(ServiceState* state, grpc::CallbackServerContext* ctx)
    : state_(state), ctx_(ctx), session_(std::make_shared<Session>()) {
  absl::StatusOr<Principal> p =
      state_->auth().Check(AuthorizationOf(ctx), Access::kAgentStream);
  {
    absl::MutexLock lock(&session_->mu);
    session_->reactor = this;
  }
  id_ = state_->Register(session_);
  if (!p.ok()) {
    state_->streams_rejected++;
    FinishWhenIdle(ToGrpc(p.status()));
    return;
  }
  principal_ = *std::move(p);
  StartRead(&in_);
}

absl::Status AgentStream::Validate(const v1::AgentMessage& m) {
  const std::string* run = nullptr;
  switch (m.kind_case()) {
    case v1::AgentMessage::kHello:
      run = &m.hello().run_id();
      if (m.hello().world_size() < 0 || m.hello().world_size() > 1'000'000) {
        return absl::InvalidArgumentError("hello: world_size must be in [1, 1000000]");
      }
      break;
    case v1::AgentMessage::kStepReport: {
      const auto& r = m.step_report();
      run = &r.run_id();
      if (r.step() < 0) return absl::InvalidArgumentError("step_report: step must be >= 0");
      if (r.rank() < 0) return absl::InvalidArgumentError("step_report: rank must be >= 0");
      if (r.world_size() < 0 || r.world_size() > 1'000'000) {
        return absl::InvalidArgumentError("step_report: world_size must be in [1, 1000000]");
      }
      if (r.world_size() > 0 && r.rank() >= r.world_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "step_report: rank ", r.rank(), " is outside world_size ", r.world_size()));
      }
      break;
    }
    case v1::AgentMessage::kHeartbeat:
      run = &m.heartbeat().run_id();
      break;
    case v1::AgentMessage::kCheckpoint:
      run = &m.checkpoint().run_id();
      if (m.checkpoint().uri().empty()) {
        return absl::InvalidArgumentError("checkpoint: uri is empty");
      }
      break;
    case v1::AgentMessage::kCommandAck:
      run = &m.command_ack().run_id();
      break;
    case v1::AgentMessage::KIND_NOT_SET:
      return absl::InvalidArgumentError("empty AgentMessage: set one of its kinds");
  }
  if (run->empty()) return absl::InvalidArgumentError("run_id is empty");
  if (run->size() > 200) return absl::InvalidArgumentError("run_id is longer than 200 bytes");
  if (!principal_.MayReport(*run)) {
    return absl::PermissionDeniedError(
        absl::StrCat("token '", principal_.name, "' may not report for run '", *run, "'"));
  }
  return absl::OkStatus();
}

void AgentStream::OnReadDone(bool ok) {
  if (!ok) {  // the agent closed its side (or the call broke)
    FinishWhenIdle(grpc::Status::OK);
    return;
  }
  if (absl::Status s = Validate(in_); !s.ok()) {
    LOG(WARNING) << "agent stream " << id_ << " from " << ctx_->peer()
                 << " rejected: " << s.message();
    state_->streams_rejected++;
    FinishWhenIdle(ToGrpc(s));
    return;
  }
  {
    absl::MutexLock lock(&session_->mu);
    if (in_.has_hello()) {
      session_->hello = in_.hello();
      session_->run_id = in_.hello().run_id();
      session_->rank = in_.hello().rank();
    } else if (in_.has_heartbeat()) {
      session_->heartbeat = in_.heartbeat();
    } else if (in_.has_step_report() && session_->run_id.empty()) {
      session_->run_id = in_.step_report().run_id();
      session_->rank = in_.step_report().rank();
    }
  }
  IngestItem item;
  item.stream_id = id_;
  item.received_ms = state_->clock()->NowMs();
  item.message = std::move(in_);
  in_.Clear();
  state_->ingestor()->Submit(std::move(item));
  StartRead(&in_);
}

void AgentStream::Deliver(const std::shared_ptr<Session>& s) {
  AgentStream* reactor = nullptr;
  {
    absl::MutexLock lock(&s->mu);
    if (s->done || s->writing || s->finish_pending) return;
    if (!s->outgoing.empty()) {
      s->out.ParseFromString(s->outgoing.front());
      s->outgoing.pop_front();
      s->writing = true;
      reactor = s->reactor;
    }
  }
  if (reactor != nullptr) {
    reactor->StartWrite(&s->out);
    return;
  }
  {
    absl::MutexLock lock(&s->mu);
    if (s->done || s->writing || s->finish_pending || s->acks.empty()) return;
    // One ack message per run (a stream carries one run in practice).
    auto it = s->acks.begin();
    const std::string run = it->first.first;
    s->out.Clear();
    auto* ack = s->out.mutable_durability_ack();
    ack->set_run_id(run);
    while (it != s->acks.end() && it->first.first == run) {
      (*ack->mutable_durable_step())[it->first.second] = it->second;
      it = s->acks.erase(it);
    }
    s->writing = true;
    reactor = s->reactor;
  }
  // Outside the lock: a reaction may run inline.
  reactor->StartWrite(&s->out);
}

void AgentStream::OnWriteDone(bool ok) {
  bool finish = false;
  grpc::Status status;
  {
    absl::MutexLock lock(&session_->mu);
    session_->writing = false;
    if (!ok) {
      // The stream broke; what was not acknowledged will be re-sent.
      session_->acks.clear();
    }
    if (session_->finish_pending) {
      finish = true;
      status = session_->finish_status;
      session_->finish_pending = false;
      session_->done = true;
    }
  }
  if (finish) {
    Finish(status);
    return;
  }
  Deliver(session_);
}

void AgentStream::FinishWhenIdle(grpc::Status status) {
  {
    absl::MutexLock lock(&session_->mu);
    if (session_->done || session_->finish_pending) return;
    if (session_->writing) {
      session_->finish_pending = true;
      session_->finish_status = std::move(status);
      return;
    }
    session_->done = true;
  }
  Finish(status);
}

void AgentStream::OnDone() {
  {
    absl::MutexLock lock(&session_->mu);
    session_->done = true;
    session_->reactor = nullptr;
  }
  state_->Unregister(id_);
  delete this;
}

class AgentServiceImpl : public v1::AgentService::CallbackService {
 public:
  explicit AgentServiceImpl(ServiceState* state) : state_(state) {}
  grpc::ServerBidiReactor<v1::AgentMessage, v1::ServerMessage>* Stream(
      grpc::CallbackServerContext* ctx) override {
    return new AgentStream(state_, ctx);
  }

 private:
  ServiceState* state_;
};

// --------------------------------------------------------- WatchIncidents

class ServiceState::Watcher : public grpc::ServerWriteReactor<v1::IncidentEvent> {
 public:
  Watcher(ServiceState* state, const v1::WatchIncidentsRequest& req)
      : state_(state), req_(req) {}

  void Begin(const absl::Status& auth) {
    if (!auth.ok()) {
      Finish(ToGrpc(auth));
      return;
    }
    if (req_.include_open()) {
      IncidentFilter f;
      f.run_id = req_.run_id();
      f.open_only = true;
      f.tier = TierFromProto(req_.tier());
      f.limit = 10000;
      absl::StatusOr<std::vector<IncidentRow>> open = state_->store()->ListIncidents(f);
      if (open.ok()) {
        for (const IncidentRow& r : *open) Push(r, v1::INCIDENT_EVENT_KIND_SNAPSHOT);
      }
    }
    state_->AddWatcher(this);
    absl::MutexLock lock(&mu_);
    registered_ = true;
    MaybeWriteLocked();
  }

  // From the writer thread.
  void Push(const IncidentRow& r, v1::IncidentEventKind kind) {
    if (!req_.run_id().empty() && req_.run_id() != r.run_id) return;
    const int tier = TierFromProto(req_.tier());
    if (tier >= 0 && tier != r.tier) return;
    v1::IncidentEvent ev;
    ev.set_kind(kind);
    IncidentToProto(r, ev.mutable_incident());
    SetTime(state_->clock()->NowMs(), ev.mutable_time());
    absl::MutexLock lock(&mu_);
    if (queue_.size() >= 1000) queue_.pop_front();  // a slow watcher loses the oldest
    queue_.push_back(std::move(ev));
    MaybeWriteLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      closed_ = true;
      return;
    }
    MaybeWriteLocked();
  }
  void OnCancel() override {
    state_->RemoveWatcher(this);
    absl::MutexLock lock(&mu_);
    closed_ = true;
    if (!writing_ && !finished_) {
      finished_ = true;
      Finish(grpc::Status::CANCELLED);
    }
  }
  void OnDone() override {
    state_->RemoveWatcher(this);
    delete this;
  }
 private:
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || queue_.empty() || !registered_) {
      if (closed_ && !writing_ && !finished_) {
        finished_ = true;
        Finish(grpc::Status::OK);
      }
      return;
    }
    if (closed_) return;
    current_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    StartWrite(&current_);
  }

  ServiceState* state_;
  v1::WatchIncidentsRequest req_;
  absl::Mutex mu_;
  std::deque<v1::IncidentEvent> queue_ ABSL_GUARDED_BY(mu_);
  v1::IncidentEvent current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

void ServiceState::OnIncident(const IncidentRow& incident, IncidentChange change) {
  const v1::IncidentEventKind kind =
      change == IncidentChange::kOpened         ? v1::INCIDENT_EVENT_KIND_OPENED
      : change == IncidentChange::kStateChanged ? v1::INCIDENT_EVENT_KIND_STATE_CHANGED
                                                : v1::INCIDENT_EVENT_KIND_UPDATED;
  absl::MutexLock lock(&watch_mu_);
  for (Watcher* w : watchers_) w->Push(incident, kind);
}

// --------------------------------------------------------- OperatorService

// Percentile of a sorted vector (nearest rank).
double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0.0;
  const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size()))) - 1;
  return sorted[std::min(sorted.size() - 1, i)];
}

class OperatorServiceImpl : public v1::OperatorService::CallbackService {
 public:
  explicit OperatorServiceImpl(ServiceState* state) : state_(state) {}

  grpc::ServerUnaryReactor* ListRuns(grpc::CallbackServerContext* ctx,
                                     const v1::ListRunsRequest* req,
                                     v1::ListRunsResponse* resp) override {
    return Unary(ctx, Access::kRead, [&] {
      const auto connected = state_->ConnectedRanks();
      for (const RunSnapshot& s : state_->ingestor()->Snapshot()) {
        auto it = connected.find(s.row.run_id);
        const int32_t ranks = it == connected.end() ? 0 : static_cast<int32_t>(it->second.size());
        if (req->active_only() && ranks == 0) continue;
        if (!req->page_token().empty() && s.row.run_id <= req->page_token()) continue;
        RunToProto(s, ranks, resp->add_runs());
        const int limit = req->page_size() > 0 ? req->page_size() : 1000;
        if (resp->runs_size() >= limit) {
          resp->set_next_page_token(s.row.run_id);
          break;
        }
      }
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* GetRunStatus(grpc::CallbackServerContext* ctx,
                                         const v1::GetRunStatusRequest* req,
                                         v1::GetRunStatusResponse* resp) override {
    return Unary(ctx, Access::kRead, [&]() -> absl::Status {
      const RunSnapshot* run = nullptr;
      const std::vector<RunSnapshot> snap = state_->ingestor()->Snapshot();
      for (const RunSnapshot& s : snap) {
        if (s.row.run_id == req->run_id()) run = &s;
      }
      if (run == nullptr) return absl::NotFoundError(absl::StrCat("no run '", req->run_id(), "'"));
      const auto connected = state_->ConnectedRanks();
      auto it = connected.find(run->row.run_id);
      RunToProto(*run, it == connected.end() ? 0 : static_cast<int32_t>(it->second.size()),
                 resp->mutable_run());
      if (run->has_latest) StepToProto(run->latest, resp->mutable_latest());
      const int window = static_cast<int>(std::clamp<int64_t>(
          req->window_steps() > 0 ? req->window_steps() : 200, 1, 100000));
      int64_t attempt = run->row.attempt;
      if (req->has_attempt()) {
        if (req->attempt() < 0 || req->attempt() > run->row.attempt) {
          return absl::InvalidArgumentError(absl::StrCat(
              "run '", req->run_id(), "' has attempts 0 to ", run->row.attempt));
        }
        attempt = req->attempt();
      }
      absl::StatusOr<std::vector<StoredStep>> recent =
          state_->store()->RecentSteps(run->row.run_id, attempt, window);
      if (!recent.ok()) return recent.status();
      const size_t max_points = req->max_points() > 0 ? static_cast<size_t>(req->max_points())
                                                      : recent->size();
      const size_t stride = std::max<size_t>(1, (recent->size() + max_points - 1) /
                                                    std::max<size_t>(1, max_points));
      for (size_t i = 0; i < recent->size(); i += stride) {
        StepToProto((*recent)[i], resp->add_recent());
      }
      IncidentFilter f;
      f.run_id = run->row.run_id;
      f.open_only = true;
      absl::StatusOr<std::vector<IncidentRow>> open = state_->store()->ListIncidents(f);
      if (!open.ok()) return open.status();
      for (const IncidentRow& r : *open) IncidentToProto(r, resp->add_open_incidents());
      for (const auto& s : state_->Sessions()) {
        absl::MutexLock lock(&s->mu);
        if (s->run_id != run->row.run_id) continue;
        v1::AgentStatus* a = resp->add_agents();
        a->set_rank(s->rank);
        a->set_host_name(s->hello.host_name());
        a->set_agent_version(s->hello.agent_version());
        a->set_connected(!s->done);
        if (s->heartbeat.has_time()) *a->mutable_last_heartbeat() = s->heartbeat.time();
        a->set_queue_depth(s->heartbeat.queue_depth());
        a->set_dropped_total(s->heartbeat.dropped_total());
      }
      absl::StatusOr<std::vector<CheckpointRow>> cks =
          state_->store()->Checkpoints(run->row.run_id);
      if (!cks.ok()) return cks.status();
      if (!cks->empty()) {
        resp->mutable_latest_checkpoint()->set_step(cks->back().step);
        resp->mutable_latest_checkpoint()->set_uri(cks->back().uri);
        SetTime(cks->back().reported_ms, resp->mutable_latest_checkpoint()->mutable_saved_at());
      }
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* ListIncidents(grpc::CallbackServerContext* ctx,
                                          const v1::ListIncidentsRequest* req,
                                          v1::ListIncidentsResponse* resp) override {
    return Unary(ctx, Access::kRead, [&]() -> absl::Status {
      IncidentFilter f;
      f.run_id = req->run_id();
      f.open_only = req->open_only();
      f.tier = TierFromProto(req->tier());
      f.limit = req->page_size() > 0 ? std::min(req->page_size(), 1000) : 100;
      if (!req->page_token().empty() && !absl::SimpleAtoi(req->page_token(), &f.after_id)) {
        return absl::InvalidArgumentError("page_token is not one this server gave");
      }
      absl::StatusOr<std::vector<IncidentRow>> rows = state_->store()->ListIncidents(f);
      if (!rows.ok()) return rows.status();
      for (const IncidentRow& r : *rows) IncidentToProto(r, resp->add_incidents());
      if (static_cast<int>(rows->size()) == f.limit) {
        resp->set_next_page_token(absl::StrCat(rows->back().id));
      }
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* GetIncident(grpc::CallbackServerContext* ctx,
                                        const v1::GetIncidentRequest* req,
                                        v1::GetIncidentResponse* resp) override {
    return Unary(ctx, Access::kRead, [&]() -> absl::Status {
      int64_t id = 0;
      absl::string_view text = req->incident_id();
      if (absl::StartsWithIgnoreCase(text, "I-")) text.remove_prefix(2);
      if (!absl::SimpleAtoi(text, &id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("incident id '", req->incident_id(), "' is not of the form I-<n>"));
      }
      absl::StatusOr<std::optional<IncidentRow>> row = state_->store()->GetIncident(id);
      if (!row.ok()) return row.status();
      if (!row->has_value()) {
        return absl::NotFoundError(absl::StrCat("no incident ", req->incident_id()));
      }
      v1::Incident* out = resp->mutable_incident();
      IncidentToProto(**row, out);
      absl::StatusOr<std::vector<DecisionRow>> decisions =
          state_->store()->DecisionsOfIncident(id);
      if (!decisions.ok()) return decisions.status();
      for (const DecisionRow& d : *decisions) out->add_decisions()->ParseFromString(d.payload);
      return FillSummary(**row, out->mutable_summary());
    });
  }

  grpc::ServerUnaryReactor* ApproveRollback(grpc::CallbackServerContext* ctx,
                                            const v1::ApproveRollbackRequest* req,
                                            v1::ApproveRollbackResponse* resp) override {
    DecisionRequest d;
    d.approve = true;
    if (req->has_to_step()) d.to_step = req->to_step();
    if (req->has_quarantine_shards()) {
      std::vector<std::pair<uint64_t, uint64_t>> q;
      for (const auto& r : req->quarantine_shards().ranges()) q.emplace_back(r.first(), r.last());
      for (uint64_t id : req->quarantine_shards().shard_ids()) q.emplace_back(id, id);
      d.quarantine = std::move(q);
    }
    if (req->has_z_loss_alpha()) d.z_loss_alpha = req->z_loss_alpha();
    if (req->has_skip_steps()) {
      d.skip_steps = std::make_pair(req->skip_steps().first(), req->skip_steps().last());
    }
    for (const auto& s : req->settings()) {
      if (s.has_z_loss_alpha()) d.z_loss_alpha = s.z_loss_alpha();
    }
    d.comment = req->comment();
    d.dry_run = req->dry_run();
    d.idempotency_key = req->idempotency_key();
    return Decide(ctx, req->incident_id(), std::move(d), [resp](const DecisionOutcome& o) {
      resp->mutable_decision()->ParseFromString(o.decision);
      resp->set_replayed(o.replayed);
      resp->set_incident_state(static_cast<v1::IncidentState>(static_cast<int>(o.state)));
    });
  }

  grpc::ServerUnaryReactor* RejectRollback(grpc::CallbackServerContext* ctx,
                                           const v1::RejectRollbackRequest* req,
                                           v1::RejectRollbackResponse* resp) override {
    DecisionRequest d;
    d.approve = false;
    d.comment = req->comment();
    d.idempotency_key = req->idempotency_key();
    return Decide(ctx, req->incident_id(), std::move(d), [resp](const DecisionOutcome& o) {
      resp->mutable_decision()->ParseFromString(o.decision);
      resp->set_replayed(o.replayed);
      resp->set_incident_state(static_cast<v1::IncidentState>(static_cast<int>(o.state)));
    });
  }

  grpc::ServerUnaryReactor* ListQuarantinedShards(grpc::CallbackServerContext* ctx,
                                                  const v1::ListQuarantinedShardsRequest* req,
                                                  v1::ListQuarantinedShardsResponse* resp) override {
    return Unary(ctx, Access::kRead, [&]() -> absl::Status {
      if (req->run_id().empty()) return absl::InvalidArgumentError("run_id is required");
      resp->set_run_id(req->run_id());
      absl::StatusOr<std::vector<QuarantineRow>> rows = state_->store()->Quarantines(req->run_id());
      if (!rows.ok()) return rows.status();
      for (const QuarantineRow& q : *rows) {
        auto* r = resp->mutable_shards()->add_ranges();
        r->set_first(q.first);
        r->set_last(q.last);
        v1::QuarantineEntry* e = resp->add_entries();
        auto* er = e->mutable_shards()->add_ranges();
        er->set_first(q.first);
        er->set_last(q.last);
        e->set_incident_id(absl::StrCat("I-", q.incident_id));
        e->set_decision_id(absl::StrCat("D-", q.decision_id));
        SetTime(q.created_ms, e->mutable_added_at());
      }
      resp->set_version(static_cast<int64_t>(rows->size()));
      return absl::OkStatus();
    });
  }

  grpc::ServerWriteReactor<v1::IncidentEvent>* WatchIncidents(
      grpc::CallbackServerContext* ctx, const v1::WatchIncidentsRequest* req) override {
    auto* w = new ServiceState::Watcher(state_, *req);
    absl::StatusOr<Principal> p = state_->auth().Check(AuthorizationOf(ctx), Access::kRead);
    w->Begin(p.status());
    return w;
  }

 private:
  // Hands the decision to the writer thread and finishes the call when it is
  // durable (or refused): no gRPC thread waits on the store.
  template <typename Fill>
  grpc::ServerUnaryReactor* Decide(grpc::CallbackServerContext* ctx, const std::string& id_text,
                                   DecisionRequest d, Fill fill) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    absl::StatusOr<Principal> p = state_->auth().Check(AuthorizationOf(ctx), Access::kDecide);
    if (!p.ok()) {
      r->Finish(ToGrpc(p.status()));
      return r;
    }
    absl::string_view text = id_text;
    if (absl::StartsWithIgnoreCase(text, "I-")) text.remove_prefix(2);
    if (!absl::SimpleAtoi(text, &d.incident_id)) {
      r->Finish(grpc::Status(grpc::INVALID_ARGUMENT,
                             absl::StrCat("incident id '", id_text, "' is not of the form I-<n>")));
      return r;
    }
    if (!d.approve && d.comment.empty()) {
      r->Finish(grpc::Status(grpc::INVALID_ARGUMENT,
                             "a rejection needs a comment: it goes in the audit log"));
      return r;
    }
    d.actor = p->name;
    state_->ingestor()->Decide(std::move(d), [r, fill](DecisionOutcome o) {
      if (!o.status.ok()) {
        r->Finish(ToGrpc(o.status));
        return;
      }
      fill(o);
      r->Finish(grpc::Status::OK);
    });
    return r;
  }

  template <typename Fn>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Access access, Fn fn) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    absl::StatusOr<Principal> p = state_->auth().Check(AuthorizationOf(ctx), access);
    r->Finish(p.ok() ? ToGrpc(fn()) : ToGrpc(p.status()));
    return r;
  }

  absl::Status FillSummary(const IncidentRow& inc, v1::DiagnosticSummary* s) {
    absl::StatusOr<std::vector<EventRow>> events = state_->store()->EventsOfIncident(inc.id);
    if (!events.ok()) return events.status();
    std::string explanation;
    for (const EventRow& e : *events) {
      v1::RuleFiring* f = s->add_fired();
      f->set_rule(RuleToProto(e.event.kind));
      f->set_tier(TierToProto(e.event.tier));
      f->set_step(e.event.step);
      f->set_explanation(e.event.reason);
      absl::StrAppend(&explanation, explanation.empty() ? "" : "\n", "step ", e.event.step, ": ",
                      e.event.reason);
    }
    s->set_explanation(explanation);
    s->set_onset_step(inc.onset_step);
    s->set_detection_step(inc.detection_step);
    // Curves from the stored steps: the 5,000 steps before the onset up to
    // the detection.
    // The attempt the incident happened in: the run's current one unless a
    // rollback since started a new one.
    int64_t attempt = 0;
    for (const RunSnapshot& r : state_->ingestor()->Snapshot()) {
      if (r.row.run_id == inc.run_id) attempt = r.row.attempt;
    }
    if (inc.state == IncidentState::kRollingBack || inc.state == IncidentState::kResolved) {
      attempt = std::max<int64_t>(0, attempt - 1);
    }
    absl::StatusOr<std::vector<StoredStep>> steps = state_->store()->StepsBetween(
        inc.run_id, attempt, std::max<int64_t>(0, inc.onset_step - 5000), inc.detection_step);
    if (!steps.ok()) return steps.status();
    const size_t n = steps->size();
    const size_t stride = std::max<size_t>(1, n / 200);
    std::vector<double> window;
    int64_t window_first = -1;
    for (size_t i = 0; i < n; ++i) {
      const StoredStep& st = (*steps)[i];
      if (i % stride == 0 && st.Has(core::Signal::kLogZ)) {
        auto* p = s->add_log_z_trend();
        p->set_step(st.step);
        p->set_value(st.Get(core::Signal::kLogZ));
      }
      if (st.step >= inc.onset_step - 200 && st.step <= inc.onset_step + 200) {
        if (st.Has(core::Signal::kLoss)) {
          auto* p = s->add_loss_around_onset();
          p->set_step(st.step);
          p->set_value(st.Get(core::Signal::kLoss));
        }
        if (!std::isnan(st.loss_ema_ratio)) {
          auto* p = s->add_loss_ema_ratio_around_onset();
          p->set_step(st.step);
          p->set_value(st.loss_ema_ratio);
        }
      }
      // Grad-norm percentiles per 1,000-step window before the onset.
      if (st.step < inc.onset_step && st.Has(core::Signal::kGradNorm) &&
          std::isfinite(st.Get(core::Signal::kGradNorm))) {
        if (window_first < 0) window_first = st.step;
        window.push_back(st.Get(core::Signal::kGradNorm));
      }
      const bool window_ends = window_first >= 0 && (st.step - window_first >= 999 ||
                                                     i + 1 == n || st.step + 1 >= inc.onset_step);
      if (window_ends && !window.empty()) {
        std::sort(window.begin(), window.end());
        auto* w = s->add_grad_norm_percentiles();
        w->set_first_step(window_first);
        w->set_last_step(st.step);
        w->set_p50(Percentile(window, 0.50));
        w->set_p90(Percentile(window, 0.90));
        w->set_p99(Percentile(window, 0.99));
        w->set_max(window.back());
        w->set_sample_count(window.size());
        window.clear();
        window_first = -1;
      }
      if (st.step >= inc.onset_step && !st.shards.empty()) {
        auto* ss = s->add_shards_onset_to_detection();
        ss->set_step(st.step);
        for (uint64_t id : st.shards) ss->add_shard_ids(id);
      }
    }
    if (inc.tier == 3) {
      // Which tensors, on which ranks: from the ranks' own reports.
      absl::StatusOr<std::vector<RankStepRow>> ranks =
          state_->store()->RankStepsAt(inc.run_id, attempt, inc.onset_step);
      if (ranks.ok()) {
        std::map<std::string, v1::TensorBreakdown> by_name;
        for (const RankStepRow& rk : *ranks) {
          v1::StepReport rep;
          if (!rep.ParseFromString(rk.report) || rep.nonfinite_count() == 0) continue;
          s->add_nonfinite_ranks(rk.rank);
          for (const auto& t : rep.tensors()) {
            v1::TensorBreakdown& b = by_name[t.name()];
            b.set_name(t.name());
            b.set_nonfinite_count(b.nonfinite_count() + t.nonfinite_count());
            b.set_element_count(b.element_count() + t.element_count());
            b.set_first_step(inc.onset_step);
            b.add_ranks(rk.rank);
          }
        }
        for (auto& [name, b] : by_name) *s->add_tensor_breakdown() = std::move(b);
      }
    }
    for (uint64_t id : inc.shards) s->mutable_suspect_shards()->add_shard_ids(id);
    if (!inc.shards.empty()) {
      auto* range = s->mutable_suspect_shards()->add_ranges();
      range->set_first(inc.shards.front());
      range->set_last(inc.shards.back());
    }
    if (inc.recommended_checkpoint_step >= 0) {
      s->mutable_recommended_checkpoint()->set_step(inc.recommended_checkpoint_step);
      s->mutable_recommended_checkpoint()->set_uri(inc.recommended_checkpoint_uri);
    }
    absl::StatusOr<core::JsonValue> actions = core::ParseJson(inc.actions_json, "actions");
    std::string flags;
    if (actions.ok()) {
      for (const core::JsonValue& a : actions->array) {
        const core::JsonValue* kind = a.Find("kind");
        const core::JsonValue* text = a.Find("text");
        v1::RecommendedAction* ra = s->add_recommended_actions();
        ra->set_description(text ? text->string : "");
        const std::string k = kind ? kind->string : "";
        if (k == "quarantine_shards") {
          ra->set_kind(v1::ACTION_KIND_QUARANTINE_SHARDS);
          auto* r = ra->mutable_shards()->add_ranges();
          r->set_first(static_cast<uint64_t>(a.Find("shard_first")->number));
          r->set_last(static_cast<uint64_t>(a.Find("shard_last")->number));
          absl::StrAppend(&flags, " --quarantine-shards ", r->first(), "..", r->last());
        } else if (k == "inspect_shards") {
          ra->set_kind(v1::ACTION_KIND_INSPECT_SHARDS);
        } else if (k == "set_z_loss_alpha") {
          ra->set_kind(v1::ACTION_KIND_SET_Z_LOSS_ALPHA);
          ra->mutable_setting()->set_z_loss_alpha(a.Find("z_loss_alpha")->number);
          absl::StrAppendFormat(&flags, " --z-loss-alpha %g", a.Find("z_loss_alpha")->number);
        } else if (k == "widen_precision") {
          ra->set_kind(v1::ACTION_KIND_SET_LAYER_PRECISION);
        }
      }
    }
    // What an approval does by default besides the shards: every rank skips
    // the batches it served around the spike (the shards above are rank 0's).
    if (auto skip = DefaultSkipSteps(inc, inc.recommended_checkpoint_step,
                                     state_->ingestor()->options().rules.shard_steps_before_onset)) {
      v1::RecommendedAction* ra = s->add_recommended_actions();
      ra->set_kind(v1::ACTION_KIND_SKIP_STEPS);
      ra->mutable_steps()->set_first(skip->first);
      ra->mutable_steps()->set_last(skip->second);
      ra->set_description(absl::StrFormat("skip the batches of steps %d..%d on every rank",
                                          skip->first, skip->second));
    }
    if (inc.tier >= 2) {
      s->set_approve_command(absl::StrCat(
          "twctl rollback approve ", inc.public_id(),
          inc.recommended_checkpoint_step >= 0
              ? absl::StrCat(" --to-step ", inc.recommended_checkpoint_step)
              : "",
          flags, " --comment \"...\""));
    }
    SetTime(state_->clock()->NowMs(), s->mutable_generated_at());
    return absl::OkStatus();
  }

  ServiceState* state_;
};

// ---------------------------------------------------------------- exporter

// Reads live state at scrape time: no shadow counters to keep in step.
class Exporter : public prometheus::Collectable {
 public:
  explicit Exporter(ServiceState* state) : state_(state) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    using prometheus::MetricFamily;
    using prometheus::MetricType;
    // A deque: a family's reference stays valid while later ones are added
    // (a vector's push_back would move the earlier ones away).
    std::deque<MetricFamily> families;
    auto family = [&](const char* name, const char* help, MetricType type) -> MetricFamily& {
      families.push_back(MetricFamily{name, help, type, {}});
      return families.back();
    };
    auto add = [](MetricFamily& f, std::vector<prometheus::ClientMetric::Label> labels,
                  double value) {
      prometheus::ClientMetric m;
      m.label = std::move(labels);
      if (f.type == MetricType::Counter) {
        m.counter.value = value;
      } else {
        m.gauge.value = value;
      }
      f.metric.push_back(std::move(m));
    };
    const std::vector<RunSnapshot> runs = state_->ingestor()->Snapshot();
    struct Gauge {
      const char* name;
      const char* help;
      core::Signal signal;
    };
    const Gauge gauges[] = {
        {"trainwatch_loss", "Training loss of the last evaluated step, in nats.",
         core::Signal::kLoss},
        {"trainwatch_grad_norm", "Global L2 norm of the gradients before clipping.",
         core::Signal::kGradNorm},
        {"trainwatch_log_z", "Mean log partition function of the output softmax, in nats.",
         core::Signal::kLogZ},
        {"trainwatch_nan_frac", "Fraction of nonfinite gradient elements.",
         core::Signal::kNanFrac},
    };
    for (const Gauge& g : gauges) {
      MetricFamily& f = family(g.name, g.help, MetricType::Gauge);
      for (const RunSnapshot& r : runs) {
        if (r.has_latest && r.latest.Has(g.signal)) {
          add(f, {{"run", r.row.run_id}}, r.latest.Get(g.signal));
        }
      }
    }
    {
      MetricFamily& f = family("trainwatch_loss_ema_ratio",
                               "Loss over the EMA of the previous 1,000 steps.",
                               MetricType::Gauge);
      for (const RunSnapshot& r : runs) {
        if (r.has_latest && !std::isnan(r.latest.loss_ema_ratio)) {
          add(f, {{"run", r.row.run_id}}, r.latest.loss_ema_ratio);
        }
      }
    }
    {
      MetricFamily& f = family("trainwatch_step", "Last evaluated step of the run.",
                               MetricType::Gauge);
      for (const RunSnapshot& r : runs) add(f, {{"run", r.row.run_id}}, double(r.row.last_step));
    }
    {
      MetricFamily& f = family("trainwatch_run_attempt",
                               "The run's attempt: 0 at the start, one more per rollback.",
                               MetricType::Gauge);
      for (const RunSnapshot& r : runs) add(f, {{"run", r.row.run_id}}, double(r.row.attempt));
    }
    {
      MetricFamily& f = family("trainwatch_incidents_total",
                               "Incidents opened, by run and tier (0: early warnings).",
                               MetricType::Counter);
      MetricFamily& g = family("trainwatch_incidents_open", "Incidents not yet resolved.",
                               MetricType::Gauge);
      for (const RunSnapshot& r : runs) {
        for (int t = 0; t < 4; ++t) {
          add(f, {{"run", r.row.run_id}, {"tier", std::to_string(t)}},
              double(r.incidents_total[t]));
          add(g, {{"run", r.row.run_id}, {"tier", std::to_string(t)}},
              double(r.open_incidents[t]));
        }
      }
    }
    {
      MetricFamily& f = family("trainwatch_skipped_steps_total",
                               "Steps whose optimizer update the rules skipped.",
                               MetricType::Counter);
      MetricFamily& m = family("trainwatch_incomplete_steps_total",
                               "Steps completed by timeout with ranks missing.",
                               MetricType::Counter);
      for (const RunSnapshot& r : runs) {
        add(f, {{"run", r.row.run_id}}, double(r.skipped_total));
        add(m, {{"run", r.row.run_id}}, double(r.missing_rank_steps_total));
      }
    }
    {
      const auto connected = state_->ConnectedRanks();
      MetricFamily& f = family("trainwatch_agents_connected", "Agent streams open, by run.",
                               MetricType::Gauge);
      for (const RunSnapshot& r : runs) {
        auto it = connected.find(r.row.run_id);
        add(f, {{"run", r.row.run_id}}, it == connected.end() ? 0.0 : double(it->second.size()));
      }
    }
    const IngestStats st = state_->ingestor()->Stats();
    add(family("trainwatch_ingest_records_total", "Step reports received.", MetricType::Counter),
        {}, double(st.records_total));
    add(family("trainwatch_ingest_duplicates_total",
               "Step reports already stored (re-sent after a reconnect).", MetricType::Counter),
        {}, double(st.duplicates_total));
    add(family("trainwatch_ingest_queue_depth", "Messages waiting for the writer.",
               MetricType::Gauge),
        {}, double(st.queue_depth));
    add(family("trainwatch_ingest_lag_seconds",
               "From the receipt of the oldest message of the last batch to its commit.",
               MetricType::Gauge),
        {}, double(st.last_lag_ms) / 1000.0);
    add(family("trainwatch_store_commits_total", "Store transactions committed.",
               MetricType::Counter),
        {}, double(st.batches_total));
    add(family("trainwatch_store_commit_seconds_total", "Time spent committing batches.",
               MetricType::Counter),
        {}, st.commit_seconds_sum);
    add(family("trainwatch_store_last_commit_seconds", "Duration of the last commit.",
               MetricType::Gauge),
        {}, st.last_commit_seconds);
    add(family("trainwatch_store_errors_total", "Batches the store failed to write.",
               MetricType::Counter),
        {}, double(st.store_errors_total));
    add(family("trainwatch_agent_streams_rejected_total",
               "Agent streams ended for a bad token or a malformed message.",
               MetricType::Counter),
        {}, double(state_->streams_rejected.load()));
    add(family("trainwatch_pages_sent_total", "Pages delivered.", MetricType::Counter), {},
        double(state_->pager()->sent_total()));
    add(family("trainwatch_pages_failed_total", "Page delivery attempts that failed.",
               MetricType::Counter),
        {}, double(state_->pager()->failed_total()));
    return {std::make_move_iterator(families.begin()), std::make_move_iterator(families.end())};
  }

 private:
  ServiceState* state_;
};

}  // namespace

bool IsLoopback(const std::string& address) {
  return absl::StartsWith(address, "127.") || absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]") || absl::StartsWith(address, "unix:") ||
         address == "localhost";
}

struct Server::Impl {
  ServerOptions options;
  std::unique_ptr<Store> store;
  std::unique_ptr<Ingestor> ingestor;
  std::unique_ptr<Pager> pager;
  std::unique_ptr<ServiceState> state;
  std::unique_ptr<AgentServiceImpl> agent_service;
  std::unique_ptr<OperatorServiceImpl> operator_service;
  std::unique_ptr<grpc::Server> grpc_server;
  std::shared_ptr<Exporter> exporter;
  std::unique_ptr<prometheus::Exposer> exposer;
  int port = 0;
  int metrics_port = 0;
  bool shut_down = false;
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Shutdown(std::chrono::seconds(2)); }

int Server::port() const { return impl_->port; }
int Server::metrics_port() const { return impl_->metrics_port; }
Ingestor* Server::ingestor() { return impl_->ingestor.get(); }
Store* Server::store() { return impl_->store.get(); }

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      Clock* clock) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  Authenticator auth;
  if (!options.tokens_file.empty()) {
    absl::StatusOr<Authenticator> a = Authenticator::FromFile(options.tokens_file);
    if (!a.ok()) return a.status();
    auth = *std::move(a);
  }
  const bool tls = !options.tls_cert_file.empty();
  if (tls != !options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and a key file");
  }
  if (!options.tls_client_ca_file.empty() && !tls) {
    return absl::InvalidArgumentError("mutual TLS needs the server's certificate and key too");
  }
  if (!IsLoopback(options.listen)) {
    if (!tls) {
      LOG(WARNING) << "*** trainwatchd listens on " << options.listen
                   << " beyond loopback WITHOUT TLS: tokens and metrics travel in clear text. "
                      "Use --tls_cert/--tls_key. ***";
    }
    if (!auth.enabled()) {
      LOG(WARNING) << "*** trainwatchd listens on " << options.listen
                   << " beyond loopback WITHOUT AUTHENTICATION: anyone who reaches it can "
                      "stream records and read incidents. Use --tokens. ***";
    }
  }
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options.db_path);
  if (!store.ok()) return store.status();
  impl->store = *std::move(store);
  PagerConfig pager_config;
  if (!options.pager_config_file.empty()) {
    absl::StatusOr<PagerConfig> pc = LoadPagerConfig(options.pager_config_file);
    if (!pc.ok()) return pc.status();
    pager_config = *std::move(pc);
  }
  if (pager_config.grafana_url.empty()) pager_config.grafana_url = options.grafana_url;
  impl->pager = std::make_unique<Pager>(impl->store.get(), pager_config, clock);
  impl->ingestor = std::make_unique<Ingestor>(impl->store.get(), options.ingest, clock);
  impl->ingestor->SetPager(impl->pager.get());
  if (absl::Status s = impl->ingestor->Recover(); !s.ok()) return s;
  impl->state = std::make_unique<ServiceState>(impl->ingestor.get(), impl->store.get(),
                                               impl->pager.get(), std::move(auth), clock,
                                               options.grafana_url);
  impl->ingestor->SetListener(impl->state.get());
  impl->ingestor->Start();
  impl->pager->Start();

  impl->agent_service = std::make_unique<AgentServiceImpl>(impl->state.get());
  impl->operator_service = std::make_unique<OperatorServiceImpl>(impl->state.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (tls) {
    grpc::SslServerCredentialsOptions ssl(
        options.tls_client_ca_file.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    absl::StatusOr<std::string> cert = ReadFile(options.tls_cert_file);
    absl::StatusOr<std::string> key = ReadFile(options.tls_key_file);
    if (!cert.ok()) return cert.status();
    if (!key.ok()) return key.status();
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!options.tls_client_ca_file.empty()) {
      absl::StatusOr<std::string> ca = ReadFile(options.tls_client_ca_file);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
    }
    creds = grpc::SslServerCredentials(ssl);
  }
  builder.AddListeningPort(options.listen, creds, &impl->port);
  builder.RegisterService(impl->agent_service.get());
  builder.RegisterService(impl->operator_service.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Without this a second trainwatchd on the same port would share it
  // silently (SO_REUSEPORT) and split the agents between two databases.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  impl->grpc_server = builder.BuildAndStart();
  if (impl->grpc_server == nullptr || impl->port == 0) {
    impl->ingestor->Stop();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, " (address in use or invalid)"));
  }
  if (!options.metrics_listen.empty()) {
    try {
      // prometheus-cpp reports a bind failure by throwing; it stops here.
      impl->exposer = std::make_unique<prometheus::Exposer>(options.metrics_listen);
    } catch (const std::exception& e) {
      impl->grpc_server->Shutdown();
      impl->ingestor->Stop();
      return absl::UnavailableError(
          absl::StrCat("cannot serve metrics on ", options.metrics_listen, ": ", e.what()));
    }
    impl->exporter = std::make_shared<Exporter>(impl->state.get());
    impl->exposer->RegisterCollectable(impl->exporter);
    const std::vector<int> ports = impl->exposer->GetListeningPorts();
    impl->metrics_port = ports.empty() ? 0 : ports.front();
  }
  LOG(INFO) << "trainwatchd: gRPC on port " << impl->port << ", metrics on port "
            << impl->metrics_port << ", database " << options.db_path << ", authentication "
            << (impl->state->auth().enabled() ? "on" : "off") << ", TLS "
            << (tls ? (options.tls_client_ca_file.empty() ? "on" : "mutual") : "off");
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

void Server::Shutdown(std::chrono::milliseconds deadline) {
  if (impl_ == nullptr || impl_->shut_down) return;
  impl_->shut_down = true;
  // Streams get until the deadline to finish; what they sent is written.
  impl_->grpc_server->Shutdown(std::chrono::system_clock::now() + deadline);
  impl_->ingestor->Flush();
  impl_->ingestor->Stop();
  impl_->pager->Stop();
  impl_->exposer.reset();
  LOG(INFO) << "trainwatchd: stopped; store flushed";
}

}  // namespace trainwatch::server
