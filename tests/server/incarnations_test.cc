// Issue 12, part 1: incarnations and resumes, on the ingestor with a real
// store and a fake clock. A job restarted from a checkpoint before its last
// stored step opens a new attempt that holds the resumed job's records,
// while the earlier attempt keeps the first job's; a reconnect of the same
// incarnation is no resume; a newer incarnation takes over from an older one
// still streaming; the engine of the new attempt is rebuilt to the resume
// step; an approved rollback under way governs; the operator sees the
// attempts.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "absl/synchronization/mutex.h"
#include "ingest/ingest.h"
#include "server_fixture.h"
#include "store/store.h"
#include "test_util.h"
#include "testing/fake_clock.h"
#include "trainwatch/cli/operator_commands.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using testing::Checkpoint;
using testing::Step;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The two jobs' losses differ, so a stored record says whose it is.
double FirstJob(int64_t s) { return 2.5 + 0.01 * std::sin(0.3 * static_cast<double>(s)); }
double SecondJob(int64_t s) { return 2.4 + 0.01 * std::cos(0.3 * static_cast<double>(s)); }

v1::AgentMessage Hello(const std::string& run, const std::string& incarnation,
                       std::optional<int64_t> resume_step = std::nullopt, int32_t rank = 0,
                       int32_t world = 1) {
  v1::AgentMessage m = testing::Hello(run, rank, world);
  m.mutable_hello()->set_incarnation_id(incarnation);
  if (resume_step) m.mutable_hello()->set_resume_step(*resume_step);
  return m;
}

// What the ingestor tells the streams.
class Listener : public IngestListener {
 public:
  void OnDurable(uint64_t, const std::string&, int32_t, int64_t) override {}
  void OnIncident(const IncidentRow&, IncidentChange) override {}
  void OnServerMessage(const std::string&, uint64_t stream,
                       const std::string& serialized) override {
    v1::ServerMessage m;
    REQUIRE(m.ParseFromString(serialized));
    if (!m.has_durability_ack()) return;
    absl::MutexLock lock(&mu_);
    hello_acks_[stream] = m.durability_ack();
  }
  void OnStreamFailed(uint64_t stream, const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    ended_[stream] = status;
  }
  // The DurabilityAck answering the stream's Hello.
  v1::DurabilityAck HelloAck(uint64_t stream) {
    absl::MutexLock lock(&mu_);
    REQUIRE(hello_acks_.count(stream) == 1);
    return hello_acks_[stream];
  }
  std::optional<absl::Status> Ended(uint64_t stream) {
    absl::MutexLock lock(&mu_);
    auto it = ended_.find(stream);
    if (it == ended_.end()) return std::nullopt;
    return it->second;
  }

 private:
  absl::Mutex mu_;
  std::map<uint64_t, v1::DurabilityAck> hello_acks_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::Status> ended_ ABSL_GUARDED_BY(mu_);
};

// An ingestor on a store in a temporary folder; Restart() is a restart of
// trainwatchd (a new ingestor recovering from the same database).
class Harness {
 public:
  Harness() {
    auto s = Store::Open(dir_.File("tw.db"));
    REQUIRE(s.ok());
    store_ = *std::move(s);
    Restart();
  }
  ~Harness() { ingestor_->Stop(); }

