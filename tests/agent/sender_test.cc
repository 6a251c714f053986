// The sender alone, without an Agent: records pushed into its ring reach a
// fake trainwatchd and are acknowledged; control messages and commands go
// both ways; its stall timer and heartbeat run on the clock it is given.

#include "sender.h"

#include <dirent.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <limits>
#include <memory>

#include <catch2/catch.hpp>

#include "fake_trainwatchd.h"
#include "spill.h"
#include "test_util.h"
#include "testing/fake_clock.h"
#include "testing/wait.h"

namespace trainwatch::agent::internal {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using trainwatch::testing::FakeClock;
using trainwatch::testing::FreePort;
using trainwatch::testing::WaitUntil;

AgentConfig Config(int port) {
  AgentConfig c;
  c.server_address = "127.0.0.1:" + std::to_string(port);
  c.run_id = "run-s";
  c.host_name = "host";
  c.reconnect_initial_ms = 20;
  c.reconnect_max_ms = 200;
  return c;
}

const Origin kOrigin{"run-s", 0, 1};

void Push(Sender& sender, int64_t step) {
  Slot* slot = sender.BeginRecord();
  REQUIRE(slot != nullptr);
  static_cast<core::Step&>(*slot) = core::Step(step, core::StepValues().Set(core::Signal::kLoss, 2.5));
  sender.Commit(slot);
}

AgentStats StatsOf(const Sender& sender) {
  AgentStats s;
  sender.FillStats(&s);
  return s;
}

// Threads of this process for which `pred(tid)` holds.
template <typename Pred>
int CountThreads(Pred pred) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  REQUIRE(d != nullptr);
  while (dirent* e = readdir(d)) {
    const int tid = std::atoi(e->d_name);
    if (tid > 0 && pred(tid)) ++n;
  }
  closedir(d);
  return n;
}

// Threads of this process running as SCHED_BATCH.
int BatchThreads() {
  return CountThreads([](int tid) { return sched_getscheduler(tid) == SCHED_BATCH; });
}

// Threads of this process at nice `nice`.
int ThreadsAtNice(int nice) {
  return CountThreads([nice](int tid) {
    errno = 0;
    const int p = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
    return errno == 0 && p == nice;
  });
}

// A wake-up of the sender's (every few ms, every ack) must not preempt the
// training thread in Step(): on a busy machine that was most of its
// multi-millisecond maxima.
TEST_CASE("sender: its threads never preempt the training thread - SCHED_BATCH",
          "[agent][sender]") {
  const int port = FreePort();
  FakeServer fake;
  Running server(&fake, port);
  const int before = BatchThreads();
  Sender sender(Config(port), kOrigin, nullptr);
  sender.Start();
  Push(sender, 1);
  REQUIRE(WaitUntil([&] { return StatsOf(sender).durable_step == 1; }, seconds(20)));
  // The pump, the writer and the writer's reader, at least.
  CHECK(BatchThreads() - before >= 3);
  CHECK(sched_getscheduler(0) == SCHED_OTHER);  // the caller's own is left alone
  sender.Close(1000);
}

// SCHED_BATCH alone still let the sender's threads preempt the training
// thread at the next tick: nicer, they wait for it on a contended core.
TEST_CASE("sender: its threads run sender_nice nicer than the thread that started them",
          "[agent][sender]") {
  const int port = FreePort();
  FakeServer fake;
  Running server(&fake, port);
  errno = 0;
  const int mine = getpriority(PRIO_PROCESS, 0);
  REQUIRE(errno == 0);
  REQUIRE(mine <= 12);  // room for the 7 below under nice 19's cap
  AgentConfig cfg = Config(port);
  cfg.sender_nice = 7;
  const int before = ThreadsAtNice(mine + 7);
  Sender sender(cfg, kOrigin, nullptr);
  sender.Start();
  Push(sender, 1);
  REQUIRE(WaitUntil([&] { return StatsOf(sender).durable_step == 1; }, seconds(20)));
  // The pump, the writer and the writer's reader, at least.
  CHECK(ThreadsAtNice(mine + 7) - before >= 3);
  CHECK(getpriority(PRIO_PROCESS, 0) == mine);  // the caller's own is left alone
  sender.Close(1000);
}

TEST_CASE("sender: records reach the server and are acknowledged", "[agent][sender]") {
  const int port = FreePort();
  FakeServer fake;
  Running server(&fake, port);
  Sender sender(Config(port), kOrigin, nullptr);
  sender.Start();
  for (int64_t s = 0; s < 100; ++s) Push(sender, s);
  REQUIRE(WaitUntil([&] { return StatsOf(sender).durable_step == 99; }, seconds(20)));
  std::set<int64_t> want;
  for (int64_t s = 0; s < 100; ++s) want.insert(s);
  CHECK(fake.steps() == want);
  const AgentStats st = StatsOf(sender);
  CHECK(st.records_queued == 100);
  CHECK(st.records_acked == 100);
  CHECK(st.unacked == 0);
  CHECK(st.connected);
  sender.Close(1000);
}

