#include "test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include <catch2/catch.hpp>

#include "testing/wait.h"

namespace trainwatch::testing {

TempDir::TempDir() : dir_("trainwatch_test_") { REQUIRE(!dir_.path().empty()); }

v1::AgentMessage Hello(const std::string& run, int32_t rank, int32_t world) {
  v1::AgentMessage m;
  auto* h = m.mutable_hello();
  h->set_run_id(run);
  h->set_rank(rank);
  h->set_world_size(world);
  h->set_agent_version("test");
  h->set_host_name("localhost");
  return m;
}

v1::AgentMessage Step(const std::string& run, int32_t rank, int32_t world, int64_t step,
                      double loss, double grad_norm, double log_z, v1::ReportScope scope) {
  v1::AgentMessage m;
  auto* r = m.mutable_step_report();
  r->set_run_id(run);
  r->set_rank(rank);
  r->set_world_size(world);
  r->set_step(step);
  r->set_scope(scope);
  r->mutable_metrics()->set_loss(loss);
  r->mutable_metrics()->set_grad_norm(grad_norm);
  r->mutable_metrics()->set_log_z(log_z);
  r->mutable_metrics()->set_nan_frac(0.0);
  r->add_shard_ids(1000000 + static_cast<uint64_t>(step));
  return m;
}

v1::AgentMessage Checkpoint(const std::string& run, int64_t step) {
  v1::AgentMessage m;
  m.mutable_checkpoint()->set_run_id(run);
  m.mutable_checkpoint()->set_step(step);
  m.mutable_checkpoint()->set_uri("ckpt://" + run + "/" + std::to_string(step));
  return m;
}

v1::DurabilityAck HelloAnswer(const std::shared_ptr<grpc::Channel>& ch, const std::string& run,
                              const std::string& incarnation) {
  auto stub = v1::AgentService::NewStub(ch);
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub->Stream(&c);
  v1::AgentMessage hello = Hello(run, 0, 1);
  hello.mutable_hello()->set_incarnation_id(incarnation);
  REQUIRE(stream->Write(hello));
  v1::ServerMessage m;
  REQUIRE(stream->Read(&m));
  REQUIRE(m.has_durability_ack());
  const v1::DurabilityAck answer = m.durability_ack();
  stream->WritesDone();
  while (stream->Read(&m)) {  // the command, if one follows
  }
  CHECK(stream->Finish().ok());
  return answer;
}

TestAgent::TestAgent(const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
                     std::chrono::seconds deadline)
    : stub_(v1::AgentService::NewStub(channel)) {
  if (!token.empty()) ctx_.AddMetadata("authorization", "Bearer " + token);
  ctx_.set_deadline(std::chrono::system_clock::now() + deadline);
  stream_ = stub_->Stream(&ctx_);
}

int64_t TestAgent::durable(int32_t rank) const {
  return rank < static_cast<int32_t>(durable_.size()) ? durable_[rank] : -1;
}

void TestAgent::Absorb(const v1::ServerMessage& m) {
  if (m.has_command()) commands_.push_back(m.command());
  if (m.has_quarantined_shards()) quarantine_ = m.quarantined_shards();
  if (!m.has_durability_ack()) return;
  for (const auto& [r, s] : m.durability_ack().durable_step()) {
    if (r >= static_cast<int32_t>(durable_.size())) durable_.resize(r + 1, -1);
    durable_[r] = std::max(durable_[r], s);
  }
}

bool TestAgent::WaitDurable(int32_t rank, int64_t step) {
  v1::ServerMessage m;
  while (durable(rank) < step) {
    if (!stream_->Read(&m)) return false;
    Absorb(m);
  }
  return true;
}

bool TestAgent::WaitCommand(v1::Command* out) {
  v1::ServerMessage m;
  while (commands_.empty()) {
    if (!stream_->Read(&m)) return false;
    Absorb(m);
  }
  *out = commands_.front();
  commands_.erase(commands_.begin());
  return true;
}

grpc::Status TestAgent::Close() {
  stream_->WritesDone();
  v1::ServerMessage m;
  while (stream_->Read(&m)) {
  }
  return stream_->Finish();
}

HttpReceiver::HttpReceiver() {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  listen(fd_, 64);
  socklen_t len = sizeof addr;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { Loop(); });
}