  void Restart() {
    if (ingestor_) ingestor_->Stop();
    ingestor_ = std::make_unique<Ingestor>(store_.get(), IngestOptions{}, &clock_);
    ingestor_->SetListener(&listener_);
    REQUIRE(ingestor_->Recover().ok());
    ingestor_->Start();
  }
  void Send(uint64_t stream, v1::AgentMessage m) {
    IngestItem item;
    item.stream_id = stream;
    item.received_ms = clock_.NowMs();
    item.message = std::move(m);
    ingestor_->Submit(std::move(item));
  }
  // Steps first..last of one job on `stream`, committed.
  void Train(uint64_t stream, const std::string& run, int64_t first, int64_t last,
             double (*loss)(int64_t)) {
    for (int64_t s = first; s <= last; ++s) Send(stream, Step(run, 0, 1, s, loss(s), 1.0));
    ingestor_->Flush();
  }
  std::vector<StepRow> Steps(const std::string& run, int64_t attempt, int64_t first,
                             int64_t last) {
    auto rows = store_->StepsBetween(run, attempt, first, last);
    REQUIRE(rows.ok());
    return *std::move(rows);
  }
  RunRow Row(const std::string& run) {
    auto runs = store_->LoadRuns();
    REQUIRE(runs.ok());
    for (const RunRow& r : *runs) {
      if (r.run_id == run) return r;
    }
    FAIL("no run " << run);
    return {};
  }
  std::vector<AttemptRow> Attempts(const std::string& run) {
    auto a = store_->Attempts(run, Row(run).attempt);
    REQUIRE(a.ok());
    return *std::move(a);
  }

  testing::TempDir dir_;
  std::unique_ptr<Store> store_;
  testing::FakeClock clock_;
  Listener listener_;
  std::unique_ptr<Ingestor> ingestor_;
};

// Every step in [first, last] stored once, with `loss`'s value.
void CheckSteps(const std::vector<StepRow>& rows, int64_t first, int64_t last,
                double (*loss)(int64_t)) {
  REQUIRE(rows.size() == static_cast<size_t>(last - first + 1));
  for (size_t i = 0; i < rows.size(); ++i) {
    INFO("step " << rows[i].step);
    CHECK(rows[i].step == first + static_cast<int64_t>(i));
    CHECK(rows[i].Get(core::Signal::kLoss) == loss(rows[i].step));
  }
}

TEST_CASE("resume: restarted at 50 after 99 and trained to 149 - both jobs' records kept",
          "[server][resume]") {
  Harness h;
  h.Send(1, Hello("r", "job-1"));
  h.Send(1, Checkpoint("r", 49));
  h.Train(1, "r", 0, 99, FirstJob);
  CHECK(h.listener_.HelloAck(1).durable_step().empty());  // a new run: nothing durable

  // The second job says where it resumed in one of three ways; a
  // trainwatchd restart in the middle changes nothing.
  enum class How { kFirstStep, kHello, kCheckpoint } how = How::kFirstStep;
  bool restart = false;
  SECTION("from its first step") {}
  SECTION("from the hello's resume_step") { how = How::kHello; }
  SECTION("from a checkpoint notice before its first step") { how = How::kCheckpoint; }
  SECTION("with trainwatchd restarted between the jobs and in the second") { restart = true; }
  if (restart) h.Restart();
  h.Send(2, Hello("r", "job-2", how == How::kHello ? std::optional<int64_t>(49) : std::nullopt));
  if (how == How::kCheckpoint) h.Send(2, Checkpoint("r", 49));
  h.ingestor_->Flush();
  // The run's last step (99) is the first job's: the resumed agent is told
  // of nothing durable, so it sends its records of 50..99.
  CHECK(h.listener_.HelloAck(2).durable_step().empty());
  h.Train(2, "r", 50, 100, SecondJob);
  if (restart) {
    h.Restart();
    // The same incarnation reconnects: its own records are durable, and it
    // re-sends from there (a little before, as after a lost ack).
    h.Send(3, Hello("r", "job-2"));
    h.ingestor_->Flush();
    const auto durable = h.listener_.HelloAck(3).durable_step();
    REQUIRE(durable.count(0) == 1);
    CHECK(durable.at(0) == 100);
    h.Train(3, "r", 95, 149, SecondJob);
  } else {
    h.Train(2, "r", 101, 149, SecondJob);
  }

  const RunRow row = h.Row("r");
  CHECK(row.attempt == 1);
  CHECK(row.last_step == 149);
  CHECK(row.incarnation == "job-2");
  // The current attempt: the first job's steps up to the resume point, then
  // the resumed job's 50..149.
  CheckSteps(h.Steps("r", 1, 0, 49), 0, 49, FirstJob);
  CheckSteps(h.Steps("r", 1, 50, 149), 50, 149, SecondJob);
  // The earlier attempt keeps the first job's 50..99.
  CheckSteps(h.Steps("r", 0, 0, 99), 0, 99, FirstJob);
  CHECK(h.Steps("r", 0, 100, 200).empty());
  const IngestStats st = h.ingestor_->Stats();
  if (!restart) {
    CHECK(st.duplicates_total == 0);  // nothing dropped
    CHECK(st.resumes_total == 1);
  }
  const std::vector<AttemptRow> attempts = h.Attempts("r");
  REQUIRE(attempts.size() == 2);
  CHECK(attempts[0].start == AttemptStart::kFirst);
  CHECK(attempts[0].first_step == 0);
  CHECK(attempts[0].last_step == 99);
  CHECK(attempts[1].start == AttemptStart::kResume);
  CHECK(attempts[1].incarnation == "job-2");
  CHECK(attempts[1].from_step == 49);
  CHECK(attempts[1].first_step == 0);
  CHECK(attempts[1].last_step == 149);
}

