// A fake trainwatchd for the agent's tests: a gRPC AgentService that keeps
// what it received and acknowledges it, with knobs for the failures the
// transport must survive; and Running, which serves it on a port.

#ifndef TRAINWATCH_TESTS_AGENT_FAKE_TRAINWATCHD_H_
#define TRAINWATCH_TESTS_AGENT_FAKE_TRAINWATCHD_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::agent {

namespace v1 = trainwatch::v1;

// A fake trainwatchd: keeps the distinct steps it saw and acks them.
class FakeServer final : public v1::AgentService::Service {
 public:
  std::atomic<int> ack_delay_ms{0};
  std::atomic<bool> repeat_acks{false};
  std::atomic<bool> send_command{false};
  std::atomic<int> heartbeats{0};
  // After the hello, read nothing more until the call is cancelled.
  std::atomic<bool> stop_reading{false};
  // Answer every hello by ending the stream with FAILED_PRECONDITION, as
  // trainwatchd does for an incarnation a newer one replaced.
  std::atomic<bool> replace_incarnation{false};
  // Answer every hello by ending the stream with this status (OK: serve),
  // as a replica that does not own the run would.
  std::atomic<grpc::StatusCode> refuse_hello{grpc::StatusCode::OK};

  grpc::Status Stream(grpc::ServerContext* ctx,
                      grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* s) override {
    v1::AgentMessage m;
    int64_t best = -1;
    while (s->Read(&m)) {
      if (m.has_hello()) {
        std::lock_guard<std::mutex> lock(mu_);
        hellos_.push_back(m.hello());
      }
      if (m.has_hello() && replace_incarnation) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "run run-t: incarnation x was replaced by incarnation y");
      }
      if (m.has_hello() && refuse_hello != grpc::StatusCode::OK) {
        return grpc::Status(refuse_hello, "this replica does not own run run-t");
      }
      if (m.has_hello() && send_command) {
        v1::ServerMessage c;
        c.mutable_command()->set_command_id("cmd-1");
        auto* rb = c.mutable_command()->mutable_rollback();
        rb->set_incident_id("I-7");
        rb->set_target_step(3000);
        rb->set_checkpoint_uri("ckpt://3000");
        auto* range = rb->mutable_quarantine()->add_ranges();
        range->set_first(10);
        range->set_last(20);
        rb->add_settings()->set_z_loss_alpha(1e-4);
        rb->mutable_skip_steps()->set_first(3001);
        rb->mutable_skip_steps()->set_last(3050);
        rb->mutable_quarantine()->add_names("train-00012-of-01024.parquet");
        s->Write(c);
        // The run's whole quarantine list, as trainwatchd sends it after.
        v1::ServerMessage q;
        q.mutable_quarantined_shards()->set_run_id("run-t");
        auto* qr = q.mutable_quarantined_shards()->mutable_shards()->add_ranges();
        qr->set_first(10);
        qr->set_last(20);
        q.mutable_quarantined_shards()->mutable_shards()->add_names("train-00012-of-01024.parquet");
        q.mutable_quarantined_shards()->set_version(2);
        s->Write(q);
      }
      if (m.has_hello() && stop_reading) {
        while (!ctx->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return grpc::Status::CANCELLED;
      }
      if (m.has_heartbeat()) ++heartbeats;
      if (m.has_command_ack()) {
        std::lock_guard<std::mutex> lock(mu_);
        acks_.push_back(m.command_ack());
      }
      if (!m.has_step_report()) continue;
      {
        std::lock_guard<std::mutex> lock(mu_);
        const auto [it, fresh] = steps_.insert(m.step_report().step());
        if (!fresh) ++duplicates_;
        ++received_;
        if (m.step_report().tensors_size() > 0) {
          tensor_reports_.push_back(m.step_report().step());
          globals_before_report_.push_back(global_steps_.size());
        }
        if (m.step_report().scope() != v1::REPORT_SCOPE_RANK) {
          global_steps_.insert(m.step_report().step());
          global_reports_[m.step_report().step()] = m.step_report();
          shards_[m.step_report().step()].assign(m.step_report().shard_ids().begin(),
                                                 m.step_report().shard_ids().end());
          shard_names_[m.step_report().step()].assign(m.step_report().shard_names().begin(),
                                                      m.step_report().shard_names().end());
        }
      }
      best = std::max(best, m.step_report().step());
      if (ack_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ack_delay_ms));
      v1::ServerMessage ack;
      ack.mutable_durability_ack()->set_run_id(m.step_report().run_id());
      (*ack.mutable_durability_ack()->mutable_durable_step())[m.step_report().rank()] = best;
      if (!s->Write(ack)) break;
      if (repeat_acks) {
        s->Write(ack);
        (*ack.mutable_durability_ack()->mutable_durable_step())[0] = best - 5;  // stale
        s->Write(ack);
      }
    }
    return grpc::Status::OK;
  }

  std::set<int64_t> steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  // The steps of the run's (global) records, and of the rank reports that
  // name nonfinite tensors.
  std::set<int64_t> global_steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return global_steps_;
  }
  std::vector<int64_t> tensor_reports() {
    std::lock_guard<std::mutex> lock(mu_);
    return tensor_reports_;
  }
  // How many distinct global records had arrived before each tensor report.
  std::vector<size_t> globals_before_report() {
    std::lock_guard<std::mutex> lock(mu_);
    return globals_before_report_;
  }
  std::vector<v1::Hello> hellos() {
    std::lock_guard<std::mutex> lock(mu_);
    return hellos_;
  }
  std::vector<v1::CommandAck> command_acks() {
    std::lock_guard<std::mutex> lock(mu_);
    return acks_;
  }
  // The shard ids of the run's (global) record of `step`.
  std::vector<uint64_t> shards(int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    return shards_[step];
  }
  std::vector<std::string> shard_names(int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    return shard_names_[step];
  }
  // The run's (global) record of `step`, whole; nullopt until it arrived.
  std::optional<v1::StepReport> global_report(int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = global_reports_.find(step);
    if (it == global_reports_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::mutex mu_;
  std::set<int64_t> steps_, global_steps_;
  std::vector<int64_t> tensor_reports_;
  std::vector<size_t> globals_before_report_;
  std::map<int64_t, std::vector<uint64_t>> shards_;
  std::map<int64_t, std::vector<std::string>> shard_names_;
  std::map<int64_t, v1::StepReport> global_reports_;
  int64_t duplicates_ = 0, received_ = 0;
  std::vector<v1::CommandAck> acks_;
  std::vector<v1::Hello> hellos_;
};

class Running {
 public:
  Running(FakeServer* service, int port) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials());
    b.RegisterService(service);
    server_ = b.BuildAndStart();
    REQUIRE(server_ != nullptr);
  }
  ~Running() { Stop(); }
  void Stop() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_.reset();
  }

 private:
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace trainwatch::agent

#endif  // TRAINWATCH_TESTS_AGENT_FAKE_TRAINWATCHD_H_
