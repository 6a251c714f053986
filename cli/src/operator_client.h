// The seam between twctl's commands and trainwatchd: the OperatorService
// calls a command makes, one method each, so that a test runs a command
// against a fake instead of a server.

#ifndef TRAINWATCH_CLI_SRC_OPERATOR_CLIENT_H_
#define TRAINWATCH_CLI_SRC_OPERATOR_CLIENT_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainwatch/v1/operator.pb.h"

namespace trainwatch::cli {

class OperatorClient {
 public:
  virtual ~OperatorClient() = default;

  virtual grpc::Status ListRuns(const v1::ListRunsRequest& req, v1::ListRunsResponse* resp) = 0;
  virtual grpc::Status GetRunStatus(const v1::GetRunStatusRequest& req,
                                    v1::GetRunStatusResponse* resp) = 0;
  virtual grpc::Status ListIncidents(const v1::ListIncidentsRequest& req,
                                     v1::ListIncidentsResponse* resp) = 0;
  virtual grpc::Status GetIncident(const v1::GetIncidentRequest& req,
                                   v1::GetIncidentResponse* resp) = 0;
  virtual grpc::Status ApproveRollback(const v1::ApproveRollbackRequest& req,
                                       v1::ApproveRollbackResponse* resp) = 0;
  virtual grpc::Status RejectRollback(const v1::RejectRollbackRequest& req,
                                      v1::RejectRollbackResponse* resp) = 0;
  virtual grpc::Status ListQuarantinedShards(const v1::ListQuarantinedShardsRequest& req,
                                             v1::ListQuarantinedShardsResponse* resp) = 0;
  // Hands each event to `on_event` until it returns false (the call is then
  // cancelled), the stream ends, or `timeout_s` passes (0: no limit, and the
  // status is then DEADLINE_EXCEEDED). Returns the stream's final status.
  virtual grpc::Status WatchIncidents(
      const v1::WatchIncidentsRequest& req, int64_t timeout_s,
      const std::function<bool(const v1::IncidentEvent&)>& on_event) = 0;
};

// Where and how to reach trainwatchd.
struct Connection {
  std::string server, token;
  // TLS (wire/client_tls.h): the CA to trust the server by; for mutual TLS
  // this client's certificate and key, given together.
  std::string ca_file, cert_file, key_file;
  // Set by ResolveConnection when the config file is there but unreadable
  // or malformed; DialOperator then returns it.
  absl::Status error = absl::OkStatus();
};

// Fills what `c` lacks the way kubectl and amtool users expect: the
// environment (TRAINWATCH_SERVER, TRAINWATCH_TOKEN, TRAINWATCH_CA_FILE,
// TRAINWATCH_CERT_FILE, TRAINWATCH_KEY_FILE), then the config file
// ($TWCTL_CONFIG or ~/.config/trainwatch/twctl.json: an object of the keys
// server, token, ca_file, cert_file, key_file, each a string), then
// 127.0.0.1:7070.
Connection ResolveConnection(Connection c);

// A gRPC client of `c.server` (TLS when a TLS file is named); nothing is
// dialled until the first call, but every TLS file is read first. c.server
// may name several replicas separated by commas (trainwatch/agent/
// server_addresses.h): each call tries them in order, skipping one that is
// UNAVAILABLE or a standby's refusal, and returns the first other answer.
// Each unary call has a 30 s deadline per address tried. c.error, a malformed address list, or a
// TLS file that is missing, unreadable or not PEM, or a cert without its
// key, is returned as the error, naming the file or the list's entry.
absl::StatusOr<std::unique_ptr<OperatorClient>> DialOperator(const Connection& c);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_OPERATOR_CLIENT_H_