// What `fn` writes to stderr (the file descriptor, as the sender writes it).
template <typename Fn>
std::string StderrOf(Fn fn) {
  trainwatch::testing::TempDir dir;
  const std::string path = dir.File("stderr");
  std::fflush(stderr);
  const int saved = dup(2);
  FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  dup2(fileno(f), 2);
  fn();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::fclose(f);
  return trainwatch::testing::ReadFile(path);
}

// Bursts are written with gRPC's buffer hint on all but their last write.
// A record on its own (the trainer's usual one a step) must still go out at
// once, not wait for a next write to flush it: the clock stands still, so no
// heartbeat comes to push a held-back record out.
TEST_CASE("sender: a lone record after a burst is acknowledged at once", "[agent][sender]") {
  const int port = FreePort();
  FakeServer fake;
  Running server(&fake, port);
  FakeClock clock;
  AgentConfig config = Config(port);
  config.clock = &clock;
  Sender sender(config, kOrigin, nullptr);
  sender.Start();
  REQUIRE(WaitUntil([&] { return StatsOf(sender).connected; }, seconds(5)));
  for (int64_t s = 0; s < 2000; ++s) Push(sender, s);
  REQUIRE(WaitUntil([&] { return StatsOf(sender).durable_step == 1999; }, seconds(20)));
  for (int64_t s = 2000; s < 2003; ++s) {
    Push(sender, s);
    // The pump moves it within 5 ms; a loaded machine gets the rest.
    CHECK(WaitUntil([&] { return StatsOf(sender).durable_step == s; }, milliseconds(1500)));
  }
  CHECK(fake.steps().size() == 2003);
  sender.Close(1000);
}

TEST_CASE("sender: closing with unacknowledged records and no spill folder warns with the count",
          "[agent][sender]") {
  // Nothing listens on the port: no record is ever acknowledged.
  Sender sender(Config(FreePort()), kOrigin, nullptr);
  sender.Start();
  for (int64_t s = 0; s < 7; ++s) Push(sender, s);
  const std::string err = StderrOf([&] { sender.Close(50); });
  INFO(err);
  CHECK(err.find("closing with 7 records not acknowledged") != std::string::npos);
  CHECK(err.find("steps 0..6") != std::string::npos);
  CHECK(err.find("TRAINWATCH_SPILL_DIR") != std::string::npos);
  CHECK(StatsOf(sender).records_dropped == 7);
}

TEST_CASE("sender: closing with a spill folder keeps the records without a warning",
          "[agent][sender]") {
  trainwatch::testing::TempDir dir;
  auto spill = SpillStore::Open(dir.path(), "run-s.0", 1 << 20);
  REQUIRE(spill.ok());
  Sender sender(Config(FreePort()), kOrigin, *std::move(spill));
  sender.Start();
  for (int64_t s = 0; s < 7; ++s) Push(sender, s);
  const std::string err = StderrOf([&] { sender.Close(50); });
  CHECK(err.find("not acknowledged") == std::string::npos);
  CHECK(StatsOf(sender).records_dropped == 0);
  CHECK(StatsOf(sender).unacked == 7);
}

TEST_CASE("sender: a control message goes out - a command comes back", "[agent][sender]") {
  const int port = FreePort();
  FakeServer fake;
  fake.send_command = true;
  Running server(&fake, port);
  Sender sender(Config(port), kOrigin, nullptr);
  sender.Start();
  std::optional<Command> cmd;
  REQUIRE(WaitUntil([&] { return (cmd = sender.PollCommand()).has_value(); }, seconds(5)));
  CHECK(cmd->command_id == "cmd-1");
  CHECK(cmd->kind == Command::Kind::kRollback);
  v1::AgentMessage ack;
  ack.mutable_command_ack()->set_command_id("cmd-1");
  ack.mutable_command_ack()->set_status(v1::ACK_STATUS_RECEIVED);
  sender.SendControl(ack);
  REQUIRE(WaitUntil([&] { return !fake.command_acks().empty(); }, seconds(5)));
  CHECK(fake.command_acks()[0].command_id() == "cmd-1");
  sender.Close(1000);
}