HttpReceiver::~HttpReceiver() {
  stop_ = true;
  shutdown(fd_, SHUT_RDWR);
  close(fd_);
  thread_.join();
}

void HttpReceiver::FailNext(const std::string& path, int count, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  failures_[path] = {count, status};
}

std::vector<HttpReceiver::Request> HttpReceiver::requests() {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

size_t HttpReceiver::attempts() {
  std::lock_guard<std::mutex> lock(mu_);
  return attempts_;
}

bool HttpReceiver::WaitFor(size_t n, int seconds) {
  return WaitUntil([&] { return requests().size() >= n; }, std::chrono::seconds(seconds));
}

void HttpReceiver::Loop() {
  while (!stop_) {
    const int c = accept(fd_, nullptr, nullptr);
    if (c < 0) continue;
    std::string data;
    char buf[8192];
    size_t need = std::string::npos;
    while (need == std::string::npos || data.size() < need) {
      const ssize_t n = read(c, buf, sizeof buf);
      if (n <= 0) break;
      data.append(buf, static_cast<size_t>(n));
      const size_t head = data.find("\r\n\r\n");
      if (head != std::string::npos && need == std::string::npos) {
        size_t length = 0;
        const size_t cl = data.find("Content-Length: ");
        if (cl != std::string::npos && cl < head) length = std::stoul(data.substr(cl + 16));
        need = head + 4 + length;
      }
    }
    Request r;
    const size_t sp = data.find(' ');
    r.path = data.substr(sp + 1, data.find(' ', sp + 1) - sp - 1);
    const size_t head = data.find("\r\n\r\n");
    r.head = data.substr(0, head);
    r.body = head == std::string::npos ? "" : data.substr(head + 4);
    int status = 200;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++attempts_;
      auto it = failures_.find(r.path);
      if (it != failures_.end() && it->second.first > 0) {
        --it->second.first;
        status = it->second.second;
      } else {
        requests_.push_back(r);
      }
    }
    const std::string resp = "HTTP/1.1 " + std::to_string(status) +
                             " X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    (void)!write(c, resp.data(), resp.size());
    close(c);
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      std::string resp;
      while ((n = read(fd, buf, sizeof buf)) > 0) resp.append(buf, static_cast<size_t>(n));
      const size_t split = resp.find("\r\n\r\n");
      if (split != std::string::npos) body = resp.substr(split + 4);
    }
  }
  close(fd);
  return body;
}

int RunCommand(const std::string& command, const std::string& input, std::string* output) {
  char tmpl[] = "/tmp/trainwatch_cmd_XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return -1;
  close(fd);
  const std::string in_path = std::string(tmpl) + ".in";
  std::ofstream(in_path, std::ios::binary) << input;
  const std::string full = "( " + command + " ) < " + in_path + " > " + tmpl + " 2>&1";
  const int status = std::system(full.c_str());
  std::ifstream out(tmpl, std::ios::binary);
  output->assign(std::istreambuf_iterator<char>(out), std::istreambuf_iterator<char>());
  std::remove(tmpl);
  std::remove(in_path.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool MakeCerts(const TempDir& d, std::string* output) {
  const std::string cmd =
      "cd " + d.path() +
      " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
      "-subj /CN=tw-test-ca"
      " && openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr "
      "-subj /CN=localhost"
      " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext"
      " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
      "-out server.pem -days 2 -extfile san.ext"
      " && openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr "
      "-subj /CN=tw-client"
      " && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
      "-out client.pem -days 2";
  return RunCommand(cmd, "", output) == 0;
}

}  // namespace trainwatch::testing
