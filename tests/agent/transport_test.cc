// The agent's transport against a fake trainwatchd that is down at start,
// dies mid-run, is slow, repeats acks, or accepts connections and never
// reads; with spilling to disk and its bound; and commands coming back.

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>
#include <thread>

#include <catch2/catch.hpp>

#include "fake_trainwatchd.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::agent {
namespace {

namespace v1 = trainwatch::v1;
using Clock = std::chrono::steady_clock;

using testing::FreePort;
using testing::WaitUntil;

AgentConfig Config(int port) {
  AgentConfig c;
  c.server_address = "127.0.0.1:" + std::to_string(port);
  c.run_id = "run-t";
  c.reconnect_initial_ms = 20;
  c.reconnect_max_ms = 200;
  return c;
}

// Feeds steps [from, to) and returns the 99th percentile of the Step()
// calls' time, in ms. (Not the maximum: on a loaded 2-core machine any call
// can lose its core for tens of milliseconds; a call that waited on the
// network would take seconds, or forever with a black hole.)
double Feed(Agent& a, int64_t from, int64_t to) {
  std::vector<double> times;
  for (int64_t s = from; s < to; ++s) {
    StepInput in;
    in.step = s;
    in.loss = 2.5;
    in.grad_sum_squares = 1.0;
    in.grad_elements = 100;
    const auto t0 = Clock::now();
    REQUIRE(a.Step(in).ok());
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    REQUIRE(ms < 2000.0);  // no call may ever block on the network
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() * 99 / 100];
}

bool WaitDurable(Agent& a, int64_t step, int seconds = 20) {
  return WaitUntil([&] { return a.Stats().durable_step >= step; }, std::chrono::seconds(seconds));
}

std::set<int64_t> Range(int64_t from, int64_t to) {
  std::set<int64_t> s;
  for (int64_t i = from; i < to; ++i) s.insert(i);
  return s;
}

TEST_CASE("transport: server down at start - then up: nothing lost", "[agent][transport]") {
  const int port = FreePort();
  FakeServer fake;
  auto agent = Agent::Create(Config(port), std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  const double worst = Feed(**agent, 0, 500);
  CHECK(worst < 5.0);  // p99: never waits on the network
  CHECK_FALSE((*agent)->Stats().connected);
  Running server(&fake, port);
  REQUIRE(WaitDurable(**agent, 499));
  CHECK(fake.steps() == Range(0, 500));
  CHECK((*agent)->Stats().records_dropped == 0);
  CHECK((*agent)->Stats().unacked == 0);
  (*agent)->Close();
}

TEST_CASE("transport: server dies mid-run and comes back: re-sent - deduplicated",
          "[agent][transport]") {
  const int port = FreePort();
  FakeServer fake;
  auto agent = Agent::Create(Config(port), std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  {
    Running server(&fake, port);
    Feed(**agent, 0, 300);
    REQUIRE(WaitDurable(**agent, 299));
  }  // dies
  Feed(**agent, 300, 600);
  CHECK((*agent)->Stats().durable_step < 600);
  Running again(&fake, port);
  REQUIRE(WaitDurable(**agent, 599));
  CHECK(fake.steps() == Range(0, 600));
  CHECK((*agent)->Stats().reconnects >= 1);
  (*agent)->Close();
}

TEST_CASE("transport: slow acks and repeated or stale acks", "[agent][transport]") {
  const int port = FreePort();
  FakeServer fake;
  fake.ack_delay_ms = 2;
  fake.repeat_acks = true;
  Running server(&fake, port);
  auto agent = Agent::Create(Config(port), std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  const double worst = Feed(**agent, 0, 400);
  CHECK(worst < 5.0);
  REQUIRE(WaitDurable(**agent, 399));
  const AgentStats s = (*agent)->Stats();
  CHECK(s.durable_step == 399);  // a stale ack never moves it back
  CHECK(s.records_acked == 400);
  CHECK(s.unacked == 0);
  (*agent)->Close();
}

TEST_CASE("transport: a NaN's tensor report does not overtake the records before it",
          "[agent][transport]") {
  // The report shares its step's acknowledgement. Sent ahead of the records
  // still waiting in the ring (the pump moves them every few milliseconds),
  // its ack would cover records the agent had not sent yet, and the agent
  // would drop them as durable.
  const int port = FreePort();
  FakeServer fake;
  Running server(&fake, port);
  AgentConfig config = Config(port);
  config.ring_records = 1 << 16;  // room for every record: none dropped on a busy machine
  auto agent = Agent::Create(config, std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  // Each round is a chance for the race: steps, then a NaN at once.
  constexpr int64_t kRound = 1000, kRounds = 5;
  const std::vector<core::TensorStat> tensors = {{"layers.3.mlp.weight", 0.0, 2, 64}};
  std::vector<int64_t> nan_steps;
  for (int64_t round = 0; round < kRounds; ++round) {
    Feed(**agent, round * kRound, (round + 1) * kRound - 1);
    StepInput in;
    in.step = (round + 1) * kRound - 1;
    in.loss = 2.5;
    in.grad_sum_squares = std::nan("");
    in.grad_nonfinite = 2;
    in.grad_elements = 100;
    in.tensors = tensors;
    REQUIRE((*agent)->Step(in).ok());
    nan_steps.push_back(in.step);
  }
  const bool durable = WaitDurable(**agent, kRounds * kRound - 1, 60);
  INFO("dropped " << (*agent)->Stats().records_dropped << ", durable step "
                  << (*agent)->Stats().durable_step);
  REQUIRE(durable);
  (*agent)->Close(10000);
  CHECK(fake.global_steps() == Range(0, kRounds * kRound));
  CHECK(fake.tensor_reports() == nan_steps);
  // Each report arrived after every record up to its own step.
  std::vector<size_t> in_order;
  for (int64_t step : nan_steps) in_order.push_back(static_cast<size_t>(step) + 1);
  CHECK(fake.globals_before_report() == in_order);
}

TEST_CASE("transport: records spill to disk while the server is away - then drain",
          "[agent][transport][spill]") {
  const int port = FreePort();
  const std::string dir = "/tmp/tw_spill_" + std::to_string(port);
  std::filesystem::remove_all(dir);
  AgentConfig cfg = Config(port);
  cfg.memory_records = 50;
  cfg.spill_dir = dir;
  FakeServer fake;
  auto agent = Agent::Create(cfg, std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  Feed(**agent, 0, 1000);
  // Let the pump move everything out of the ring.
  WaitUntil([&] { return (*agent)->Stats().records_spilled >= 900; }, std::chrono::seconds(1));
  AgentStats s = (*agent)->Stats();
  CHECK(s.records_spilled >= 900);
  CHECK(s.records_dropped == 0);
  CHECK(s.spill_bytes > 0);
  Running server(&fake, port);
  REQUIRE(WaitDurable(**agent, 999));
  CHECK(fake.steps() == Range(0, 1000));
  s = (*agent)->Stats();
  CHECK(s.spill_bytes == 0);  // acknowledged segments are deleted
  (*agent)->Close();
  std::filesystem::remove_all(dir);
}

TEST_CASE("transport: a full spill drops the oldest records and counts them",
          "[agent][transport][spill]") {
  const int port = FreePort();
  const std::string dir = "/tmp/tw_spillfull_" + std::to_string(port);
  std::filesystem::remove_all(dir);
  AgentConfig cfg = Config(port);
  cfg.memory_records = 20;
  cfg.spill_dir = dir;
  cfg.spill_max_bytes = 16 * 1024;
  FakeServer fake;
  auto agent = Agent::Create(cfg, std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  Feed(**agent, 0, 2000);
  WaitUntil([&] { return (*agent)->Stats().records_dropped > 0; }, std::chrono::seconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const AgentStats s = (*agent)->Stats();
  CHECK(s.records_dropped > 0);
  CHECK(s.spill_bytes <= 16 * 1024);
  Running server(&fake, port);
  REQUIRE(WaitDurable(**agent, 1999));
  const std::set<int64_t> got = fake.steps();
  // The newest survived; what was lost is exactly what was counted, oldest first.
  CHECK(got.count(1999) == 1);
  CHECK(got.count(0) == 0);
  CHECK(static_cast<int64_t>(got.size()) + (*agent)->Stats().records_dropped == 2000);
  (*agent)->Close();
  std::filesystem::remove_all(dir);
}

TEST_CASE("transport: a black-holed server (accepts - never reads) does not slow the step",
          "[agent][transport]") {
  // A listener whose connections are accepted by the kernel and never read.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(listen(fd, 16) == 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  auto agent = Agent::Create(Config(ntohs(a.sin_port)), std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  const double worst = Feed(**agent, 0, 5000);
  CHECK(worst < 5.0);
  CHECK((*agent)->Stats().durable_step == -1);
  const auto t0 = Clock::now();
  (*agent)->Close(100);
  CHECK(Clock::now() - t0 < std::chrono::seconds(5));  // closes despite the hole
  close(fd);
}

TEST_CASE("transport: commands reach the trainer by callback and poll - acks go back",
          "[agent][transport][commands]") {
  const int port = FreePort();
  FakeServer fake;
  fake.send_command = true;
  Running server(&fake, port);
  auto agent = Agent::Create(Config(port), std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  Feed(**agent, 0, 10);
  std::optional<Command> cmd;
  WaitUntil([&] { return (cmd = (*agent)->PollCommand()).has_value(); }, std::chrono::seconds(3));
  REQUIRE(cmd.has_value());
  CHECK(cmd->kind == Command::Kind::kRollback);
  CHECK(cmd->command_id == "cmd-1");
  CHECK(cmd->target_step == 3000);
  CHECK(cmd->checkpoint_uri == "ckpt://3000");
  REQUIRE(cmd->quarantine.size() == 1);
  CHECK(cmd->quarantine[0] == std::make_pair<uint64_t, uint64_t>(10, 20));
  CHECK(cmd->quarantine_names == std::vector<std::string>{"train-00012-of-01024.parquet"});
  // The loader's query: the run's list, which follows the command.
  WaitUntil([&] { return (*agent)->IsQuarantined("train-00012-of-01024.parquet"); },
            std::chrono::seconds(3));
  CHECK((*agent)->IsQuarantined("train-00012-of-01024.parquet"));
  CHECK_FALSE((*agent)->IsQuarantined("train-00012-of-01024.parquet:0"));  // exact match
  CHECK((*agent)->IsQuarantined(uint64_t{15}));
  CHECK_FALSE((*agent)->IsQuarantined(uint64_t{21}));
  CHECK((*agent)->QuarantinedShardNames() ==
        std::vector<std::string>{"train-00012-of-01024.parquet"});
  REQUIRE(cmd->skip_steps.has_value());
  CHECK(*cmd->skip_steps == std::make_pair<int64_t, int64_t>(3001, 3050));
  CHECK(cmd->z_loss_alpha.value_or(0) == 1e-4);
  (*agent)->Acknowledge("cmd-1", AckStatus::kApplied, "loaded ckpt://3000", 3000);
  WaitUntil([&] { return !fake.command_acks().empty(); }, std::chrono::seconds(3));
  REQUIRE(fake.command_acks().size() == 1);
  CHECK(fake.command_acks()[0].status() == v1::ACK_STATUS_APPLIED);
  CHECK(fake.command_acks()[0].resumed_step() == 3000);
  (*agent)->Close();
}

}  // namespace
}  // namespace trainwatch::agent

namespace trainwatch::agent {
namespace {

TEST_CASE("transport: shard names go out with the step as given", "[agent][transport][shards]") {
  const int port = FreePort();
  FakeServer fake;
  Running server(&fake, port);
  auto agent = Agent::Create(Config(port), std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  const std::vector<uint64_t> ids = {7};
  const std::vector<std::string> names = {"shard-00500:0", "s3://b/k;x"};
  StepInput in;
  in.step = 0;
  in.loss = 2.5;
  in.shards = ids;
  in.shard_names = names;
  REQUIRE((*agent)->Step(in).ok());
  REQUIRE(WaitDurable(**agent, 0));
  CHECK(fake.shard_names(0) == names);
  CHECK(fake.shards(0) == ids);
  (*agent)->Close();
}

TEST_CASE("transport: a step past the shard-name bounds is refused - nothing is sent",
          "[agent][transport][shards]") {
  const int port = FreePort();
  FakeServer fake;
  Running server(&fake, port);
  auto agent = Agent::Create(Config(port), std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  StepInput in;
  in.step = 0;
  in.loss = 2.5;
  const std::vector<std::string> too_long = {std::string(257, 'n')};
  in.shard_names = too_long;
  absl::StatusOr<Verdict> v = (*agent)->Step(in);
  REQUIRE_FALSE(v.ok());
  CHECK(v.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(v.status().message().find("above the 256 a shard name may have") != absl::string_view::npos);
  const std::vector<std::string> too_many(1025, "n");
  in.shard_names = too_many;
  v = (*agent)->Step(in);
  REQUIRE_FALSE(v.ok());
  CHECK(v.status().message() == "step: 1025 shard names, above the 1024 a record may carry");
  // The refused steps took no step number: step 0 is still the next.
  in.shard_names = {};
  REQUIRE((*agent)->Step(in).ok());
  REQUIRE(WaitDurable(**agent, 0));
  CHECK((*agent)->Stats().steps == 1);
  (*agent)->Close();
}

TEST_CASE("transport: after ResumeFrom the abandoned steps are never sent", "[agent][transport]") {
  const int port = FreePort();
  FakeServer fake;
  auto agent = Agent::Create(Config(port), std::make_unique<SingleProcessReducer>());
  REQUIRE(agent.ok());
  Feed(**agent, 0, 100);  // the server is down: nothing acknowledged
  (*agent)->ResumeFrom(49);
  Feed(**agent, 50, 80);
  Running server(&fake, port);
  REQUIRE(WaitDurable(**agent, 79));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(fake.steps() == Range(0, 80));  // 80..99 of the first attempt never went out
  (*agent)->Close();
}

}  // namespace
}  // namespace trainwatch::agent

namespace trainwatch::agent {
namespace {

TEST_CASE("transport: a skipped step's record carries every rank's shard ids", "[agent][ranks]") {
  const int port = FreePort();
  FakeServer service;
  Running server(&service, port);
  constexpr int kRanks = 3;
  constexpr int64_t kBad = 1100, kSteps = 1200;
  // Ids beyond 2^53 must survive the trip through the collective's doubles.
  auto shard = [](int r, int64_t s) { return (uint64_t{1} << 60) + 7 + 1000000 * r + s; };
  InProcessGroup group(kRanks);
  std::vector<std::thread> threads;
  std::vector<int> skips(kRanks, 0);
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto agent = Agent::Create(Config(port), group.ReducerFor(r));
      REQUIRE(agent.ok());
      for (int64_t s = 0; s < kSteps; ++s) {
        const std::vector<uint64_t> mine = {shard(r, s)};
        StepInput in;
        in.step = s;
        in.loss = 2.5 + 0.01 * std::sin(static_cast<double>(s + r));
        in.grad_sum_squares = 1.0 + 0.05 * std::cos(static_cast<double>(s * (r + 1)));
        in.grad_elements = 100;
        in.shards = mine;
        if (s == kBad && r == 2) {  // rank 2's batch is the bad one
          in.loss = 9.0;
          in.grad_sum_squares = 400.0;
        }
        const absl::StatusOr<Verdict> v = (*agent)->Step(in);
        if (!v.ok()) ++skips[r];  // shows as a wrong count: Catch's assertions are not for threads
        if (v.ok() && v->decision == Decision::kSkipUpdate) ++skips[r];
      }
      if (r == 0) REQUIRE(WaitDurable(**agent, kSteps - 1));
      (*agent)->Close(2000);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(skips == std::vector<int>(kRanks, 1));
  CHECK(service.shards(kBad) ==
        std::vector<uint64_t>{shard(0, kBad), shard(1, kBad), shard(2, kBad)});
  // Healthy steps: rank 0's own shards only, no extra collective.
  CHECK(service.shards(kBad - 1) == std::vector<uint64_t>{shard(0, kBad - 1)});
}

}  // namespace
}  // namespace trainwatch::agent
