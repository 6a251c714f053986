// tw-bounds-attack: the attacks of issue 13 on a spawned trainwatchd
// (docs/reliability.md lists them), printing what each cost the server.
//
//   tw-bounds-attack --trainwatchd bin/trainwatchd --scenario runs --runs 20000
//   tw-bounds-attack --trainwatchd bin/trainwatchd --scenario world --world 1000000
//   tw-bounds-attack --trainwatchd bin/trainwatchd --scenario ack
//
// runs:  run ids by the thousand (tw-ingest-load's streams, in waves of
//        --wave runs, each a Hello and one record), then trainwatchd's peak
//        RSS from /proc, /metrics' size and series, and the restart time
//        (spawn to its listening line) with the RSS after it.
// world: one stream says world_size --world and sends rank 0's per-rank
//        records at --rate for --seconds with a 1 s aggregation timeout, so
//        every step completes with the other ranks missing; the log's and
//        the database's growth.
// ack:   run b's agent acknowledges command ids C-1..C-5 none of which is
//        its run's; /metrics' trainwatch_command_acks_refused_total.
//
// The server runs in a fresh folder under /tmp with authentication off,
// its stderr in trainwatchd.log there; it is stopped at the end or on
// failure. Exit status 0, 1 when a scenario failed, 2 on bad flags.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "load_generator.h"
#include "spawned_server.h"
#include "trainwatch/v1/agent.grpc.pb.h"

ABSL_FLAG(std::string, trainwatchd, "bin/trainwatchd", "the trainwatchd binary");
ABSL_FLAG(std::string, server_flags, "",
          "more trainwatchd flags, e.g. --max_runs_in_memory=256");
ABSL_FLAG(std::string, scenario, "runs", "runs | world | ack");
ABSL_FLAG(int, runs, 20000, "runs: run ids to create");
ABSL_FLAG(int, wave, 500, "runs: streams open at a time");
ABSL_FLAG(int, world, 1000000, "world: the world_size the Hello claims");
ABSL_FLAG(double, seconds, 30, "world: how long to attack");
ABSL_FLAG(double, rate, 200, "world: records per second");

namespace {

namespace v1 = trainwatch::v1;
using trainwatch::bench::SpawnedServer;

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

int64_t FileBytes(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

// GET /metrics over plain HTTP/1.0; the body.
absl::StatusOr<std::string> Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to /metrics on port ", port));
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::UnavailableError("writing the /metrics request failed");
  }
  std::string resp;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  if (body == std::string::npos) return absl::DataLossError("no HTTP body from /metrics");
  return resp.substr(body + 4);
}

// Series (lines that are not comments) and one metric's value ("" if absent).
int64_t Series(const std::string& text) {
  int64_t n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty() && line[0] != '#') ++n;
  }
  return n;
}
std::string Value(const std::string& text, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, name + " ")) return std::string(line.substr(name.size() + 1));
  }
  return "";
}

class Harness {
 public:
  Harness() {
    char tmpl[] = "/tmp/tw_bounds_XXXXXX";
    dir_ = mkdtemp(tmpl);
    metrics_port_ = FreePort();
  }
  ~Harness() {
    if (server_) (void)server_->Stop(absl::Seconds(10));
    std::printf("files kept in %s\n", dir_.c_str());
  }
  std::string db() const { return dir_ + "/tw.db"; }
  std::string log() const { return dir_ + "/trainwatchd.log"; }
  int metrics_port() const { return metrics_port_; }
  SpawnedServer* server() { return server_.get(); }

