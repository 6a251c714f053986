#include "operator_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainwatch/agent/server_addresses.h"
#include "trainwatch/core/file_system.h"
#include "trainwatch/core/json.h"
#include "trainwatch/v1/operator.grpc.pb.h"
#include "trainwatch/wire/client_tls.h"
#include "trainwatch/wire/replicas.h"

namespace trainwatch::cli {

namespace {

constexpr const char kConfigKeys[] = "server, token, ca_file, cert_file, key_file";

// One channel per address: the client keepalive (trainwatch/agent/
// server_addresses.h) on each, and nothing dialled before its first call.
std::unique_ptr<v1::OperatorService::Stub> StubFor(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& creds) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, agent::kClientKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, agent::kClientKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  // twctl watch may wait long for an event: keep pinging the quiet call.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return v1::OperatorService::NewStub(grpc::CreateCustomChannel(address, creds, args));
}

// Every call goes to the addresses in their order until one answers: a
// replica that is UNAVAILABLE (not running, not reachable, shutting down,
// taking over) or a standby that refused what only the owner can do (a
// decision, which runs have agents connected: ABORTED marked with
// wire::kStandbyMetadataKey) is skipped, and any other status, OK or a real
// error, is the answer, as with a single server. Every replica serves the
// operator's reads.
class GrpcOperatorClient : public OperatorClient {
 public:
  GrpcOperatorClient(const Connection& c, const std::vector<std::string>& addresses,
                     const std::shared_ptr<grpc::ChannelCredentials>& creds)
      : token_(c.token) {
    for (const std::string& address : addresses) stubs_.push_back(StubFor(address, creds));
  }

  grpc::Status ListRuns(const v1::ListRunsRequest& req, v1::ListRunsResponse* resp) override {
    return Call(&v1::OperatorService::Stub::ListRuns, req, resp);
  }
  grpc::Status GetRunStatus(const v1::GetRunStatusRequest& req,
                            v1::GetRunStatusResponse* resp) override {
    return Call(&v1::OperatorService::Stub::GetRunStatus, req, resp);
  }
  grpc::Status ListIncidents(const v1::ListIncidentsRequest& req,
                             v1::ListIncidentsResponse* resp) override {
    return Call(&v1::OperatorService::Stub::ListIncidents, req, resp);
  }
  grpc::Status GetIncident(const v1::GetIncidentRequest& req,
                           v1::GetIncidentResponse* resp) override {
    return Call(&v1::OperatorService::Stub::GetIncident, req, resp);
  }
  grpc::Status ApproveRollback(const v1::ApproveRollbackRequest& req,
                               v1::ApproveRollbackResponse* resp) override {
    return Call(&v1::OperatorService::Stub::ApproveRollback, req, resp);
  }
  grpc::Status RejectRollback(const v1::RejectRollbackRequest& req,
                              v1::RejectRollbackResponse* resp) override {
    return Call(&v1::OperatorService::Stub::RejectRollback, req, resp);
  }
  grpc::Status ListQuarantinedShards(const v1::ListQuarantinedShardsRequest& req,
                                     v1::ListQuarantinedShardsResponse* resp) override {
    return Call(&v1::OperatorService::Stub::ListQuarantinedShards, req, resp);
  }

  grpc::Status WatchIncidents(
      const v1::WatchIncidentsRequest& req, int64_t timeout_s,
      const std::function<bool(const v1::IncidentEvent&)>& on_event) override {
    grpc::Status status;
    for (const auto& stub : stubs_) {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      ctx.set_deadline(timeout_s > 0
                           ? std::chrono::system_clock::now() + std::chrono::seconds(timeout_s)
                           : std::chrono::system_clock::time_point::max());
      auto reader = stub->WatchIncidents(&ctx, req);
      v1::IncidentEvent ev;
      bool more = true, any = false;
      while (more && reader->Read(&ev)) {
        any = true;
        more = on_event(ev);
      }
      if (!more) ctx.TryCancel();
      status = reader->Finish();
      // Once events were shown, a break is the watch's end, as with one
      // server: starting over elsewhere would show the snapshot again.
      if (any || !TryNext(status, ctx)) break;
    }
    return status;
  }

