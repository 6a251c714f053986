// Tests of the trainwatch.v1 wire API: naming rules that keep it evolvable,
// reserved field blocks, round trips of the messages other layers depend on,
// the shape of both services, and an in-process call through the generated
// gRPC code (which proves the gRPC outputs were generated and linked).

#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "trainwatch/v1/agent.grpc.pb.h"
#include "trainwatch/v1/agent.pb.h"
#include "trainwatch/v1/common.pb.h"
#include "trainwatch/v1/operator.grpc.pb.h"
#include "trainwatch/v1/operator.pb.h"

namespace trainwatch {
namespace v1 {
namespace {

namespace pb = ::google::protobuf;

constexpr char kPackage[] = "trainwatch.v1";

// "IncidentEventKind" -> "INCIDENT_EVENT_KIND". An underscore goes before an
// upper-case letter that follows a lower-case letter or a digit.
std::string UpperSnake(const std::string& camel) {
  std::string out;
  for (size_t i = 0; i < camel.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(camel[i]);
    if (i > 0 && std::isupper(c)) {
      const unsigned char prev = static_cast<unsigned char>(camel[i - 1]);
      if (std::islower(prev) || std::isdigit(prev)) out.push_back('_');
    }
    out.push_back(static_cast<char>(std::toupper(c)));
  }
  return out;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every file of the package reachable from the files that define the two
// services, found through the generated descriptor pool.
std::vector<const pb::FileDescriptor*> PackageFiles() {
  std::vector<const pb::FileDescriptor*> pending = {
      AgentMessage::descriptor()->file(),
      GetIncidentRequest::descriptor()->file(),
  };
  std::set<std::string> seen;
  std::vector<const pb::FileDescriptor*> files;
  while (!pending.empty()) {
    const pb::FileDescriptor* file = pending.back();
    pending.pop_back();
    if (file->package() != kPackage || !seen.insert(file->name()).second) {
      continue;
    }
    files.push_back(file);
    for (int i = 0; i < file->dependency_count(); ++i) {
      pending.push_back(file->dependency(i));
    }
  }
  return files;
}

void CollectMessages(const pb::Descriptor* message,
                     std::vector<const pb::Descriptor*>* out) {
  out->push_back(message);
  for (int i = 0; i < message->nested_type_count(); ++i) {
    CollectMessages(message->nested_type(i), out);
  }
}

// All messages of the package, nested ones included, map entries excluded
// (those are synthesized by protoc and cannot carry reservations).
std::vector<const pb::Descriptor*> PackageMessages() {
  std::vector<const pb::Descriptor*> all;
  for (const pb::FileDescriptor* file : PackageFiles()) {
    for (int i = 0; i < file->message_type_count(); ++i) {
      CollectMessages(file->message_type(i), &all);
    }
  }
  std::vector<const pb::Descriptor*> out;
  for (const pb::Descriptor* message : all) {
    if (!message->options().map_entry()) out.push_back(message);
  }
  return out;
}

std::vector<const pb::EnumDescriptor*> PackageEnums() {
  std::vector<const pb::EnumDescriptor*> out;
  for (const pb::FileDescriptor* file : PackageFiles()) {
    for (int i = 0; i < file->enum_type_count(); ++i) {
      out.push_back(file->enum_type(i));
    }
  }
  for (const pb::Descriptor* message : PackageMessages()) {
    for (int i = 0; i < message->enum_type_count(); ++i) {
      out.push_back(message->enum_type(i));
    }
  }
  return out;
}

bool ReservesRange(const pb::Descriptor* message, int first, int last) {
  for (int i = 0; i < message->reserved_range_count(); ++i) {
    const pb::Descriptor::ReservedRange* range = message->reserved_range(i);
    // `end` is exclusive in descriptors.
    if (range->start <= first && range->end > last) return true;
  }
  return false;
}

TEST_CASE("upper-snake conversion matches the style guide's prefixes",
          "[proto]") {
  CHECK(UpperSnake("Tier") == "TIER");
  CHECK(UpperSnake("IncidentEventKind") == "INCIDENT_EVENT_KIND");
  CHECK(UpperSnake("AckStatus") == "ACK_STATUS");
}

TEST_CASE("the descriptor walk reaches every file of the package", "[proto]") {
  std::set<std::string> names;
  for (const pb::FileDescriptor* file : PackageFiles()) {
    names.insert(file->name());
    CHECK(file->syntax() == pb::FileDescriptor::SYNTAX_PROTO3);
  }
  CHECK(names == std::set<std::string>{"trainwatch/v1/agent.proto",
                                       "trainwatch/v1/common.proto",
                                       "trainwatch/v1/operator.proto"});
}

TEST_CASE("every enum starts at _UNSPECIFIED and prefixes its values",
          "[proto]") {
  const std::vector<const pb::EnumDescriptor*> enums = PackageEnums();
  REQUIRE(enums.size() >= 10);
  for (const pb::EnumDescriptor* e : enums) {
    INFO("enum " << e->full_name());
    const std::string prefix = UpperSnake(e->name()) + "_";
    const pb::EnumValueDescriptor* zero = e->FindValueByNumber(0);
    REQUIRE(zero != nullptr);
    CHECK(zero->name() == prefix + "UNSPECIFIED");
    CHECK(EndsWith(zero->name(), "_UNSPECIFIED"));
    CHECK(e->value(0)->number() == 0);
    for (int i = 0; i < e->value_count(); ++i) {
      INFO("value " << e->value(i)->name());
      CHECK(StartsWith(e->value(i)->name(), prefix));
      CHECK(e->value(i)->name().size() > prefix.size());
    }
  }
}

TEST_CASE("messages that will grow reserve fields 100 to 199", "[proto]") {
  // The messages other layers depend on most; named so that a rename or a
  // lost reservation fails here, not in a peer running an older version.
  const std::vector<std::string> must_evolve = {
      "Metrics",
      "StepMetrics",
      "TensorStats",
      "ShardSet",
      "SettingChange",
      "CheckpointRef",
      "RollbackPlan",
      "RuleFiring",
      "DiagnosticSummary",
      "Decision",
      "Incident",
      "Actor",
      "Hello",
      "StepReport",
      "Heartbeat",
      "CheckpointNotice",
      "CommandAck",
      "AgentMessage",
      "DurabilityAck",
      "Command",
      "QuarantinedShards",
      "ServerMessage",
      "RunInfo",
      "ApproveRollbackRequest",
      "ApproveRollbackResponse",
      "ListIncidentsRequest",
      "IncidentEvent",
  };
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  for (const std::string& name : must_evolve) {
    INFO("message " << name);
    const pb::Descriptor* message =
        pool->FindMessageTypeByName(std::string(kPackage) + "." + name);
    REQUIRE(message != nullptr);
    CHECK(message->reserved_range_count() > 0);
    CHECK(ReservesRange(message, 100, 199));
  }

  // Every other message reserves the block too, except value types whose
  // meaning is fixed. A new message has to opt out here on purpose.
  const std::set<std::string> fixed_value_types = {
      "ShardRange", "StepRange", "SeriesPoint", "StepShards", "LayerPrecision"};
  for (const pb::Descriptor* message : PackageMessages()) {
    INFO("message " << message->full_name());
    if (fixed_value_types.count(message->name()) > 0) continue;
    CHECK(ReservesRange(message, 100, 199));
  }
}

TEST_CASE("stream envelopes use oneofs", "[proto]") {
  const pb::OneofDescriptor* agent_kind =
      AgentMessage::descriptor()->FindOneofByName("kind");
  REQUIRE(agent_kind != nullptr);
  std::set<std::string> agent_fields;
  for (int i = 0; i < agent_kind->field_count(); ++i) {
    agent_fields.insert(agent_kind->field(i)->name());
  }
  CHECK(agent_fields == std::set<std::string>{"hello", "step_report",
                                              "heartbeat", "checkpoint",
                                              "command_ack"});

  const pb::OneofDescriptor* server_kind =
      ServerMessage::descriptor()->FindOneofByName("kind");
  REQUIRE(server_kind != nullptr);
  CHECK(server_kind->field_count() == 3);

  const pb::OneofDescriptor* action =
      Command::descriptor()->FindOneofByName("action");
  REQUIRE(action != nullptr);
  CHECK(action->field_count() == 3);
}

TEST_CASE("metrics have explicit presence", "[proto]") {
  for (const char* name :
       {"loss", "grad_norm", "log_z", "loss_ema_ratio", "nan_frac"}) {
    INFO("field " << name);
    const pb::FieldDescriptor* field =
        Metrics::descriptor()->FindFieldByName(name);
    REQUIRE(field != nullptr);
    CHECK(field->type() == pb::FieldDescriptor::TYPE_DOUBLE);
    CHECK(field->has_presence());
  }
}

StepReport FullStepReport() {
  StepReport report;
  report.set_run_id("run-7");
  report.set_rank(3);
  report.set_world_size(64);
  report.set_step(120345);
  report.set_scope(REPORT_SCOPE_RANK);
  report.mutable_time()->set_seconds(1700000000);
  report.mutable_time()->set_nanos(250);

  Metrics* metrics = report.mutable_metrics();
  metrics->set_loss(0.0);  // zero is a value, not "unknown"
  metrics->set_grad_norm(std::numeric_limits<double>::infinity());
  metrics->set_log_z(std::numeric_limits<double>::quiet_NaN());
  metrics->set_loss_ema_ratio(2.25);
  // nan_frac deliberately left unknown.

  report.set_nonfinite_count(17);
  report.set_element_count(7000000000ULL);
  report.add_shard_ids(40001);
  report.add_shard_ids(18446744073709551615ULL);
  report.set_verdict(VERDICT_SKIP);
  RuleFiring* reason = report.mutable_verdict_reason();
  reason->set_rule(RULE_LOSS_EMA_RATIO_SKIP);
  reason->set_tier(TIER_DATA_ANOMALY);
  reason->set_step(120345);
  reason->set_observed(2.25);
  reason->set_threshold(2.0);
  reason->set_explanation("loss_ema_ratio 2.25 > 2.0");
  report.set_update_skipped(true);
  report.set_skip_rule(RULE_LOSS_EMA_RATIO_SKIP);
  report.set_skip_tier(TIER_DATA_ANOMALY);

  TensorStats* tensor = report.add_tensors();
  tensor->set_name("layers.3.attn.q_proj.weight");
  tensor->set_sum_squares(12.5);
  tensor->set_nonfinite_count(17);
  tensor->set_element_count(16777216);
  report.add_attention_logit_p99(31.0);
  report.add_attention_logit_p99(47.5);
  report.set_activation_max(9000.0);
  report.set_learning_rate(3e-4);
  report.set_z_loss_alpha(1e-4);
  return report;
}

TEST_CASE("a fully populated step report survives the wire", "[proto]") {
  AgentMessage sent;
  *sent.mutable_step_report() = FullStepReport();
  std::string bytes;
  REQUIRE(sent.SerializeToString(&bytes));

  AgentMessage got;
  REQUIRE(got.ParseFromString(bytes));
  REQUIRE(got.kind_case() == AgentMessage::kStepReport);
  const StepReport& r = got.step_report();
  CHECK(r.run_id() == "run-7");
  CHECK(r.rank() == 3);
  CHECK(r.world_size() == 64);
  CHECK(r.step() == 120345);
  CHECK(r.scope() == REPORT_SCOPE_RANK);
  CHECK(r.time().seconds() == 1700000000);
  CHECK(r.time().nanos() == 250);

  const Metrics& m = r.metrics();
  REQUIRE(m.has_loss());
  CHECK(m.loss() == 0.0);
  REQUIRE(m.has_grad_norm());
  CHECK(std::isinf(m.grad_norm()));
  REQUIRE(m.has_log_z());
  CHECK(std::isnan(m.log_z()));
  REQUIRE(m.has_loss_ema_ratio());
  CHECK(m.loss_ema_ratio() == 2.25);
  CHECK_FALSE(m.has_nan_frac());

  CHECK(r.nonfinite_count() == 17);
  CHECK(r.element_count() == 7000000000ULL);
  REQUIRE(r.shard_ids_size() == 2);
  CHECK(r.shard_ids(0) == 40001);
  CHECK(r.shard_ids(1) == 18446744073709551615ULL);
  CHECK(r.verdict() == VERDICT_SKIP);
  CHECK(r.verdict_reason().rule() == RULE_LOSS_EMA_RATIO_SKIP);
  CHECK(r.verdict_reason().tier() == TIER_DATA_ANOMALY);
  CHECK(r.verdict_reason().observed() == 2.25);
  CHECK(r.verdict_reason().threshold() == 2.0);
  CHECK(r.verdict_reason().explanation() == "loss_ema_ratio 2.25 > 2.0");
  CHECK(r.update_skipped());
  CHECK(r.skip_rule() == RULE_LOSS_EMA_RATIO_SKIP);
  CHECK(r.skip_tier() == TIER_DATA_ANOMALY);

  REQUIRE(r.tensors_size() == 1);
  CHECK(r.tensors(0).name() == "layers.3.attn.q_proj.weight");
  CHECK(r.tensors(0).sum_squares() == 12.5);
  CHECK(r.tensors(0).nonfinite_count() == 17);
  CHECK(r.tensors(0).element_count() == 16777216);
  REQUIRE(r.attention_logit_p99_size() == 2);
  CHECK(r.attention_logit_p99(1) == 47.5);
  REQUIRE(r.has_activation_max());
  CHECK(r.activation_max() == 9000.0);
  REQUIRE(r.has_learning_rate());
  CHECK(r.learning_rate() == 3e-4);
  REQUIRE(r.has_z_loss_alpha());
  CHECK(r.z_loss_alpha() == 1e-4);
}

TEST_CASE("an empty step report reads every optional as unknown", "[proto]") {
  StepReport sent;
  sent.set_step(5);
  sent.mutable_metrics();  // present but empty
  std::string bytes;
  REQUIRE(sent.SerializeToString(&bytes));
  StepReport got;
  REQUIRE(got.ParseFromString(bytes));
  REQUIRE(got.has_metrics());
  CHECK_FALSE(got.metrics().has_loss());
  CHECK_FALSE(got.metrics().has_grad_norm());
  CHECK_FALSE(got.metrics().has_log_z());
  CHECK_FALSE(got.metrics().has_loss_ema_ratio());
  CHECK_FALSE(got.metrics().has_nan_frac());
  CHECK_FALSE(got.has_activation_max());
  CHECK_FALSE(got.has_learning_rate());
  CHECK_FALSE(got.has_z_loss_alpha());
  CHECK(got.verdict() == VERDICT_UNSPECIFIED);
}

TEST_CASE("a rollback command survives the wire", "[proto]") {
  ServerMessage sent;
  Command* command = sent.mutable_command();
  command->set_command_id("cmd-42");
  command->set_run_id("run-7");
  command->mutable_issued_at()->set_seconds(1700000100);
  RollbackPlan* plan = command->mutable_rollback();
  plan->set_incident_id("inc-9");
  plan->set_target_step(119000);
  plan->set_checkpoint_uri("s3://bucket/run-7/step-119000");
  plan->mutable_quarantine()->add_shard_ids(40001);
  ShardRange* range = plan->mutable_quarantine()->add_ranges();
  range->set_first(39990);
  range->set_last(40010);
  plan->add_settings()->set_z_loss_alpha(2e-4);
  LayerPrecision* precision = plan->add_settings()->mutable_layer_precision();
  precision->set_layer("layers.3.attn");
  precision->set_precision(PRECISION_BF16);

  std::string bytes;
  REQUIRE(sent.SerializeToString(&bytes));
  ServerMessage got;
  REQUIRE(got.ParseFromString(bytes));
  REQUIRE(got.kind_case() == ServerMessage::kCommand);
  const Command& c = got.command();
  CHECK(c.command_id() == "cmd-42");
  CHECK(c.run_id() == "run-7");
  CHECK(c.issued_at().seconds() == 1700000100);
  REQUIRE(c.action_case() == Command::kRollback);
  const RollbackPlan& p = c.rollback();
  CHECK(p.incident_id() == "inc-9");
  CHECK(p.target_step() == 119000);
  CHECK(p.checkpoint_uri() == "s3://bucket/run-7/step-119000");
  REQUIRE(p.quarantine().shard_ids_size() == 1);
  CHECK(p.quarantine().shard_ids(0) == 40001);
  REQUIRE(p.quarantine().ranges_size() == 1);
  CHECK(p.quarantine().ranges(0).first() == 39990);
  CHECK(p.quarantine().ranges(0).last() == 40010);
  REQUIRE(p.settings_size() == 2);
  REQUIRE(p.settings(0).setting_case() == SettingChange::kZLossAlpha);
  CHECK(p.settings(0).z_loss_alpha() == 2e-4);
  REQUIRE(p.settings(1).setting_case() == SettingChange::kLayerPrecision);
  CHECK(p.settings(1).layer_precision().layer() == "layers.3.attn");
  CHECK(p.settings(1).layer_precision().precision() == PRECISION_BF16);
}

TEST_CASE("an approval leaves unset overrides distinguishable", "[proto]") {
  ApproveRollbackRequest sent;
  sent.set_incident_id("inc-9");
  sent.set_comment("log_z led; quarantining the onset shards");
  sent.set_idempotency_key("k-1");
  sent.set_dry_run(true);
  sent.mutable_quarantine_shards();  // set and empty: quarantine nothing
  std::string bytes;
  REQUIRE(sent.SerializeToString(&bytes));
  ApproveRollbackRequest got;
  REQUIRE(got.ParseFromString(bytes));
  CHECK_FALSE(got.has_to_step());
  CHECK_FALSE(got.has_z_loss_alpha());
  CHECK(got.has_quarantine_shards());
  CHECK(got.dry_run());
  CHECK(got.idempotency_key() == "k-1");
}

struct ExpectedMethod {
  const char* name;
  const char* input;
  const char* output;
  bool client_streaming;
  bool server_streaming;
};

void CheckService(const std::string& service_name,
                  const std::vector<ExpectedMethod>& expected) {
  const pb::ServiceDescriptor* service =
      pb::DescriptorPool::generated_pool()->FindServiceByName(service_name);
  REQUIRE(service != nullptr);
  CHECK(service->method_count() == static_cast<int>(expected.size()));
  for (const ExpectedMethod& want : expected) {
    INFO("method " << service_name << "." << want.name);
    const pb::MethodDescriptor* method = service->FindMethodByName(want.name);
    REQUIRE(method != nullptr);
    CHECK(method->input_type()->full_name() ==
          std::string(kPackage) + "." + want.input);
    CHECK(method->output_type()->full_name() ==
          std::string(kPackage) + "." + want.output);
    CHECK(method->client_streaming() == want.client_streaming);
    CHECK(method->server_streaming() == want.server_streaming);
  }
}

TEST_CASE("the services have the expected methods", "[proto]") {
  CheckService("trainwatch.v1.AgentService",
               {{"Stream", "AgentMessage", "ServerMessage", true, true}});
  CheckService(
      "trainwatch.v1.OperatorService",
      {
          {"ListRuns", "ListRunsRequest", "ListRunsResponse", false, false},
          {"GetRunStatus", "GetRunStatusRequest", "GetRunStatusResponse", false,
           false},
          {"ListIncidents", "ListIncidentsRequest", "ListIncidentsResponse",
           false, false},
          {"GetIncident", "GetIncidentRequest", "GetIncidentResponse", false,
           false},
          {"ApproveRollback", "ApproveRollbackRequest",
           "ApproveRollbackResponse", false, false},
          {"RejectRollback", "RejectRollbackRequest", "RejectRollbackResponse",
           false, false},
          {"ListQuarantinedShards", "ListQuarantinedShardsRequest",
           "ListQuarantinedShardsResponse", false, false},
          {"WatchIncidents", "WatchIncidentsRequest", "IncidentEvent", false,
           true},
      });
}

// Minimal services for the in-process call below.
class FakeOperator final : public OperatorService::Service {
 public:
  grpc::Status GetIncident(grpc::ServerContext* context,
                           const GetIncidentRequest* request,
                           GetIncidentResponse* response) override {
    Incident* incident = response->mutable_incident();
    incident->set_incident_id(request->incident_id());
    incident->set_state(INCIDENT_STATE_AWAITING_DECISION);
    DiagnosticSummary* summary = incident->mutable_summary();
    summary->mutable_recommended_checkpoint()->set_step(119000);
    summary->set_approve_command("twctl rollback approve " +
                                 request->incident_id() + " --comment ...");
    return grpc::Status::OK;
  }
};

class EchoAgentService final : public AgentService::Service {
 public:
  // Answers each Hello with a durability ack for that rank.
  grpc::Status Stream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<ServerMessage, AgentMessage>* stream) override {
    AgentMessage in;
    while (stream->Read(&in)) {
      if (in.kind_case() != AgentMessage::kHello) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "hello expected");
      }
      ServerMessage out;
      DurabilityAck* ack = out.mutable_durability_ack();
      ack->set_run_id(in.hello().run_id());
      (*ack->mutable_durable_step())[in.hello().rank()] =
          in.hello().next_step() - 1;
      if (!stream->Write(out)) break;
    }
    return grpc::Status::OK;
  }
};

TEST_CASE("generated gRPC stubs and services talk in process", "[proto]") {
  FakeOperator operator_service;
  EchoAgentService agent_service;
  grpc::ServerBuilder builder;
  builder.RegisterService(&operator_service);
  builder.RegisterService(&agent_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  std::shared_ptr<grpc::Channel> channel =
      server->InProcessChannel(grpc::ChannelArguments());

  {
    std::unique_ptr<OperatorService::Stub> stub =
        OperatorService::NewStub(channel);
    grpc::ClientContext context;
    GetIncidentRequest request;
    request.set_incident_id("inc-9");
    GetIncidentResponse response;
    const grpc::Status status = stub->GetIncident(&context, request, &response);
    REQUIRE(status.ok());
    CHECK(response.incident().incident_id() == "inc-9");
    CHECK(response.incident().state() == INCIDENT_STATE_AWAITING_DECISION);
    CHECK(response.incident().summary().recommended_checkpoint().step() ==
          119000);
  }

  {
    std::unique_ptr<AgentService::Stub> stub = AgentService::NewStub(channel);
    grpc::ClientContext context;
    auto stream = stub->Stream(&context);
    AgentMessage hello;
    hello.mutable_hello()->set_run_id("run-7");
    hello.mutable_hello()->set_rank(5);
    hello.mutable_hello()->set_next_step(101);
    REQUIRE(stream->Write(hello));
    ServerMessage reply;
    REQUIRE(stream->Read(&reply));
    REQUIRE(reply.kind_case() == ServerMessage::kDurabilityAck);
    CHECK(reply.durability_ack().run_id() == "run-7");
    CHECK(reply.durability_ack().durable_step().at(5) == 100);

    AgentMessage heartbeat;
    heartbeat.mutable_heartbeat()->set_rank(5);
    REQUIRE(stream->Write(heartbeat));
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    CHECK(status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  }

  server->Shutdown();
}

}  // namespace
}  // namespace v1
}  // namespace trainwatch
