// The sinks against the load generator, in one process on 127.0.0.1: both
// acknowledge every record, and the batch sink acknowledges as trainwatchd
// does, at most once per stream per writer batch.
#include "sink_service.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <thread>

#include "load_generator.h"

namespace trainwatch::bench {
namespace {

struct Sink {
  explicit Sink(AckMode mode) : service(Options(mode)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Sink() {
    if (server) server->Shutdown(std::chrono::system_clock::now());
  }
  static SinkOptions Options(AckMode mode) {
    SinkOptions o;
    o.ack = mode;
    return o;
  }
  SinkService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

LoadResult Load(int port) {
  LoadConfig c;
  c.target = "127.0.0.1:" + std::to_string(port);
  c.runs = 2;
  c.ranks_per_run = 3;
  c.per_rank = true;
  c.steps = 400;
  c.window = 64;
  c.duration_limit = absl::Seconds(30);
  absl::StatusOr<LoadResult> r = RunLoad(c, nullptr);
  REQUIRE(r.ok());
  return *r;
}

TEST_CASE("ingest sink: the batch sink acks each stream at most once per batch",
          "[bench][ingest]") {
  Sink sink(AckMode::kBatch);
  REQUIRE(sink.server != nullptr);
  const LoadResult r = Load(sink.port);
  CHECK(r.complete);
  CHECK(r.stream_errors == 0);
  CHECK(r.records_acked == r.records_planned);
  CHECK(r.acks_ahead_of_sends == 0);
  const SinkCounters& c = sink.service.counters();
  CHECK(c.step_reports.load() == r.records_planned);
  REQUIRE(c.batches.load() > 0);
  // Two messages answer each Hello (an empty ack, the quarantine list);
  // every other write is a batch's ack, one per stream (and key) at most.
  const uint64_t streams = static_cast<uint64_t>(r.streams);
  CHECK(c.acks_sent.load() <= 2 * streams + c.batch_acks_owed.load());
}

TEST_CASE("ingest sink: the per-record sink acks without a writer batch", "[bench][ingest]") {
  Sink sink(AckMode::kPerRecord);
  REQUIRE(sink.server != nullptr);
  const LoadResult r = Load(sink.port);
  CHECK(r.complete);
  CHECK(r.records_acked == r.records_planned);
  CHECK(sink.service.counters().batches.load() == 0);
  CHECK(sink.service.counters().batch_acks_owed.load() == 0);
}

TEST_CASE("ingest sink: the batch sink waits for more as trainwatchd's commit interval does",
          "[bench][ingest]") {
  // Reports for a stream nobody registered (their acks are dropped). No
  // sleeps decide the outcome, so a loaded machine cannot change it.
  trainwatch::v1::AgentMessage m;
  SECTION("with no interval, a lone report is committed without waiting for more") {
    SinkCounters counters;
    AckBatcher batcher(50'000, /*interval_ms=*/0, &counters);
    for (uint64_t step = 1; step <= 4; ++step) {
      m.mutable_step_report()->set_step(static_cast<int64_t>(step));
      batcher.Submit(/*stream_id=*/7, trainwatch::v1::AgentMessage(m));
      // Only this report is queued: a batcher that waited for another one
      // would never commit it.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (counters.batches.load() < step && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      REQUIRE(counters.batches.load() == step);
    }
  }
  SECTION("with an interval, the first goes at once and the rest wait for it") {
    SinkCounters counters;
    {
      // An hour: nothing but the drain at the end can end the wait.
      AckBatcher batcher(50'000, /*interval_ms=*/3'600'000, &counters);
      m.mutable_step_report()->set_step(1);
      batcher.Submit(/*stream_id=*/7, trainwatch::v1::AgentMessage(m));
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (counters.batches.load() < 1 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      REQUIRE(counters.batches.load() == 1);
      for (int64_t step = 2; step <= 4; ++step) {
        m.mutable_step_report()->set_step(step);
        batcher.Submit(/*stream_id=*/7, trainwatch::v1::AgentMessage(m));
      }
      CHECK(counters.batches.load() == 1);  // still waiting
    }  // drains and joins
    CHECK(counters.batches.load() == 2);
  }
}

}  // namespace
}  // namespace trainwatch::bench