TEST_CASE("resume: the resume step comes from the hello - else a checkpoint - else the first step",
          "[server][resume]") {
  Harness h;
  h.Send(1, Hello("r", "job-1"));
  h.Train(1, "r", 0, 99, FirstJob);
  // The second job's first record is step 50 each time; where the carried
  // history ends shows which step the server took.
  int64_t expected = 49;
  SECTION("first step minus 1") { h.Send(2, Hello("r", "job-2")); }
  SECTION("the hello's resume_step wins over the rest") {
    h.Send(2, Hello("r", "job-2", 40));
    h.Send(2, Checkpoint("r", 45));
    expected = 40;
  }
  SECTION("a checkpoint notice before the first step") {
    h.Send(2, Hello("r", "job-2"));
    h.Send(2, Checkpoint("r", 45));
    expected = 45;
  }
  h.Train(2, "r", 50, 60, SecondJob);
  CHECK(h.Row("r").attempt == 1);
  CHECK(h.Row("r").resume_step == expected);
  CheckSteps(h.Steps("r", 1, 0, expected), 0, expected, FirstJob);
  CHECK(h.Steps("r", 1, expected + 1, 49).empty());
  CheckSteps(h.Steps("r", 1, 50, 60), 50, 60, SecondJob);
  CHECK(h.Attempts("r").back().from_step == expected);
}

TEST_CASE("resume: a reconnect of the same incarnation re-sending is deduplicated",
          "[server][resume]") {
  Harness h;
  h.Send(1, Hello("r", "job-1"));
  h.Train(1, "r", 0, 99, FirstJob);
  // The same launch reconnects (a new stream) and re-sends 80..99 (lost
  // acks) with more after them: no resume, the re-sent records are
  // duplicates.
  h.Send(2, Hello("r", "job-1"));
  h.ingestor_->Flush();
  REQUIRE(h.listener_.HelloAck(2).durable_step().count(0) == 1);
  CHECK(h.listener_.HelloAck(2).durable_step().at(0) == 99);
  h.Train(2, "r", 80, 120, FirstJob);
  CHECK(h.Row("r").attempt == 0);
  CheckSteps(h.Steps("r", 0, 0, 120), 0, 120, FirstJob);
  const IngestStats st = h.ingestor_->Stats();
  CHECK(st.duplicates_total == 20);
  CHECK(st.resumes_total == 0);
  CHECK(!h.listener_.Ended(1).has_value());
}

TEST_CASE("resume: a new incarnation after the last stored step continues the attempt",
          "[server][resume]") {
  Harness h;
  h.Send(1, Hello("r", "job-1"));
  h.Train(1, "r", 0, 99, FirstJob);
  h.Send(2, Hello("r", "job-2"));
  h.Train(2, "r", 100, 149, SecondJob);
  CHECK(h.Row("r").attempt == 0);
  CheckSteps(h.Steps("r", 0, 0, 99), 0, 99, FirstJob);
  CheckSteps(h.Steps("r", 0, 100, 149), 100, 149, SecondJob);
  CHECK(h.Attempts("r").size() == 1);
}

