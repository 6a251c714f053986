// The operator API: runs, incidents, decisions, quarantine lists and the
// incident watch stream. Reads run on the service's read queue and
// decisions on the ingest writer, so no gRPC callback thread waits on the
// store. A standby replica serves the reads too, from the store
// (service_state.h), and refuses decisions naming the owner.

#include "api/operator_service.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "admission/agent_message_checks.h"
#include "api/convert.h"
#include "api/incident_summary.h"
#include "trainwatch/v1/operator.grpc.pb.h"
#include "trainwatch/wire/replicas.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;

namespace {

// A run id filter: empty is every run, anything else follows the rule.
absl::Status OptionalRunId(const std::string& run_id) {
  return run_id.empty() ? absl::OkStatus() : CheckRunId(run_id);
}

class Watcher : public grpc::ServerWriteReactor<v1::IncidentEvent>, public IncidentWatcher {
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
      f.tier = wire::TierFromProto(req_.tier());
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

  // From the writer thread (on a standby, its refresh thread).
  void Push(const IncidentRow& r, v1::IncidentEventKind kind) override {
    if (!req_.run_id().empty() && req_.run_id() != r.run_id) return;
    const int tier = wire::TierFromProto(req_.tier());
    if (tier >= 0 && tier != r.tier) return;
    v1::IncidentEvent ev;
    ev.set_kind(kind);
    IncidentToProto(r, ev.mutable_incident());
    wire::SetTime(state_->clock()->NowMs(), ev.mutable_time());
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

class OperatorServiceImpl : public v1::OperatorService::CallbackService {
 public:
  explicit OperatorServiceImpl(ServiceState* state) : state_(state) {}

  grpc::ServerUnaryReactor* ListRuns(grpc::CallbackServerContext* ctx,
                                     const v1::ListRunsRequest* req,
                                     v1::ListRunsResponse* resp) override {
    return Unary(ctx, Access::kRead, [this, req, resp]() -> absl::Status {
      if (req->active_only()) {
        // Which runs have agents connected is in the owner's memory alone.
        if (absl::Status s = state_->RequireWriter("tell which runs have agents connected");
            !s.ok()) {
          return s;
        }
      }
      MarkStandby(resp);
      const auto connected = state_->sessions().ConnectedRanks();
      for (const RunView& s : state_->views().All()) {
        auto it = connected.find(s.row.run_id);
        const int32_t ranks = it == connected.end() ? 0 : static_cast<int32_t>(it->second.size());
        if (req->active_only() && ranks == 0) continue;
        if (!req->page_token().empty() && s.row.run_id <= req->page_token()) continue;
        RunToProto(s, ranks, state_->clock()->NowMs(), resp->add_runs());
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
    return Unary(ctx, Access::kRead, [this, req, resp]() -> absl::Status {
      if (absl::Status s = CheckRunId(req->run_id()); !s.ok()) return s;
      const RunView* run = nullptr;
      const std::vector<RunView> snap = state_->views().All();
      for (const RunView& s : snap) {
        if (s.row.run_id == req->run_id()) run = &s;
      }
      if (run == nullptr) return absl::NotFoundError(absl::StrCat("no run '", req->run_id(), "'"));
      MarkStandby(resp);
      const auto connected = state_->sessions().ConnectedRanks();
      auto it = connected.find(run->row.run_id);
      RunToProto(*run, it == connected.end() ? 0 : static_cast<int32_t>(it->second.size()),
                 state_->clock()->NowMs(), resp->mutable_run());
      resp->mutable_run()->set_rules_json(run->row.rules_json);
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
      absl::StatusOr<std::vector<StepRow>> recent =
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
      for (const auto& s : state_->sessions().Sessions()) {
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
        wire::SetTime(cks->back().reported_ms, resp->mutable_latest_checkpoint()->mutable_saved_at());
      }
      absl::StatusOr<std::vector<AttemptRow>> attempts =
          state_->store()->Attempts(run->row.run_id, run->row.attempt);
      if (!attempts.ok()) return attempts.status();
      for (const AttemptRow& a : *attempts) AttemptToProto(a, resp->add_attempts());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* ListIncidents(grpc::CallbackServerContext* ctx,
                                          const v1::ListIncidentsRequest* req,
                                          v1::ListIncidentsResponse* resp) override {
    return Unary(ctx, Access::kRead, [this, req, resp]() -> absl::Status {
      if (absl::Status s = OptionalRunId(req->run_id()); !s.ok()) return s;
      IncidentFilter f;
      f.run_id = req->run_id();
      f.open_only = req->open_only();
      f.tier = wire::TierFromProto(req->tier());
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
    return Unary(ctx, Access::kRead, [this, req, resp]() -> absl::Status {
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
    ApprovalRequest d;
    d.approve = true;
    if (req->has_to_step()) d.to_step = req->to_step();
    if (req->has_quarantine_shards()) {
      ShardQuarantine q;
      for (const auto& r : req->quarantine_shards().ranges()) {
        q.ranges.emplace_back(r.first(), r.last());
      }
      for (uint64_t id : req->quarantine_shards().shard_ids()) q.ranges.emplace_back(id, id);
      q.names.assign(req->quarantine_shards().names().begin(),
                     req->quarantine_shards().names().end());
      d.quarantine = std::move(q);
    }
    if (req->has_z_loss_alpha()) d.z_loss_alpha = req->z_loss_alpha();
    if (req->has_skip_steps()) {
      d.skip_steps = std::make_pair(req->skip_steps().first(), req->skip_steps().last());
    }
    for (const auto& s : req->settings()) {
      if (s.has_z_loss_alpha()) d.z_loss_alpha = s.z_loss_alpha();
      if (s.has_layer_precision()) {
        d.precision.emplace_back(s.layer_precision().layer(), s.layer_precision().precision());
      }
      if (s.has_lr_scale()) d.lr_scale = s.lr_scale();
    }
    d.comment = req->comment();
    d.dry_run = req->dry_run();
    d.idempotency_key = req->idempotency_key();
    return SubmitApproval(ctx, req->incident_id(), std::move(d), resp);
  }

  grpc::ServerUnaryReactor* RejectRollback(grpc::CallbackServerContext* ctx,
                                           const v1::RejectRollbackRequest* req,
                                           v1::RejectRollbackResponse* resp) override {
    ApprovalRequest d;
    d.approve = false;
    d.comment = req->comment();
    d.idempotency_key = req->idempotency_key();
    return SubmitApproval(ctx, req->incident_id(), std::move(d), resp);
  }

  grpc::ServerUnaryReactor* ListQuarantinedShards(grpc::CallbackServerContext* ctx,
                                                  const v1::ListQuarantinedShardsRequest* req,
                                                  v1::ListQuarantinedShardsResponse* resp) override {
    return Unary(ctx, Access::kRead, [this, req, resp]() -> absl::Status {
      if (absl::Status s = CheckRunId(req->run_id()); !s.ok()) return s;
      resp->set_run_id(req->run_id());
      absl::StatusOr<std::vector<QuarantineRow>> rows = state_->store()->Quarantines(req->run_id());
      if (!rows.ok()) return rows.status();
      for (const QuarantineRow& q : *rows) {
        v1::QuarantineEntry* e = resp->add_entries();
        if (!q.name.empty()) {
          resp->mutable_shards()->add_names(q.name);
          e->mutable_shards()->add_names(q.name);
        } else {
          auto* r = resp->mutable_shards()->add_ranges();
          r->set_first(q.first);
          r->set_last(q.last);
          auto* er = e->mutable_shards()->add_ranges();
          er->set_first(q.first);
          er->set_last(q.last);
        }
        e->set_incident_id(absl::StrCat("I-", q.incident_id));
        e->set_decision_id(absl::StrCat("D-", q.decision_id));
        wire::SetTime(q.created_ms, e->mutable_added_at());
      }
      resp->set_version(static_cast<int64_t>(rows->size()));
      return absl::OkStatus();
    });
  }

  grpc::ServerWriteReactor<v1::IncidentEvent>* WatchIncidents(
      grpc::CallbackServerContext* ctx, const v1::WatchIncidentsRequest* req) override {
    auto* w = new Watcher(state_, *req);
    absl::StatusOr<Principal> p = state_->auth().Check(AuthorizationOf(ctx), Access::kRead);
    // Begin reads the open incidents here, on the callback thread: the
    // watcher must be registered before gRPC may cancel and delete it.
    w->Begin(p.ok() ? OptionalRunId(req->run_id()) : p.status());
    return w;
  }

 private:
  // A standby's answer says so (operator.proto, StandbyAnswer).
  template <typename Response>
  void MarkStandby(Response* resp) {
    v1::StandbyAnswer standby;
    if (state_->DescribeStandby(&standby)) *resp->mutable_standby() = std::move(standby);
  }

  // Hands the decision to the writer thread and finishes the call when it is
  // durable (or refused): no gRPC thread waits on the store.
  // Approve and reject answer alike: the decision, whether it was a replay,
  // and the incident's state.
  template <typename Response>
  grpc::ServerUnaryReactor* SubmitApproval(grpc::CallbackServerContext* ctx,
                                           const std::string& id_text, ApprovalRequest d,
                                           Response* resp) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    absl::StatusOr<Principal> p = state_->auth().Check(AuthorizationOf(ctx), Access::kApprove);
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
    if (absl::Status s = CheckApprovalRequest(d); !s.ok()) {
      r->Finish(ToGrpc(s));
      return r;
    }
    // Checked before the writer is read: once set it stays, so a takeover
    // between the two cannot leave it null here.
    if (absl::Status s = state_->RequireWriter("record a decision"); !s.ok()) {
      FinishCall(ctx, r, s);
      return r;
    }
    d.actor = p->name;
    state_->writer()->SubmitApproval(std::move(d), [r, resp](ApprovalOutcome o) {
      if (!o.status.ok()) {
        r->Finish(ToGrpc(o.status));
        return;
      }
      resp->mutable_decision()->ParseFromString(o.decision);
      resp->set_replayed(o.replayed);
      resp->set_incident_state(static_cast<v1::IncidentState>(static_cast<int>(o.state)));
      r->Finish(grpc::Status::OK);
    });
    return r;
  }

  // Checks the caller, then runs `fn` on the read queue and finishes the
  // call there. `fn` captures the request and response by pointer: gRPC
  // keeps both until Finish.
  template <typename Fn>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Access access, Fn fn) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    absl::StatusOr<Principal> p = state_->auth().Check(AuthorizationOf(ctx), access);
    if (!p.ok()) {
      r->Finish(ToGrpc(p.status()));
      return r;
    }
    state_->reads()->Post([ctx, r, fn = std::move(fn)] { FinishCall(ctx, r, fn()); });
    return r;
  }

  // A standby's refusal (ServiceState::RequireWriter) is marked in the
  // trailing metadata too, so that twctl moves on to its next address for
  // it and not for any other ABORTED (a database's serialization failure).
  static void FinishCall(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* r,
                         const absl::Status& s) {
    if (IsStandbyRefusal(s)) ctx->AddTrailingMetadata(wire::kStandbyMetadataKey, "1");
    r->Finish(ToGrpc(s));
  }

  absl::Status FillSummary(const IncidentRow& inc, v1::DiagnosticSummary* s) {
    absl::StatusOr<std::vector<EventRow>> events = state_->store()->EventsOfIncident(inc.id);
    if (!events.ok()) return events.status();
    int64_t current_attempt = 0;
    if (std::optional<RunView> run = state_->views().Get(inc.run_id)) {
      current_attempt = run->row.attempt;
    }
    const int64_t attempt = IncidentAttempt(inc, current_attempt);
    // Curves from the stored steps: the 5,000 steps before the onset up to
    // the detection.
    absl::StatusOr<std::vector<StepRow>> steps = state_->store()->StepsBetween(
        inc.run_id, attempt, std::max<int64_t>(0, inc.onset_step - 5000), inc.detection_step);
    if (!steps.ok()) return steps.status();
    std::vector<RankStepRow> ranks;
    if (inc.tier == 3) {
      // Which tensors, on which ranks: from the ranks' own reports.
      absl::StatusOr<std::vector<RankStepRow>> at =
          state_->store()->RankStepsAt(inc.run_id, attempt, inc.onset_step);
      if (at.ok()) ranks = *std::move(at);
    }
    BuildSummary({inc, *events, *steps, ranks,
                  state_->ingest_options().rules.shard_steps_before_onset,
                  state_->clock()->NowMs()},
                 s);
    return absl::OkStatus();
  }

  ServiceState* state_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewOperatorService(ServiceState* state) {
  return std::make_unique<OperatorServiceImpl>(state);
}

}  // namespace trainwatch::server
