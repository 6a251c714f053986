#include "agent_stream.h"

#include <algorithm>
#include <string>

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

void AgentStream::FinishWhenIdle(const std::shared_ptr<Session>& s, grpc::Status status) {
  AgentStream* reactor = nullptr;
  {
    absl::MutexLock lock(&s->mu);
    if (s->done || s->finish_pending) return;
    if (s->writing) {
      s->finish_pending = true;
      s->finish_status = std::move(status);
      return;
    }
    // Not done, so not finished: the reactor lives until this Finish.
    s->done = true;
    reactor = s->reactor;
  }
  if (reactor != nullptr) reactor->Finish(status);
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
