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
  // Four reports 20 ms apart for a stream nobody registered (their acks are
  // dropped): with no interval, four batches; with a second's, the first
  // goes at once and the other three together.
  for (const int64_t interval_ms : {int64_t{0}, int64_t{1000}}) {
    SinkCounters counters;
    {
      AckBatcher batcher(50'000, interval_ms, &counters);
      for (int64_t step = 1; step <= 4; ++step) {
        trainwatch::v1::AgentMessage m;
        m.mutable_step_report()->set_step(step);
        batcher.Submit(/*stream_id=*/7, std::move(m));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }  // drains and joins
    INFO("commit interval " << interval_ms << " ms");
    CHECK(counters.batches.load() == (interval_ms == 0 ? 4u : 2u));
  }
}

}  // namespace
}  // namespace trainwatch::bench