TEST_CASE("resume: a newer incarnation takes over - the older one is ended and refused",
          "[server][resume]") {
  Harness h;
  h.Send(1, Hello("r", "job-1"));
  h.Train(1, "r", 0, 99, FirstJob);
  // The first job's stream lingers (a preempted node) while the second
  // starts: the second takes over, the first's stream ends with a status
  // naming the second, and what it still sends is dropped.
  h.Send(2, Hello("r", "job-2"));
  h.Send(1, Step("r", 0, 1, 100, FirstJob(100), 1.0));
  h.Train(2, "r", 50, 120, SecondJob);
  const std::optional<absl::Status> ended = h.listener_.Ended(1);
  REQUIRE(ended.has_value());
  CHECK(ended->code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(ended->message()),
             Catch::Contains("incarnation job-1 was replaced by incarnation job-2"));
  CHECK(!h.listener_.Ended(2).has_value());
  // The first job reconnects: refused the same way, across a restart too.
  SECTION("at once") {}
  SECTION("after a trainwatchd restart") { h.Restart(); }
  h.Send(3, Hello("r", "job-1"));
  h.Send(3, Step("r", 0, 1, 101, FirstJob(101), 1.0));
  h.ingestor_->Flush();
  const std::optional<absl::Status> refused = h.listener_.Ended(3);
  REQUIRE(refused.has_value());
  CHECK(refused->code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused->message()), Catch::Contains("replaced by incarnation job-2"));
  CHECK(h.ingestor_->Stats().incarnation_conflicts_total >= 1);
  // Only the second job's records are in the current attempt.
  CheckSteps(h.Steps("r", 1, 50, 120), 50, 120, SecondJob);
  CheckSteps(h.Steps("r", 0, 0, 99), 0, 99, FirstJob);
  CHECK(h.Steps("r", 0, 100, 101).empty());  // the replaced job's late records
  CHECK(h.Row("r").incarnation == "job-2");
}

TEST_CASE("resume: the engine is rebuilt to the resume step - not the first job's tail",
          "[server][resume]") {
  // The reference: one job that trained the first job's 0..49, then the
  // second job's 50..149.
  Harness ref;
  ref.Send(1, Hello("ref", "only"));
  ref.Train(1, "ref", 0, 49, FirstJob);
  ref.Train(1, "ref", 50, 149, SecondJob);
  // The run: the first job goes on to 99 and meets a NaN at 80 (a tier 3
  // incident in its abandoned tail), then the second resumes after 49.
  Harness h;
  h.Send(1, Hello("r", "job-1"));
  h.Train(1, "r", 0, 79, FirstJob);
  h.Send(1, Step("r", 0, 1, 80, kNaN, 1.0));
  h.Train(1, "r", 81, 99, FirstJob);
  IncidentFilter f;
  f.run_id = "r";
  auto before = h.store_->ListIncidents(f);
  REQUIRE(before.ok());
  REQUIRE(!before->empty());
  h.Send(2, Hello("r", "job-2"));
  h.Train(2, "r", 50, 149, SecondJob);
  // The new attempt's windows are the reference's: same derived numbers and
  // decisions, step by step, and no new incident.
  const std::vector<StepRow> got = h.Steps("r", 1, 50, 149);
  const std::vector<StepRow> want = ref.Steps("ref", 0, 50, 149);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << got[i].step);
    CHECK(got[i].loss_ema_ratio == want[i].loss_ema_ratio);
    CHECK(got[i].decision == want[i].decision);
  }
  auto after = h.store_->ListIncidents(f);
  REQUIRE(after.ok());
  CHECK(after->size() == before->size());
}

