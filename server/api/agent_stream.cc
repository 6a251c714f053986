#include "api/agent_stream.h"

#include <algorithm>
#include <string>

#include "common/log.h"
#include "absl/strings/str_cat.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;

AgentStream::AgentStream(ServiceState* state, const AgentStreamShared* shared,
                         grpc::CallbackServerContext* ctx)
    : state_(state), shared_(shared), ctx_(ctx), session_(std::make_shared<Session>()) {
  absl::StatusOr<Principal> p =
      state_->auth().Check(AuthorizationOf(ctx), Access::kAgentStream);
  {
    absl::MutexLock lock(&session_->mu);
    session_->reactor = this;
  }
  id_ = state_->sessions().Register(session_);
  if (!p.ok()) {
    state_->streams_rejected++;
    FinishWhenIdle(ToGrpc(p.status()));
    return;
  }
  principal_ = *std::move(p);
  // A standby takes no records: the agent moves on to its next address.
  // Once this replica writes, it always will (service_state.h).
  if (absl::Status s = state_->RequireWriter("take agent streams"); !s.ok()) {
    FinishWhenIdle(ToGrpc(s));
    return;
  }
  StartRead(&in_bytes_);
}

absl::Status AgentStream::Validate(const v1::AgentMessage& m) {
  if (absl::Status s = CheckAgentMessage(m, progress_, shared_->limits); !s.ok()) return s;
  const std::string& run = m.has_hello()         ? m.hello().run_id()
                           : m.has_step_report() ? m.step_report().run_id()
                           : m.has_heartbeat()   ? m.heartbeat().run_id()
                           : m.has_checkpoint()  ? m.checkpoint().run_id()
                                                 : m.command_ack().run_id();
  if (!principal_.MayReport(run)) {
    return absl::PermissionDeniedError(
        absl::StrCat("token '", principal_.name, "' may not report for run '", run, "'"));
  }
  if (m.has_hello()) {
    // Only a Hello may bring a new run (everything else needs one first).
    return shared_->run_limit->Admit(principal_, run, [this, &run] {
      return state_->views().Get(run).has_value();
    });
  }
  return absl::OkStatus();
}

void AgentStream::OnReadDone(bool ok) {
  if (!ok) {  // the agent closed its side (or the call broke)
    FinishWhenIdle(grpc::Status::OK);
    return;
  }
  // The limits on the bytes (--max_message_bytes) were gRPC's; these are
  // the protocol's.
  absl::Status s = grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::AgentMessage>(
                       &in_bytes_, &in_)
                           .ok()
                       ? Validate(in_)
                       : absl::InvalidArgumentError("the bytes received are not an AgentMessage");
  if (!s.ok()) {
    LOG(WARNING) << "agent stream " << id_ << " from " << ctx_->peer()
                 << " rejected: " << s.message();
    state_->streams_rejected++;
    FinishWhenIdle(ToGrpc(s));
    return;
  }
  progress_.hello_seen = true;  // Validate let nothing else come first
  {
    absl::MutexLock lock(&session_->mu);
    if (in_.has_hello()) {
      session_->hello = in_.hello();
      session_->run_id = in_.hello().run_id();
      session_->rank = in_.hello().rank();
    } else if (in_.has_heartbeat()) {
      session_->heartbeat = in_.heartbeat();
    }
  }
  IngestItem item;
  item.stream_id = id_;
  item.received_ms = state_->clock()->NowMs();
  item.message = std::move(in_);
  in_.Clear();
  state_->writer()->Submit(std::move(item));
  StartRead(&in_bytes_);
}

void AgentStream::Write(const v1::ServerMessage& m) {
  bool own_buffer = false;
  out_bytes_.Clear();  // the last write's bytes: done with, as no write is in flight
  // Serializing a message already built cannot fail.
  grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::ServerMessage>(m, &out_bytes_, &own_buffer)
      .IgnoreError();
  StartWrite(&out_bytes_);
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
    reactor->Write(s->out);
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
  reactor->Write(s->out);
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
  state_->sessions().Unregister(id_);
  delete this;
}

namespace {

// Raw: the stream parses the bytes itself (see agent_stream.h).
class AgentServiceImpl
    : public v1::AgentService::WithRawCallbackMethod_Stream<v1::AgentService::Service> {
 public:
  AgentServiceImpl(ServiceState* state, AgentStreamLimits limits, int max_runs_per_token)
      : state_(state), run_limit_(max_runs_per_token) {
    shared_.limits = limits;
    shared_.run_limit = &run_limit_;
  }
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Stream(
      grpc::CallbackServerContext* ctx) override {
    return new AgentStream(state_, &shared_, ctx);
  }

 private:
  ServiceState* state_;
  RunCreationLimit run_limit_;
  AgentStreamShared shared_;
};

}  // namespace

std::unique_ptr<grpc::Service> NewAgentService(ServiceState* state, AgentStreamLimits limits,
                                               int max_runs_per_token) {
  return std::make_unique<AgentServiceImpl>(state, limits, max_runs_per_token);
}

}  // namespace trainwatch::server