 private:
  // Whether another address may answer where this one did not.
  static bool TryNext(const grpc::Status& status, const grpc::ClientContext& ctx) {
    return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
           (status.error_code() == grpc::StatusCode::ABORTED &&
            ctx.GetServerTrailingMetadata().count(wire::kStandbyMetadataKey) > 0);
  }

  void Prepare(grpc::ClientContext* c) const {
    if (!token_.empty()) c->AddMetadata("authorization", "Bearer " + token_);
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }

  // Every unary call: the token, the deadline (each address's own), the
  // stub's method, the addresses in order.
  template <typename Req, typename Resp>
  grpc::Status Call(grpc::Status (v1::OperatorService::Stub::*method)(grpc::ClientContext*,
                                                                      const Req&, Resp*),
                    const Req& req, Resp* resp) {
    grpc::Status status;
    for (const auto& stub : stubs_) {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      resp->Clear();
      status = (stub.get()->*method)(&ctx, req, resp);
      if (!TryNext(status, ctx)) break;
    }
    return status;
  }

  std::string token_;
  std::vector<std::unique_ptr<v1::OperatorService::Stub>> stubs_;
};

// Fills the fields still empty from the config file, if there is one. A
// config file that is absent is normal; one that is there but cannot be
// read (a directory, no permission) or is malformed (not JSON, not an
// object, a key twctl does not know, a value not a string) is an error
// naming the file, and the key: a typo must not quietly fall back to the
// defaults, e.g. plaintext to 127.0.0.1:7070.
absl::Status LoadConfigFile(Connection* c) {
  std::string path;
  if (const char* p = std::getenv("TWCTL_CONFIG")) {
    path = p;
  } else if (const char* home = std::getenv("HOME")) {
    path = absl::StrCat(home, "/.config/trainwatch/twctl.json");
  }
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> text = core::LocalFileSystem().ReadFile(path);
  if (absl::IsNotFound(text.status())) return absl::OkStatus();
  if (!text.ok()) return text.status();
  absl::StatusOr<core::JsonValue> doc = core::ParseJson(*text, path);
  if (!doc.ok()) return doc.status();
  if (doc->type != core::JsonValue::Type::kObject) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the config must be a JSON object (", kConfigKeys, ")"));
  }
  const std::pair<const char*, std::string*> fields[] = {{"server", &c->server},
                                                         {"token", &c->token},
                                                         {"ca_file", &c->ca_file},
                                                         {"cert_file", &c->cert_file},
                                                         {"key_file", &c->key_file}};
  for (const auto& [key, v] : doc->object) {
    const auto* field = std::find_if(std::begin(fields), std::end(fields),
                                     [&, &key = key](const auto& f) { return key == f.first; });
    const std::string where = absl::StrFormat("%s:%d:%d: ", path, v.line, v.column);
    if (field == std::end(fields)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "unknown key \"", key, "\" (known: ", kConfigKeys, ")"));
    }
    if (v.type != core::JsonValue::Type::kString) {
      return absl::InvalidArgumentError(absl::StrCat(where, key, " must be a string"));
    }
    if (field->second->empty()) *field->second = v.string;
  }
  return absl::OkStatus();
}

}  // namespace

Connection ResolveConnection(Connection c) {
  auto fill = [](std::string* field, const std::string& value) {
    if (field->empty()) *field = value;
  };
  if (const char* v = std::getenv("TRAINWATCH_SERVER")) fill(&c.server, v);
  if (const char* v = std::getenv("TRAINWATCH_TOKEN")) fill(&c.token, v);
  const wire::ClientTlsFiles env = wire::TlsFilesFromEnvironment();
  fill(&c.ca_file, env.ca_file);
  fill(&c.cert_file, env.cert_file);
  fill(&c.key_file, env.key_file);
  c.error = LoadConfigFile(&c);
  if (c.server.empty()) c.server = "127.0.0.1:7070";
  return c;
}

absl::StatusOr<std::unique_ptr<OperatorClient>> DialOperator(const Connection& c) {
  if (!c.error.ok()) return c.error;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      wire::ClientCredentials({c.ca_file, c.cert_file, c.key_file});
  if (!creds.ok()) return creds.status();
  absl::StatusOr<std::vector<std::string>> addresses = agent::ParseServerAddresses(c.server);
  if (!addresses.ok()) return addresses.status();
  return std::make_unique<GrpcOperatorClient>(c, *addresses, *creds);
}

}  // namespace trainwatch::cli
