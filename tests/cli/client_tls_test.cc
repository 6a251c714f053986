// The clients' side of mutual TLS against a live trainwatchd started with
// --tls_client_ca (in process, on a free port): twctl and the agent get in
// with their client certificate, and are refused without it; the files come
// from flags, config or TRAINWATCH_CERT_FILE / TRAINWATCH_KEY_FILE.

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "daemon/server.h"
#include "server_fixture.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/agent/agent.h"
#include "trainwatch/cli/operator_commands.h"

namespace trainwatch::server {
namespace {

using testing::Running;
using testing::StartServer;
using testing::TempDir;

struct Out {
  int code;
  std::string out, err;
};

Out Twctl(const std::vector<std::string>& args) {
  Out o;
  o.code = cli::OperatorCommand("runs", args, nullptr, &o.out, &o.err);
  return o;
}

// An agent of `run` streaming a few steps to `address`.
std::unique_ptr<agent::Agent> StreamingAgent(agent::AgentConfig cfg, const std::string& run,
                                             const std::string& address) {
  cfg.server_address = address;
  cfg.run_id = run;
  cfg.reconnect_initial_ms = 20;
  cfg.reconnect_max_ms = 200;
  auto a = agent::Agent::Create(cfg, std::make_unique<agent::SingleProcessReducer>());
  INFO(a.status());
  REQUIRE(a.ok());
  for (int64_t s = 1; s <= 5; ++s) {
    agent::StepInput in;
    in.step = s;
    in.loss = 2.5;
    REQUIRE((*a)->Step(in).ok());
  }
  return *std::move(a);
}

// testing::MakeCerts, openssl's output shown when it fails.
void RequireCerts(const TempDir& dir) {
  std::string log;
  const bool made = testing::MakeCerts(dir, &log);
  INFO(log);
  REQUIRE(made);
}

TEST_CASE("mTLS clients: twctl and the agent get in with a client cert - refused without",
          "[server][tls][mtls]") {
  TempDir dir;
  RequireCerts(dir);
  ServerOptions o;
  o.tls_cert_file = dir.File("server.pem");
  o.tls_key_file = dir.File("server.key");
  o.tls_client_ca_file = dir.File("ca.pem");
  Running r = StartServer(dir.File("tw.db"), core::SystemClock(), o);
  const std::string addr = r.address();
  const std::vector<std::string> ca = {"--server", addr, "--ca-file", dir.File("ca.pem")};
  std::vector<std::string> mutual = ca;
  mutual.insert(mutual.end(), {"--cert", dir.File("client.pem"), "--key", dir.File("client.key")});

  // twctl: with its certificate it is served; with only the CA the server
  // refuses the handshake (UNAVAILABLE, exit 1).
  const Out served = Twctl(mutual);
  INFO(served.err);
  CHECK(served.code == 0);
  CHECK(served.out.rfind("RUN ", 0) == 0);
  const Out refused = Twctl(ca);
  CHECK(refused.code == 1);
  CHECK(refused.err.find("(server unavailable)") != std::string::npos);

  // The agent: with the certificate its steps are acknowledged and the run
  // is there; without, it never connects and the server never hears of it.
  agent::AgentConfig with_cert;
  with_cert.ca_file = dir.File("ca.pem");
  with_cert.cert_file = dir.File("client.pem");
  with_cert.key_file = dir.File("client.key");
  auto in = StreamingAgent(with_cert, "mtls-run", addr);
  CHECK(testing::WaitUntil([&] { return in->Stats().records_acked == 5; },
                           std::chrono::seconds(10)));
  agent::AgentConfig ca_only;
  ca_only.ca_file = dir.File("ca.pem");
  auto out = StreamingAgent(ca_only, "anon-run", addr);
  CHECK(testing::HoldsFor(
      [&] { return !out->Stats().connected && out->Stats().records_acked == 0; },
      std::chrono::milliseconds(800)));
  const Out runs = Twctl(mutual);
  CHECK(runs.out.find("mtls-run") != std::string::npos);
  CHECK(runs.out.find("anon-run") == std::string::npos);
  out->Close(0);
  in->Close(1000);

  // The same files from the environment, for the agent and for twctl.
  setenv("TRAINWATCH_CA_FILE", dir.File("ca.pem").c_str(), 1);
  setenv("TRAINWATCH_CERT_FILE", dir.File("client.pem").c_str(), 1);
  setenv("TRAINWATCH_KEY_FILE", dir.File("client.key").c_str(), 1);
  absl::StatusOr<agent::AgentConfig> env = agent::AgentConfig::FromEnvironment();
  REQUIRE(env.ok());
  CHECK(env->cert_file == dir.File("client.pem"));
  CHECK(env->key_file == dir.File("client.key"));
  auto from_env = StreamingAgent(*env, "env-run", addr);
  CHECK(testing::WaitUntil([&] { return from_env->Stats().records_acked == 5; },
                           std::chrono::seconds(10)));
  from_env->Close(1000);
  CHECK(Twctl({"--server", addr}).out.find("env-run") != std::string::npos);
  unsetenv("TRAINWATCH_CA_FILE");
  unsetenv("TRAINWATCH_CERT_FILE");
  unsetenv("TRAINWATCH_KEY_FILE");
}

TEST_CASE("mTLS clients: the agent refuses a cert without its key and a missing CA at Create",
          "[server][tls][mtls]") {
  TempDir dir;
  RequireCerts(dir);
  auto create = [](agent::AgentConfig cfg) {
    cfg.server_address = "127.0.0.1:1";
    return agent::Agent::Create(cfg, std::make_unique<agent::SingleProcessReducer>()).status();
  };
  agent::AgentConfig cfg;
  cfg.ca_file = dir.File("ca.pem");
  cfg.cert_file = dir.File("client.pem");
  absl::Status s = create(cfg);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "a client certificate (" + dir.File("client.pem") + ") needs its key too");
  cfg.cert_file.clear();
  cfg.key_file = dir.File("client.key");
  CHECK(create(cfg).message() ==
        "a client key (" + dir.File("client.key") + ") needs its certificate too");
  cfg.key_file.clear();
  cfg.ca_file = dir.File("missing.pem");
  s = create(cfg);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(s.message() ==
        "CA file: cannot read " + dir.File("missing.pem") + ": No such file or directory");
  // A key file that is not PEM (here the directory's CSR text is; the
  // serial file is not).
  cfg.ca_file = dir.File("ca.pem");
  cfg.cert_file = dir.File("client.pem");
  cfg.key_file = dir.File("ca.srl");
  CHECK(create(cfg).message() ==
        "client key: " + dir.File("ca.srl") + " holds no PEM block (-----BEGIN ...)");
}

}  // namespace
}  // namespace trainwatch::server
