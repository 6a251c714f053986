// Helpers for server tests: temporary folders, a synchronous test agent,
// message builders, an HTTP GET for /metrics, and running a command.

#ifndef TRAINWATCH_TESTS_SERVER_TEST_UTIL_H_
#define TRAINWATCH_TESTS_SERVER_TEST_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "testing/temp_dir.h"
#include "trainwatch/v1/agent.grpc.pb.h"
#include "trainwatch/v1/operator.grpc.pb.h"

namespace trainwatch::testing {

// A fresh folder under $TMPDIR, removed with everything in it on
// destruction; a test fails when it cannot be made.
class TempDir {
 public:
  TempDir();
  const std::string& path() const { return dir_.path(); }
  std::string File(const std::string& name) const { return path() + "/" + name; }

 private:
  ScopedTempDir dir_;
};

v1::AgentMessage Hello(const std::string& run, int32_t rank, int32_t world);
v1::AgentMessage Step(const std::string& run, int32_t rank, int32_t world, int64_t step,
                      double loss, double grad_norm, double log_z = 8.0,
                      v1::ReportScope scope = v1::REPORT_SCOPE_GLOBAL);
// A checkpoint at `step` with uri "ckpt://<run>/<step>".
v1::AgentMessage Checkpoint(const std::string& run, int64_t step);

// The server's first answer to a hello of rank 0 on a fresh stream.
// `incarnation` empty: an agent from before incarnation ids.
v1::DurabilityAck HelloAnswer(const std::shared_ptr<grpc::Channel>& ch, const std::string& run,
                              const std::string& incarnation = "");

// One agent stream, driven synchronously.
class TestAgent {
 public:
  explicit TestAgent(const std::shared_ptr<grpc::Channel>& channel,
                     const std::string& token = "",
                     std::chrono::seconds deadline = std::chrono::seconds(60));
  bool Send(const v1::AgentMessage& m) { return stream_->Write(m); }
  // Reads server messages until `rank`'s durable step reaches `step`;
  // false if the stream ended first.
  bool WaitDurable(int32_t rank, int64_t step);
  int64_t durable(int32_t rank) const;
  // Reads until a command arrives; false if the stream ended first.
  bool WaitCommand(v1::Command* out);
  // The last quarantine list received (while waiting for anything).
  const v1::QuarantinedShards& quarantine() const { return quarantine_; }
  // Half-closes, drains and returns the final status.
  grpc::Status Close();

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>> stream_;
  void Absorb(const v1::ServerMessage& m);
  std::vector<int64_t> durable_;
  std::vector<v1::Command> commands_;
  v1::QuarantinedShards quarantine_;
};

// A minimal HTTP receiver on 127.0.0.1 for pages: records every POST and
// answers 200, or the status set for a path.
class HttpReceiver {
 public:
  struct Request {
    std::string path;
    std::string head;  // the request line and headers
    std::string body;
  };
  HttpReceiver();
  ~HttpReceiver();
  int port() const { return port_; }
  // The next `count` requests to `path` get `status`.
  void FailNext(const std::string& path, int count, int status = 500);
  std::vector<Request> requests();
  // Every request answered, the failed ones included: how a test sees a
  // retry that left no request behind.
  size_t attempts();
  // Waits until at least `n` requests arrived (or `seconds` passed).
  bool WaitFor(size_t n, int seconds = 20);

 private:
  void Loop();
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<Request> requests_;
  size_t attempts_ = 0;
  std::map<std::string, std::pair<int, int>> failures_;  // path -> (count, status)
};

// The whole file; empty when it cannot be read.
std::string ReadFile(const std::string& path);

// A port on 127.0.0.1 that was free a moment ago.
int FreePort();

// GET http://127.0.0.1:port/path; the body, or empty on failure.
std::string HttpGet(int port, const std::string& path);

// Runs a shell command, feeding `input` to its stdin; returns the exit
// code, with everything it printed in *output.
int RunCommand(const std::string& command, const std::string& input, std::string* output);

// In `d`, with the openssl command line: a CA (ca.pem, ca.key), a server
// certificate for 127.0.0.1 and localhost (server.pem, server.key) and a
// client certificate (client.pem, client.key), all signed by the CA. False
// on failure, openssl's output in *output.
bool MakeCerts(const TempDir& d, std::string* output);

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_SERVER_TEST_UTIL_H_