TEST_CASE("sender: abandoned steps are never sent", "[agent][sender]") {
  const int port = FreePort();
  Sender sender(Config(port), kOrigin, nullptr);
  sender.Start();  // the server is down: nothing acknowledged
  for (int64_t s = 0; s < 20; ++s) Push(sender, s);
  sender.AbandonAfter(9);
  CHECK(StatsOf(sender).unacked == 10);
  FakeServer fake;
  Running server(&fake, port);
  REQUIRE(WaitUntil([&] { return StatsOf(sender).durable_step == 9; }, seconds(20)));
  CHECK(fake.steps().size() == 10);
  CHECK(*fake.steps().rbegin() == 9);
  sender.Close(1000);
}

TEST_CASE("sender: the heartbeat follows the clock", "[agent][sender][clock]") {
  const int port = FreePort();
  FakeServer fake;
  Running server(&fake, port);
  FakeClock clock;
  AgentConfig config = Config(port);
  config.clock = &clock;
  Sender sender(config, kOrigin, nullptr);
  sender.Start();
  REQUIRE(WaitUntil([&] { return StatsOf(sender).connected; }, seconds(5)));
  // Real time passes, the clock does not: no heartbeat.
  std::this_thread::sleep_for(milliseconds(100));
  CHECK(fake.heartbeats == 0);
  clock.AdvanceMs(config.heartbeat_ms);
  CHECK(WaitUntil([&] { return fake.heartbeats > 0; }, seconds(5)));
  sender.Close(1000);
}

TEST_CASE("sender: no server answering for 30 s on the clock is said once - with where records go",
          "[agent][sender][clock]") {
  const int port = FreePort();  // nobody listens there
  FakeClock clock;
  AgentConfig config = Config(port);
  config.clock = &clock;
  // What the agent writes to fd 2 goes to a file for the test's span.
  char path[] = "/tmp/tw_sender_stderr_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  const int saved = dup(2);
  dup2(fd, 2);
  auto said = [&] {
    std::FILE* f = std::fopen(path, "r");
    std::string text;
    char buf[4096];
    size_t n;
    while (f != nullptr && (n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    if (f != nullptr) std::fclose(f);
    return text;
  };
  const std::string warning = "no trainwatchd has answered at 127.0.0.1:" + std::to_string(port);
  {
    Sender sender(config, kOrigin, nullptr);
    sender.Start();
    std::this_thread::sleep_for(milliseconds(500));  // many failed dials, no time on the clock
    const bool early = said().find(warning) != std::string::npos;
    clock.AdvanceMs(Sender::kUnansweredWarnMs);
    const bool warned = WaitUntil([&] { return said().find(warning) != std::string::npos; },
                                  seconds(10));
    std::this_thread::sleep_for(milliseconds(500));  // more failed dials: no second line
    clock.AdvanceMs(Sender::kUnansweredWarnMs);
    std::this_thread::sleep_for(milliseconds(500));
    sender.Close(0);
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    const std::string text = said();
    std::remove(path);
    close(fd);
    INFO(text);
    CHECK_FALSE(early);
    REQUIRE(warned);
    size_t count = 0;
    for (size_t at = text.find(warning); at != std::string::npos; at = text.find(warning, at + 1)) {
      ++count;
    }
    CHECK(count == 1);
    CHECK(text.find("the records wait in memory (the last 16384; older ones are dropped: set "
                    "TRAINWATCH_SPILL_DIR to keep them on disk)") != std::string::npos);
  }
}

TEST_CASE("sender: a write stalled past the timeout on the clock is cancelled",
          "[agent][sender][clock]") {
  const int port = FreePort();
  FakeServer fake;
  fake.stop_reading = true;  // a server that stopped reading: the writes fill the window
  Running server(&fake, port);
  FakeClock clock;
  AgentConfig config = Config(port);
  config.clock = &clock;
  config.stall_timeout_ms = 60'000;
  Sender sender(config, kOrigin, nullptr);
  sender.Start();
  REQUIRE(WaitUntil([&] { return StatsOf(sender).connected; }, seconds(5)));
  // Far more than the flow-control windows and socket buffers hold.
  for (int64_t s = 0; s < 400; ++s) {
    Slot* slot = sender.BeginRecord();
    REQUIRE(slot != nullptr);
    slot->step = s;
    slot->loss_ema_ratio = std::numeric_limits<double>::quiet_NaN();
    slot->gathered_shards.assign(10000, static_cast<uint64_t>(s) << 40);
    sender.Commit(slot);
  }
  std::this_thread::sleep_for(milliseconds(300));
  CHECK(StatsOf(sender).reconnects == 0);  // stuck, and the clock has not moved
  // Past the timeout on the clock: cancelled, so the writer reconnects. (The
  // clock moves on each poll: the write may start after any one advance.)
  CHECK(WaitUntil(
      [&] {
        clock.AdvanceMs(config.stall_timeout_ms / 2);
        return StatsOf(sender).reconnects >= 1;
      },
      seconds(10)));
  sender.Close(100);
}

}  // namespace
}  // namespace trainwatch::agent::internal