  // Starts trainwatchd; the seconds to its listening line.
  absl::StatusOr<double> Start(const std::string& extra) {
    const std::string cmd = absl::StrCat(
        absl::GetFlag(FLAGS_trainwatchd), " --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:",
        metrics_port_, " --db=", db(), " ", absl::GetFlag(FLAGS_server_flags), " ", extra,
        " 2>>", log());
    const auto t0 = std::chrono::steady_clock::now();
    auto s = SpawnedServer::Start(cmd, absl::Seconds(600));
    if (!s.ok()) return s.status();
    server_ = *std::move(s);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  absl::Status Stop() {
    absl::Status s = server_->Stop(absl::Seconds(30));
    server_.reset();
    return s;
  }
  std::unique_ptr<v1::AgentService::Stub> Stub() {
    return v1::AgentService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

 private:
  std::string dir_;
  int metrics_port_ = 0;
  std::unique_ptr<SpawnedServer> server_;
};

double Mb(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

int Runs(Harness& h) {
  auto started = h.Start("");
  if (!started.ok()) return std::fprintf(stderr, "%s\n", started.status().ToString().c_str()), 1;
  const int runs = absl::GetFlag(FLAGS_runs);
  const int wave = std::max(1, absl::GetFlag(FLAGS_wave));
  const auto t0 = std::chrono::steady_clock::now();
  for (int done = 0; done < runs; done += wave) {
    trainwatch::bench::LoadConfig c;
    c.target = h.server()->address();
    c.runs = std::min(wave, runs - done);
    c.steps = 1;
    c.duration_limit = absl::Seconds(300);
    c.run_prefix = absl::StrCat("attack-", done);
    auto r = trainwatch::bench::RunLoad(c, {});
    if (!r.ok() || !r->complete) {
      std::fprintf(stderr, "wave at %d: %s\n", done,
                   r.ok() ? r->first_error.c_str() : r.status().ToString().c_str());
      return 1;
    }
  }
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto rss = h.server()->PeakRssBytes();
  auto text = Scrape(h.metrics_port());
  if (!rss.ok() || !text.ok()) return 1;
  std::printf("runs: %d run ids acknowledged in %.1f s\n", runs, load_s);
  std::printf("runs: trainwatchd peak RSS %.1f MB\n", Mb(*rss));
  std::printf("runs: /metrics %.1f KB, %lld series, runs in memory %s, omitted from /metrics %s\n",
              static_cast<double>(text->size()) / 1024, static_cast<long long>(Series(*text)),
              Value(*text, "trainwatch_runs_in_memory").c_str(),
              Value(*text, "trainwatch_metrics_runs_omitted").c_str());
  if (!h.Stop().ok()) return 1;
  auto again = h.Start("");
  if (!again.ok()) return 1;
  auto rss2 = h.server()->PeakRssBytes();
  auto text2 = Scrape(h.metrics_port());
  if (!rss2.ok() || !text2.ok()) return 1;
  std::printf("runs: restart to serving %.2f s, peak RSS after it %.1f MB, /metrics %.1f KB\n",
              *again, Mb(*rss2), static_cast<double>(text2->size()) / 1024);
  std::printf("runs: database %.1f MB\n", Mb(FileBytes(h.db()) + FileBytes(h.db() + "-wal")));
  return Mb(*rss) < 500 ? 0 : 1;
}

int World(Harness& h) {
  auto started = h.Start("--aggregation_timeout_ms=1000");
  if (!started.ok()) return std::fprintf(stderr, "%s\n", started.status().ToString().c_str()), 1;
  const int world = absl::GetFlag(FLAGS_world);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const double rate = std::max(1.0, absl::GetFlag(FLAGS_rate));
  const int64_t log0 = FileBytes(h.log());
  const int64_t db0 = FileBytes(h.db()) + FileBytes(h.db() + "-wal");
  auto stub = h.Stub();
  grpc::ClientContext ctx;
  auto stream = stub->Stream(&ctx);
  // Acks are read (and dropped) so flow control never stalls the attack.
  std::thread reader([&] {
    v1::ServerMessage m;
    while (stream->Read(&m)) {
    }
  });
  v1::AgentMessage hello;
  hello.mutable_hello()->set_run_id("wide");
  hello.mutable_hello()->set_world_size(world);
  hello.mutable_hello()->set_agent_version("attack");
  stream->Write(hello);
  const auto start = std::chrono::steady_clock::now();
  int64_t sent = 0;
  for (;;) {
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (t >= seconds) break;
    if (sent >= static_cast<int64_t>(t * rate)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    v1::AgentMessage m;
    auto* r = m.mutable_step_report();
    r->set_run_id("wide");
    r->set_world_size(world);
    r->set_rank(0);
    r->set_step(sent);
    r->set_scope(v1::REPORT_SCOPE_RANK);
    r->mutable_metrics()->set_loss(2.5);
    if (!stream->Write(m)) break;
    ++sent;
  }
  stream->WritesDone();
  // The last steps time out a second later.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  auto text = Scrape(h.metrics_port());
  ctx.TryCancel();
  reader.join();
  (void)stream->Finish();
  if (!text.ok()) return 1;
  const std::string incomplete = Value(*text, "trainwatch_incomplete_steps_total{run=\"wide\"}");
  const int64_t log_growth = FileBytes(h.log()) - log0;
  const int64_t db_growth = FileBytes(h.db()) + FileBytes(h.db() + "-wal") - db0;
  std::printf("world: world_size %d, %lld records in %.0f s, %s steps completed missing ranks\n",
              world, static_cast<long long>(sent), seconds, incomplete.c_str());
  std::printf("world: log grew %.2f MB (%.0f bytes a record), database grew %.2f MB\n",
              Mb(log_growth), sent > 0 ? double(log_growth) / double(sent) : 0.0, Mb(db_growth));
  auto rss = h.server()->PeakRssBytes();
  if (rss.ok()) std::printf("world: trainwatchd peak RSS %.1f MB\n", Mb(*rss));
  return incomplete.empty() ? 1 : 0;
}

int Ack(Harness& h) {
  auto started = h.Start("");
  if (!started.ok()) return std::fprintf(stderr, "%s\n", started.status().ToString().c_str()), 1;
  auto stub = h.Stub();
  grpc::ClientContext ctx;
  auto stream = stub->Stream(&ctx);
  v1::AgentMessage hello;
  hello.mutable_hello()->set_run_id("run-b");
  hello.mutable_hello()->set_world_size(1);
  hello.mutable_hello()->set_agent_version("attack");
  stream->Write(hello);
  for (int i = 1; i <= 5; ++i) {
    v1::AgentMessage m;
    auto* a = m.mutable_command_ack();
    a->set_run_id("run-b");
    a->set_command_id(absl::StrCat("C-", i));
    a->set_status(v1::ACK_STATUS_APPLIED);
    stream->Write(m);
  }
  stream->WritesDone();
  v1::ServerMessage m;
  while (stream->Read(&m)) {
  }
  const grpc::Status st = stream->Finish();
  std::string refused;
  for (int i = 0; i < 100 && refused != "5"; ++i) {
    auto text = Scrape(h.metrics_port());
    if (text.ok()) refused = Value(*text, "trainwatch_command_acks_refused_total");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("ack: stream ended %s; trainwatch_command_acks_refused_total %s of 5 forged\n",
              st.ok() ? "OK" : st.error_message().c_str(), refused.c_str());
  return refused == "5" ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("issue 13's attacks on a spawned trainwatchd, measured");
  absl::ParseCommandLine(argc, argv);
  const std::string scenario = absl::GetFlag(FLAGS_scenario);
  Harness h;
  if (scenario == "runs") return Runs(h);
  if (scenario == "world") return World(h);
  if (scenario == "ack") return Ack(h);
  std::fprintf(stderr, "tw-bounds-attack: --scenario=%s: give runs, world or ack\n",
               scenario.c_str());
  return 2;
}
