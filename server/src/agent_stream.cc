#include "agent_stream.h"

#include <algorithm>
#include <string>

#include "agent_validation.h"
#include "log.h"
#include "absl/strings/str_cat.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;

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

void AgentStream::OnReadDone(bool ok) {
  if (!ok) {  // the agent closed its side (or the call broke)
    FinishWhenIdle(grpc::Status::OK);
    return;
  }
  if (absl::Status s = ValidateAgentMessage(in_, principal_); !s.ok()) {
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

namespace {

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

}  // namespace

std::unique_ptr<grpc::Service> NewAgentService(ServiceState* state) {
  return std::make_unique<AgentServiceImpl>(state);
}

}  // namespace trainwatch::server
