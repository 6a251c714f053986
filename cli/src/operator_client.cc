#include "operator_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainwatch/core/file_system.h"
#include "trainwatch/core/json.h"
#include "trainwatch/v1/operator.grpc.pb.h"

namespace trainwatch::cli {

namespace {

class GrpcOperatorClient : public OperatorClient {
 public:
  // TLS when `ca_pem` is set (the contents of c.ca_file).
  GrpcOperatorClient(const Connection& c, const std::string& ca_pem) : token_(c.token) {
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!c.ca_file.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = ca_pem;
      creds = grpc::SslCredentials(ssl);
    }
    stub_ = v1::OperatorService::NewStub(grpc::CreateChannel(c.server, creds));
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
    grpc::ClientContext ctx;
    Prepare(&ctx);
    ctx.set_deadline(timeout_s > 0
                         ? std::chrono::system_clock::now() + std::chrono::seconds(timeout_s)
                         : std::chrono::system_clock::time_point::max());
    auto reader = stub_->WatchIncidents(&ctx, req);
    v1::IncidentEvent ev;
    bool more = true;
    while (more && reader->Read(&ev)) more = on_event(ev);
    if (!more) ctx.TryCancel();
    return reader->Finish();
  }

 private:
  void Prepare(grpc::ClientContext* c) const {
    if (!token_.empty()) c->AddMetadata("authorization", "Bearer " + token_);
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }

  // Every unary call: the token, the deadline, the stub's method.
  template <typename Req, typename Resp>
  grpc::Status Call(grpc::Status (v1::OperatorService::Stub::*method)(grpc::ClientContext*,
                                                                      const Req&, Resp*),
                    const Req& req, Resp* resp) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    return (stub_.get()->*method)(&ctx, req, resp);
  }

  std::string token_;
  std::unique_ptr<v1::OperatorService::Stub> stub_;
};

// What twctl could not set up before dialling (an unreadable config or CA
// file): every call fails with it as UNAVAILABLE, the code a channel whose
// TLS cannot be set up gives, so the command reports it (exit 1) the way it
// reports a server that cannot be reached; the file's own code (a directory
// is FAILED_PRECONDITION) would read as the server refusing (exit 3).
class FailingOperatorClient : public OperatorClient {
 public:
  explicit FailingOperatorClient(const absl::Status& s)
      : status_(grpc::StatusCode::UNAVAILABLE, std::string(s.message())) {}

  grpc::Status ListRuns(const v1::ListRunsRequest&, v1::ListRunsResponse*) override {
    return status_;
  }
  grpc::Status GetRunStatus(const v1::GetRunStatusRequest&, v1::GetRunStatusResponse*) override {
    return status_;
  }
  grpc::Status ListIncidents(const v1::ListIncidentsRequest&,
                             v1::ListIncidentsResponse*) override {
    return status_;
  }
  grpc::Status GetIncident(const v1::GetIncidentRequest&, v1::GetIncidentResponse*) override {
    return status_;
  }
  grpc::Status ApproveRollback(const v1::ApproveRollbackRequest&,
                               v1::ApproveRollbackResponse*) override {
    return status_;
  }
  grpc::Status RejectRollback(const v1::RejectRollbackRequest&,
                              v1::RejectRollbackResponse*) override {
    return status_;
  }
  grpc::Status ListQuarantinedShards(const v1::ListQuarantinedShardsRequest&,
                                     v1::ListQuarantinedShardsResponse*) override {
    return status_;
  }
  grpc::Status WatchIncidents(const v1::WatchIncidentsRequest&, int64_t,
                              const std::function<bool(const v1::IncidentEvent&)>&) override {
    return status_;
  }

 private:
  grpc::Status status_;
};

// Fills the fields still empty from the config file, if there is one. A
// config file that is absent is normal; one that is there but cannot be
// read (a directory, no permission) is an error, not a silent default.
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
  if (!doc.ok()) return absl::OkStatus();
  auto take = [&](const char* key, std::string* dst) {
    const core::JsonValue* v = doc->Find(key);
    if (dst->empty() && v != nullptr && v->type == core::JsonValue::Type::kString) *dst = v->string;
  };
  take("server", &c->server);
  take("token", &c->token);
  take("ca_file", &c->ca_file);
  return absl::OkStatus();
}

}  // namespace

Connection ResolveConnection(Connection c) {
  if (c.server.empty()) {
    if (const char* v = std::getenv("TRAINWATCH_SERVER")) c.server = v;
  }
  if (c.token.empty()) {
    if (const char* v = std::getenv("TRAINWATCH_TOKEN")) c.token = v;
  }
  c.error = LoadConfigFile(&c);
  if (c.server.empty()) c.server = "127.0.0.1:7070";
  return c;
}

std::unique_ptr<OperatorClient> DialOperator(const Connection& c) {
  if (!c.error.ok()) return std::make_unique<FailingOperatorClient>(c.error);
  std::string ca_pem;
  if (!c.ca_file.empty()) {
    absl::StatusOr<std::string> pem = core::LocalFileSystem().ReadFile(c.ca_file);
    if (!pem.ok()) return std::make_unique<FailingOperatorClient>(pem.status());
    ca_pem = *std::move(pem);
  }
  return std::make_unique<GrpcOperatorClient>(c, ca_pem);
}

}  // namespace trainwatch::cli
