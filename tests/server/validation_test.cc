// Strict validation at the server's edges (issue 13): trainwatchd's flags
// (the function and the real binary), the agent protocol's preconditions,
// run ids, decisions, token files, the per-token run quota and server
// reflection behind a token.

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/sync_stream.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "admission/agent_message_checks.h"
#include "admission/auth.h"
#include "ingest/rollback.h"
#include "daemon/server.h"
#include "server_fixture.h"
#include "test_util.h"

namespace trainwatch::server {
namespace {

namespace v1 = trainwatch::v1;
using testing::Hello;
using testing::Running;
using testing::StartServer;
using testing::Step;
using testing::TempDir;
using testing::TestAgent;

ServerOptions Valid(const TempDir& dir) {
  ServerOptions o;
  o.db_path = dir.File("tw.db");
  return o;
}

std::string MessageOf(const ServerOptions& o) {
  return std::string(CheckServerOptions(o).message());
}

TEST_CASE("validation: every trainwatchd option is range-checked before anything starts",
          "[server][validation][options]") {
  TempDir dir;
  CHECK(CheckServerOptions(Valid(dir)).ok());
  ServerOptions o = Valid(dir);
  o.db_path = "";
  CHECK(MessageOf(o) == "--db must name a database file, not '' (a database gone at exit)");
  o.db_path = ":memory:";
  CHECK(CheckServerOptions(o).code() == absl::StatusCode::kInvalidArgument);
  o.db_path = dir.path();
  CHECK(MessageOf(o) == "--db " + dir.path() + " is a directory: name a database file");
  o = Valid(dir);
  o.listen = "127.0.0.1:99999";
  CHECK(MessageOf(o) ==
        "--listen '127.0.0.1:99999': the port must be a number in [0, 65535] (0: pick a free "
        "one)");
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", "127.0.0.1:-1", "127.0.0.1:7o70",
                          ":7070", "a b:7070", "[zz]:7070", "unix:"}) {
    INFO(bad);
    o.listen = bad;
    CHECK(CheckServerOptions(o).code() == absl::StatusCode::kInvalidArgument);
  }
  for (const char* good : {"127.0.0.1:0", "0.0.0.0:7070", "[::1]:7070", "[::]:65535",
                           "localhost:7070", "unix:/tmp/tw.sock"}) {
    INFO(good);
    o.listen = good;
    CHECK(CheckServerOptions(o).ok());
  }
  o = Valid(dir);
  o.metrics_listen = "unix:/tmp/m.sock";
  CHECK(CheckServerOptions(o).code() == absl::StatusCode::kInvalidArgument);
  o.metrics_listen = "";  // no metrics
  CHECK(CheckServerOptions(o).ok());
  o = Valid(dir);
  o.max_message_bytes = 0;
  CHECK(MessageOf(o) == "--max_message_bytes must be in [1024, 1073741824], not 0");
  o.max_message_bytes = -1;
  CHECK(CheckServerOptions(o).code() == absl::StatusCode::kInvalidArgument);
  o = Valid(dir);
  o.ingest.aggregation_timeout_ms = -5;
  CHECK(MessageOf(o) == "--aggregation_timeout_ms must be in [1, 86400000], not -5");
  o = Valid(dir);
  o.max_world_size = 0;
  CHECK(MessageOf(o) == "--max_world_size must be in [1, 1000000], not 0");
  o = Valid(dir);
  o.max_runs_per_token = -1;
  CHECK(MessageOf(o) == "--max_runs_per_token must be in [1, 1000000], not -1");
  // Start refuses the same, before it creates the database.
  o = Valid(dir);
  o.max_message_bytes = 0;
  CHECK(Server::Start(o).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(std::ifstream(o.db_path).good());
}

// Runs trainwatchd with `flags`; a binary that starts anyway is stopped by
// timeout (status 124) so the test cannot hang or leave it running.
int Trainwatchd(const std::string& flags, std::string* out) {
  return testing::RunCommand(std::string("timeout 20 ") + TRAINWATCHD_PATH +
                                 " --listen=127.0.0.1:0 --metrics_listen= " + flags,
                             "", out);
}

TEST_CASE("validation: trainwatchd exits 2 on a bad flag with one line naming it",
          "[server][validation][options]") {
  TempDir dir;
  const std::string db = " --db=" + dir.File("tw.db");
  struct Case {
    std::string flags;
    std::string line;
  };
  for (const Case& c : std::vector<Case>{
           {"--db=", "trainwatchd: --db must name a database file, not '' (a database gone at "
                     "exit)\n"},
           {db + " --listen=127.0.0.1:99999",
            "trainwatchd: --listen '127.0.0.1:99999': the port must be a number in [0, 65535] "
            "(0: pick a free one)\n"},
           {db + " --max_message_bytes=0",
            "trainwatchd: --max_message_bytes must be in [1024, 1073741824], not 0\n"},
           {db + " --max_message_bytes=-1",
            "trainwatchd: --max_message_bytes must be in [1024, 1073741824], not -1\n"},
           {db + " --aggregation_timeout_ms=-1",
            "trainwatchd: --aggregation_timeout_ms must be in [1, 86400000], not -1\n"},
           {db + " --max_world_size=0",
            "trainwatchd: --max_world_size must be in [1, 1000000], not 0\n"},
           {db + " --db_synchronous=off",
            "trainwatchd: --db_synchronous must be 'full' or 'normal', not 'off'\n"},
           // SQLite's knobs with a PostgreSQL database, refused before it
           // is reached.
           {" --db=postgresql:///tw --db_max_bytes=8192",
            "trainwatchd: --db_max_bytes is a quota on a SQLite file: with PostgreSQL, set "
            "quotas on its server\n"},
           {" '--db=host=/nonexistent dbname=tw' --db_synchronous=normal",
            "trainwatchd: --db_synchronous normal is SQLite's: with PostgreSQL, what a commit "
            "waits for is the server's synchronous_commit\n"}}) {
    INFO(c.flags);
    std::string out;
    CHECK(Trainwatchd(c.flags, &out) == 2);
    CHECK(out == c.line);
  }
  // Nothing started: no database was created. (A file flag naming a
  // directory: file_errors_test.cc.)
  CHECK_FALSE(std::ifstream(dir.File("tw.db")).good());
}

TEST_CASE("validation: the agent protocol's rules on one message", "[server][validation][agent]") {
  const AgentStreamLimits limits;
  AgentStreamProgress fresh, started;
  started.hello_seen = true;
  auto code = [&](const v1::AgentMessage& m, const AgentStreamProgress& p) {
    return CheckAgentMessage(m, p, limits).code();
  };
  using absl::StatusCode;
  CHECK(code(Hello("run-a", 0, 2), fresh) == StatusCode::kOk);
  CHECK(code(Step("run-a", 0, 2, 0, 2.5, 1.0), fresh) == StatusCode::kFailedPrecondition);
  CHECK(code(Step("run-a", 0, 2, 0, 2.5, 1.0), started) == StatusCode::kOk);
  CHECK(code(v1::AgentMessage(), started) == StatusCode::kInvalidArgument);
  CHECK(code(Hello("run-a", -7, 2), fresh) == StatusCode::kInvalidArgument);
  CHECK(code(Hello("run-a", 2, 2), fresh) == StatusCode::kInvalidArgument);
  CHECK(code(Hello("run-a", 0, 0), fresh) == StatusCode::kInvalidArgument);
  CHECK(code(Hello("run-a", 0, 65'536), fresh) == StatusCode::kOk);
  CHECK(std::string(CheckAgentMessage(Hello("run-a", 0, 65'537), fresh, limits).message()) ==
        "hello: world_size 65537 is outside [1, 65536] (--max_world_size)");
  CHECK(code(Step("run-a", -1, 2, 0, 2.5, 1.0), started) == StatusCode::kInvalidArgument);
  CHECK(code(Step("run-a", 0, 0, 0, 2.5, 1.0), started) == StatusCode::kInvalidArgument);
  CHECK(code(Step("run-a", 0, 1, -3, 2.5, 1.0), started) == StatusCode::kInvalidArgument);
  v1::AgentMessage ck;
  ck.mutable_checkpoint()->set_run_id("run-a");
  ck.mutable_checkpoint()->set_step(10);
  CHECK(code(ck, started) == StatusCode::kInvalidArgument);  // no uri
  ck.mutable_checkpoint()->set_uri("ckpt://10");
  CHECK(code(ck, started) == StatusCode::kOk);
}

TEST_CASE("validation: a step report's shard names are bounded - the error names the bound",
          "[server][validation][agent][shards]") {
  const AgentStreamLimits limits;
  AgentStreamProgress started;
  started.hello_seen = true;
  v1::AgentMessage m = Step("run-a", 0, 1, 3, 2.5, 1.0);
  for (int i = 0; i < 1024; ++i) m.mutable_step_report()->add_shard_names("s" + std::to_string(i));
  m.mutable_step_report()->set_shard_names(0, std::string(256, 'n'));
  CHECK(CheckAgentMessage(m, started, limits).ok());
  m.mutable_step_report()->add_shard_names("one-too-many");
  absl::Status s = CheckAgentMessage(m, started, limits);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()) ==
        "step_report: 1025 shard names, above the 1024 a record may carry");
  m.mutable_step_report()->clear_shard_names();
  m.mutable_step_report()->add_shard_names(std::string(257, 'n'));
  s = CheckAgentMessage(m, started, limits);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("257 bytes, above the 256 a shard name may have") !=
        std::string::npos);
  m.mutable_step_report()->set_shard_names(0, "");
  CHECK(std::string(CheckAgentMessage(m, started, limits).message()) ==
        "step_report: a shard name is empty");
}

TEST_CASE("validation: run ids are 1 to 128 letters or digits or . _ : -",
          "[server][validation][run_id]") {
  CHECK(CheckRunId("run-a_1.2:3").ok());
  CHECK(CheckRunId(std::string(128, 'r')).ok());
  CHECK(std::string(CheckRunId(std::string(129, 'r')).message()) ==
        "run_id is 129 bytes long: a run id is 1 to 128 characters of [A-Za-z0-9._:-]");
  CHECK(std::string(CheckRunId("a/b").message()) ==
        "run_id has the byte 0x2f: a run id is 1 to 128 characters of [A-Za-z0-9._:-]");
  for (const std::string& bad : {std::string(""), std::string("a b"), std::string("a\nb"),
                                std::string("run\0x", 5), std::string("\xc3\xa9")}) {
    CHECK(CheckRunId(bad).code() == absl::StatusCode::kInvalidArgument);
  }
}

// Reads the first server message on a fresh stream after `hello`.
bool FirstAnswer(const std::shared_ptr<grpc::Channel>& ch, const v1::AgentMessage& hello,
                 v1::ServerMessage* out) {
  auto stub = v1::AgentService::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto stream = stub->Stream(&ctx);
  stream->Write(hello);
  const bool got = stream->Read(out);
  ctx.TryCancel();
  stream->Finish().IgnoreError();
  return got;
}

TEST_CASE("validation: agent streams are held to agent.proto", "[server][validation][agent]") {
  TempDir dir;
  Running r = StartServer(dir.File("tw.db"));
  auto expect = [&](std::vector<v1::AgentMessage> msgs, grpc::StatusCode want,
                    const std::string& text) {
    TestAgent a(r.channel, "", std::chrono::seconds(10));
    for (const auto& m : msgs) a.Send(m);
    const grpc::Status s = a.Close();
    CHECK(s.error_code() == want);
    CHECK(s.error_message().find(text) != std::string::npos);
  };
  expect({Step("run-early", 0, 1, 0, 2.5, 1.0)}, grpc::FAILED_PRECONDITION,
         "must be a Hello");
  expect({Hello("run-r", -7, 4)}, grpc::INVALID_ARGUMENT, "rank -7 is outside world_size 4");
  expect({Hello("run-r", 4, 4)}, grpc::INVALID_ARGUMENT, "rank 4 is outside world_size 4");
  expect({Hello("run-r", 0, 0)}, grpc::INVALID_ARGUMENT, "world_size 0 is outside");
  expect({Hello("run-r", 0, 70'000)}, grpc::INVALID_ARGUMENT, "--max_world_size");
  expect({Hello("run/../r", 0, 1)}, grpc::INVALID_ARGUMENT, "[A-Za-z0-9._:-]");
  CHECK(r.server->store()->CountSteps("run-early").value() == 0);

  // Bytes that are no AgentMessage end the stream with an error, not OK.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> raw(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            r.channel.get(),
            grpc::internal::RpcMethod("/trainwatch.v1.AgentService/Stream",
                                      grpc::internal::RpcMethod::BIDI_STREAMING),
            &ctx));
    const std::string garbage = "\xff\xff\xff\xff\xff";
    grpc::Slice slice(garbage);
    grpc::ByteBuffer bytes(&slice, 1);
    raw->Write(bytes);
    raw->WritesDone();
    grpc::ByteBuffer ignored;
    while (raw->Read(&ignored)) {
    }
    const grpc::Status s = raw->Finish();
    CHECK(s.error_code() == grpc::INVALID_ARGUMENT);
    CHECK(s.error_message() == "the bytes received are not an AgentMessage");
  }

  // A Hello is answered with a DurabilityAck: empty for a new run, rank 0's
  // durable step once there is one.
  v1::ServerMessage first;
  REQUIRE(FirstAnswer(r.channel, Hello("run-h", 0, 1), &first));
  REQUIRE(first.has_durability_ack());
  CHECK(first.durability_ack().run_id() == "run-h");
  CHECK(first.durability_ack().durable_step().empty());
  {
    TestAgent a(r.channel);
    a.Send(Hello("run-h", 0, 1));
    for (int64_t s = 0; s < 10; ++s) a.Send(Step("run-h", 0, 1, s, 2.5, 1.0));
    REQUIRE(a.WaitDurable(0, 9));
    CHECK(a.Close().ok());
  }
  REQUIRE(FirstAnswer(r.channel, Hello("run-h", 0, 1), &first));
  REQUIRE(first.has_durability_ack());
  CHECK(first.durability_ack().durable_step().at(0) == 9);
}

TEST_CASE("validation: operator RPCs check the run id they take",
          "[server][validation][run_id]") {
  TempDir dir;
  Running r = StartServer(dir.File("tw.db"));
  auto op = v1::OperatorService::NewStub(r.channel);
  auto call = [](auto fn) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return fn(&ctx);
  };
  const std::string rule = "a run id is 1 to 128 characters of [A-Za-z0-9._:-]";
  v1::GetRunStatusRequest status_req;
  status_req.set_run_id("bad id");
  v1::GetRunStatusResponse status_resp;
  grpc::Status s = call([&](auto* c) { return op->GetRunStatus(c, status_req, &status_resp); });
  CHECK(s.error_code() == grpc::INVALID_ARGUMENT);
  CHECK(s.error_message().find(rule) != std::string::npos);
  v1::ListIncidentsRequest list_req;
  list_req.set_run_id(std::string(200, 'x'));
  v1::ListIncidentsResponse list_resp;
  s = call([&](auto* c) { return op->ListIncidents(c, list_req, &list_resp); });
  CHECK(s.error_code() == grpc::INVALID_ARGUMENT);
  list_req.clear_run_id();  // a filter may be empty: every run
  CHECK(call([&](auto* c) { return op->ListIncidents(c, list_req, &list_resp); }).ok());
  v1::ListQuarantinedShardsRequest q_req;
  v1::ListQuarantinedShardsResponse q_resp;
  s = call([&](auto* c) { return op->ListQuarantinedShards(c, q_req, &q_resp); });
  CHECK(s.error_code() == grpc::INVALID_ARGUMENT);
  CHECK(s.error_message().find(rule) != std::string::npos);
  v1::WatchIncidentsRequest w_req;
  w_req.set_run_id("a;b");
  grpc::ClientContext wctx;
  wctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto watch = op->WatchIncidents(&wctx, w_req);
  v1::IncidentEvent ev;
  CHECK_FALSE(watch->Read(&ev));
  CHECK(watch->Finish().error_code() == grpc::INVALID_ARGUMENT);
}

TEST_CASE("validation: decisions are checked where they enter", "[server][validation][rollback]") {
  ApprovalRequest ok;
  ok.comment = "why";
  CHECK(CheckApprovalRequest(ok).ok());
  ApprovalRequest no_comment;
  CHECK(std::string(CheckApprovalRequest(no_comment).message()) ==
        "an approval needs a comment: it goes in the audit log");
  no_comment.dry_run = true;  // records nothing
  CHECK(CheckApprovalRequest(no_comment).ok());
  no_comment.dry_run = false;
  no_comment.approve = false;
  CHECK(std::string(CheckApprovalRequest(no_comment).message()) ==
        "a rejection needs a comment: it goes in the audit log");
  for (double alpha : {std::nan(""), -1.0, HUGE_VAL, std::strtod("1e400", nullptr), 2.0}) {
    INFO(alpha);
    ApprovalRequest d = ok;
    d.z_loss_alpha = alpha;
    CHECK(CheckApprovalRequest(d).code() == absl::StatusCode::kInvalidArgument);
  }
  ApprovalRequest alpha = ok;
  alpha.z_loss_alpha = 1e-4;
  CHECK(CheckApprovalRequest(alpha).ok());
  ApprovalRequest shards = ok;
  shards.quarantine = ShardQuarantine{{{1, 1}, {2, 2}, {9, 3}}, {}};
  CHECK(std::string(CheckApprovalRequest(shards).message()) ==
        "quarantine_shards: the range 9..3 has first > last");
  ApprovalRequest names = ok;
  names.quarantine = ShardQuarantine{{}, {"train-00012-of-01024.parquet", std::string(257, 'n')}};
  CHECK(CheckApprovalRequest(names).code() == absl::StatusCode::kInvalidArgument);
  names.quarantine->names.pop_back();
  CHECK(CheckApprovalRequest(names).ok());

  // Over the API: refused before the incident is looked up.
  TempDir dir;
  Running r = StartServer(dir.File("tw.db"));
  auto op = v1::OperatorService::NewStub(r.channel);
  auto approve = [&](const v1::ApproveRollbackRequest& req) {
    grpc::ClientContext ctx;
    v1::ApproveRollbackResponse resp;
    return op->ApproveRollback(&ctx, req, &resp);
  };
  v1::ApproveRollbackRequest req;
  req.set_incident_id("I-1");
  CHECK(approve(req).error_code() == grpc::INVALID_ARGUMENT);  // no comment
  req.set_comment("roll back");
  req.set_z_loss_alpha(std::nan(""));
  grpc::Status s = approve(req);
  CHECK(s.error_code() == grpc::INVALID_ARGUMENT);
  CHECK(s.error_message().find("z_loss_alpha must be a finite number in [0, 1]") !=
        std::string::npos);
  req.clear_z_loss_alpha();
  req.add_settings()->set_z_loss_alpha(-1);
  CHECK(approve(req).error_code() == grpc::INVALID_ARGUMENT);
  req.clear_settings();
  auto* range = req.mutable_quarantine_shards()->add_ranges();
  range->set_first(5);
  range->set_last(4);
  CHECK(approve(req).error_code() == grpc::INVALID_ARGUMENT);
  range->set_last(5);
  req.mutable_quarantine_shards()->add_names("");
  s = approve(req);
  CHECK(s.error_code() == grpc::INVALID_ARGUMENT);
  CHECK(s.error_message() == "quarantine_shards: a shard name is empty");
  req.mutable_quarantine_shards()->set_names(0, "train-00012-of-01024.parquet");
  CHECK(approve(req).error_code() == grpc::NOT_FOUND);  // valid; no such incident
}

TEST_CASE("validation: token files spell every run as a star and refuse an empty list",
          "[server][validation][auth]") {
  auto load = [](const std::string& runs) {
    return Authenticator::FromJson(
        R"({"tokens": [{"name": "t", "token": "agent-token-0123456789", "role": "agent")" +
            runs + "}]}",
        "t.json");
  };
  auto empty = load(R"(, "runs": [])");
  REQUIRE_FALSE(empty.ok());
  CHECK(std::string(empty.status().message()) ==
        "t.json:1:13: runs is empty: list the runs, or write [\"*\"] for every run");
  CHECK_FALSE(load(R"(, "runs": ["*", "run-a"])").ok());
  auto star = load(R"(, "runs": ["*"])");
  REQUIRE(star.ok());
  CHECK(star->Check("Bearer agent-token-0123456789", Access::kAgentStream)->MayReport("any"));
  auto one = load(R"(, "runs": ["run-a"])");
  REQUIRE(one.ok());
  auto p = one->Check("Bearer agent-token-0123456789", Access::kAgentStream);
  CHECK(p->MayReport("run-a"));
  CHECK_FALSE(p->MayReport("run-b"));
  CHECK_FALSE(p->MayReport("*"));
}

TEST_CASE("validation: one agent token creates at most --max_runs_per_token runs",
          "[server][validation][auth]") {
  RunCreationLimit limit(2);
  Principal p;
  p.name = "ci";
  p.role = Role::kAgent;
  p.token_index = 0;
  auto is_new = [] { return false; };
  CHECK(limit.Admit(p, "a", is_new).ok());
  CHECK(limit.Admit(p, "b", is_new).ok());
  CHECK(limit.Admit(p, "a", is_new).ok());  // one it created
  const absl::Status third = limit.Admit(p, "c", is_new);
  CHECK(third.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(third.message()).find("--max_runs_per_token") != std::string::npos);
  CHECK(limit.Admit(p, "c", [] { return true; }).ok());  // someone else's run
  Principal other = p;
  other.token_index = 1;
  CHECK(limit.Admit(other, "c", is_new).ok());  // per token
  Principal anonymous;  // authentication off: nothing to count for
  for (int i = 0; i < 5; ++i) CHECK(limit.Admit(anonymous, std::to_string(i), is_new).ok());

  TempDir dir;
  const std::string tokens = dir.File("tokens.json");
  std::ofstream(tokens) << R"({"tokens": [
    {"name": "ci", "token": "agent-token-all-runs-01", "role": "agent", "runs": ["*"]}]})";
  ServerOptions o;
  o.tokens_file = tokens;
  o.max_runs_per_token = 1;
  Running r = StartServer(dir.File("tw.db"), core::SystemClock(), o);
  {
    TestAgent a(r.channel, "agent-token-all-runs-01", std::chrono::seconds(10));
    a.Send(Hello("run-1", 0, 1));
    a.Send(Step("run-1", 0, 1, 0, 2.5, 1.0));
    REQUIRE(a.WaitDurable(0, 0));
    CHECK(a.Close().ok());
  }
  TestAgent b(r.channel, "agent-token-all-runs-01", std::chrono::seconds(10));
  b.Send(Hello("run-2", 0, 1));
  const grpc::Status s = b.Close();
  CHECK(s.error_code() == grpc::RESOURCE_EXHAUSTED);
  CHECK(s.error_message().find("run 'run-2'") != std::string::npos);
}

