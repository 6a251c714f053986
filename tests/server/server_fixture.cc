#include "server_fixture.h"

#include <catch2/catch.hpp>

namespace trainwatch::testing {

Running StartServer(const std::string& db, core::Clock* clock, server::ServerOptions options) {
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:0";
  options.db_path = db;
  auto s = server::Server::Start(options, clock);
  INFO(s.status().message());
  REQUIRE(s.ok());
  Running r;
  r.server = *std::move(s);
  r.channel = grpc::CreateChannel(r.address(), grpc::InsecureChannelCredentials());
  return r;
}

}  // namespace trainwatch::testing
