// An in-process trainwatchd on loopback ports for tests, with a channel to
// it; stopped when the Running goes out of scope.

#ifndef TRAINWATCH_TESTS_SERVER_SERVER_FIXTURE_H_
#define TRAINWATCH_TESTS_SERVER_SERVER_FIXTURE_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "daemon/server.h"

namespace trainwatch::testing {

struct Running {
  std::unique_ptr<server::Server> server;
  std::shared_ptr<grpc::Channel> channel;
  std::string address() const { return "127.0.0.1:" + std::to_string(server->port()); }
};

// Starts a server on `db` with `options` (listen and metrics on free ports).
Running StartServer(const std::string& db, core::Clock* clock = core::SystemClock(),
                    server::ServerOptions options = server::ServerOptions());

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_SERVER_SERVER_FIXTURE_H_