// One ServerReflectionInfo exchange asking to list the services: the status
// and the raw response bytes.
grpc::Status ListServices(const std::shared_ptr<grpc::Channel>& ch, const std::string& token,
                          std::string* response) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> call(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          ch.get(),
          grpc::internal::RpcMethod("/grpc.reflection.v1alpha.ServerReflection/"
                                    "ServerReflectionInfo",
                                    grpc::internal::RpcMethod::BIDI_STREAMING),
          &ctx));
  // ServerReflectionRequest{list_services: "*"}: field 7, length 1.
  grpc::Slice slice(std::string("\x3a\x01*", 3));
  grpc::ByteBuffer request(&slice, 1);
  call->Write(request);
  call->WritesDone();
  grpc::ByteBuffer bytes;
  response->clear();
  while (call->Read(&bytes)) {
    std::vector<grpc::Slice> slices;
    if (bytes.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        response->append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
  }
  return call->Finish();
}

TEST_CASE("validation: server reflection takes a token when authentication is on",
          "[server][validation][auth]") {
  TempDir dir;
  std::string listed;
  SECTION("authentication off: reflection answers anyone") {
    Running r = StartServer(dir.File("tw.db"));
    CHECK(ListServices(r.channel, "", &listed).ok());
    CHECK(listed.find("trainwatch.v1.AgentService") != std::string::npos);
  }
  SECTION("authentication on: any valid token, nothing without one") {
    const std::string tokens = dir.File("tokens.json");
    std::ofstream(tokens) << R"({"tokens": [
      {"name": "grafana", "token": "reader-token-012345678", "role": "reader"}]})";
    ServerOptions o;
    o.tokens_file = tokens;
    Running r = StartServer(dir.File("tw.db"), core::SystemClock(), o);
    grpc::Status s = ListServices(r.channel, "", &listed);
    CHECK(s.error_code() == grpc::UNAUTHENTICATED);
    CHECK(listed.find("trainwatch") == std::string::npos);
    s = ListServices(r.channel, "not-a-token-0123456789", &listed);
    CHECK(s.error_code() == grpc::UNAUTHENTICATED);
    CHECK(listed.find("trainwatch") == std::string::npos);
    CHECK(ListServices(r.channel, "reader-token-012345678", &listed).ok());
    CHECK(listed.find("trainwatch.v1.OperatorService") != std::string::npos);
  }
  SECTION("--reflection=false: not served") {
    ServerOptions o;
    o.reflection = false;
    Running r = StartServer(dir.File("tw.db"), core::SystemClock(), o);
    CHECK(ListServices(r.channel, "", &listed).error_code() == grpc::UNIMPLEMENTED);
    // The other services are still there.
    grpc::ClientContext ctx;
    v1::ListRunsResponse runs;
    CHECK(v1::OperatorService::NewStub(r.channel)
              ->ListRuns(&ctx, v1::ListRunsRequest(), &runs)
              .ok());
  }
}

}  // namespace
}  // namespace trainwatch::server