TEST_CASE("resume: an approved rollback under way governs - no resume attempt",
          "[server][resume]") {
  Harness h;
  h.Send(1, Hello("r", "job-1"));
  h.Send(1, Checkpoint("r", 5));
  h.Train(1, "r", 0, 29, FirstJob);
  h.Send(1, Step("r", 0, 1, 30, kNaN, 1.0));  // tier 3: halt
  h.ingestor_->Flush();
  IncidentFilter f;
  f.run_id = "r";
  auto incidents = h.store_->ListIncidents(f);
  REQUIRE(incidents.ok());
  int64_t incident = 0;
  for (const IncidentRow& i : *incidents) {
    if (i.tier == 3) incident = i.id;
  }
  REQUIRE(incident != 0);
  ApprovalRequest r;
  r.incident_id = incident;
  r.to_step = 5;
  r.actor = "test";
  auto done = std::make_shared<std::promise<ApprovalOutcome>>();
  std::future<ApprovalOutcome> answer = done->get_future();
  h.ingestor_->SubmitApproval(r, [done](ApprovalOutcome o) { done->set_value(std::move(o)); });
  REQUIRE(answer.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  const ApprovalOutcome out = answer.get();
  REQUIRE(out.status.ok());
  v1::Decision d;
  REQUIRE(d.ParseFromString(out.decision));
  // The halted job was restarted: the new incarnation starts from the
  // checkpoint, as the rollback says, and applies it.
  h.Send(2, Hello("r", "job-2", 5));
  h.ingestor_->Flush();
  CHECK(h.Row("r").attempt == 0);
  v1::AgentMessage ack;
  ack.mutable_command_ack()->set_run_id("r");
  ack.mutable_command_ack()->set_command_id(d.command_id());
  ack.mutable_command_ack()->set_status(v1::ACK_STATUS_APPLIED);
  ack.mutable_command_ack()->set_resumed_step(5);
  h.Send(2, ack);
  h.Train(2, "r", 6, 40, SecondJob);
  CHECK(h.Row("r").attempt == 1);
  CHECK(h.ingestor_->Stats().resumes_total == 0);
  const std::vector<AttemptRow> attempts = h.Attempts("r");
  REQUIRE(attempts.size() == 2);
  CHECK(attempts[1].start == AttemptStart::kRollback);
  CHECK(attempts[1].incident_id == incident);
  CHECK(attempts[1].from_step == 5);
  CheckSteps(h.Steps("r", 1, 6, 40), 6, 40, SecondJob);
}

TEST_CASE("resume: twctl status and the report page show the attempts", "[server][resume][twctl]") {
  testing::TempDir dir;
  testing::Running server = testing::StartServer(dir.File("tw.db"));
  {
    testing::TestAgent first(server.channel);
    REQUIRE(first.Send(Hello("r", "job-1")));
    for (int64_t s = 0; s <= 99; ++s) REQUIRE(first.Send(Step("r", 0, 1, s, FirstJob(s), 1.0)));
    REQUIRE(first.WaitDurable(0, 99));
    first.Close();
  }
  testing::TestAgent second(server.channel);
  REQUIRE(second.Send(Hello("r", "job-2")));
  for (int64_t s = 50; s <= 149; ++s) REQUIRE(second.Send(Step("r", 0, 1, s, SecondJob(s), 1.0)));
  REQUIRE(second.WaitDurable(0, 149));
  auto twctl = [&](const std::string& command, std::vector<std::string> args) {
    args.insert(args.begin(), {"--server", server.address()});
    std::string out, err;
    const int rc = cli::OperatorCommand(
        command, args, [](const std::string&) { return true; }, &out, &err);
    INFO(out << err);
    REQUIRE(rc == 0);
    return out;
  };
  const std::string status = twctl("status", {"r"});
  CHECK_THAT(status, Catch::Contains("attempt 0: first launch, steps 0..99"));
  CHECK_THAT(status, Catch::Contains(
                         "attempt 1 (current): resume by incarnation job-2 after step 49, "
                         "steps 0..149"));
  const std::string page = dir.File("report.html");
  twctl("report", {"r", "--out", page});
  std::ifstream in(page);
  std::stringstream html;
  html << in.rdbuf();
  CHECK_THAT(html.str(), Catch::Contains("<h2>attempts</h2>"));
  CHECK_THAT(html.str(), Catch::Contains("resume by incarnation job-2 after step 49"));
  second.Close();
}

}  // namespace
}  // namespace trainwatch::server
