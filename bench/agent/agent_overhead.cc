// Agent overhead per step, statistics excluded: the latency of Agent::Step()
// (reduction, rule engine, hand-off to the sender) with the server up, down,
// and black-holed (accepting connections, never reading), side by side in
// one run; and the process's peak RSS with the default configuration.
//
//   agent_overhead [steps] [steps_per_second] [--json]
//                                   (default 100,000 at 20,000/s)
//
// Steps are paced (busy-waiting between them), far above any real trainer's
// rate but within what the sender can stream, so that "up" measures the
// steady state with every record acknowledged.
//
// Per mode it prints p50, p99, p99.9 and the maximum, and how many steps
// took over 100 us, with how many of those the kernel preempted the
// training thread during the step (involuntary context switches, from
// getrusage(RUSAGE_THREAD) read just outside the timed region): a slow step
// that was not preempted is the agent's own doing (a lock, an allocation,
// a full ring), one that was is the machine's.
//
// With --json, or when $TW_BENCH_JSON names a file (bench/run_all.py), the
// figures are also written as JSON objects, one a line, with keys {"figure",
// "value", "baseline", "ratio", "unit", "median", "min", "max"}: to stdout
// after the table with --json, appended to the file otherwise.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "trainwatch/agent/agent.h"
#include "server.h"

namespace {

using trainwatch::agent::Agent;
using trainwatch::agent::AgentConfig;
using trainwatch::agent::SingleProcessReducer;
using trainwatch::agent::StepInput;

long PeakRssKb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

long InvoluntarySwitches() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_nivcsw;
}

struct Result {
  double p50_us, p99_us, p999_us, max_us;
  int64_t slow = 0;            // steps over 100 us
  int64_t slow_preempted = 0;  // of those, preempted during the step
  long rss_kb;
  trainwatch::agent::AgentStats stats;
};

Result Measure(const std::string& address, int64_t steps, double rate) {
  AgentConfig cfg;
  cfg.server_address = address;
  cfg.run_id = "bench";
  auto agent = Agent::Create(cfg, std::make_unique<SingleProcessReducer>());
  if (!agent.ok()) {
    std::fprintf(stderr, "agent: %s\n", std::string(agent.status().message()).c_str());
    std::exit(1);
  }
  std::mt19937_64 rng(1);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> us;
  us.reserve(static_cast<size_t>(steps));
  std::vector<bool> preempted;
  preempted.reserve(static_cast<size_t>(steps));
  const uint64_t shard[2] = {17, 42};
  const auto period = std::chrono::duration<double>(1.0 / rate);
  auto next = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    while (std::chrono::steady_clock::now() < next) {
    }
    StepInput in;
    in.step = s;
    in.loss = 2.5 + 0.02 * n(rng);
    in.grad_sum_squares = std::exp(0.1 * n(rng));
    in.grad_elements = 1 << 20;
    in.log_z_sum = 8.0 * 512;
    in.log_z_rows = 512;
    in.learning_rate = 3e-4;
    in.shards = absl::MakeConstSpan(shard, 2);
    const long switches = InvoluntarySwitches();
    const auto t0 = std::chrono::steady_clock::now();
    (*agent)->Step(in).IgnoreError();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                     .count());
    preempted.push_back(InvoluntarySwitches() != switches);
  }
  // The steady state: the first steps allocate the engine's windows.
  const size_t warm = std::min<size_t>(us.size() / 10, 10000);
  Result r;
  for (size_t i = warm; i < us.size(); ++i) {
    if (us[i] > 100.0) {
      ++r.slow;
      r.slow_preempted += preempted[i] ? 1 : 0;
    }
  }
  us.erase(us.begin(), us.begin() + warm);
  std::sort(us.begin(), us.end());
  r.p50_us = us[us.size() / 2];
  r.p99_us = us[us.size() * 99 / 100];
  r.p999_us = us[us.size() * 999 / 1000];
  r.max_us = us.back();
  (*agent)->Close(address.empty() ? 0 : 3000);
  r.stats = (*agent)->Stats();
  r.rss_kb = PeakRssKb();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::vector<const char*> args;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  const int64_t steps = args.size() > 0 ? std::atoll(args[0]) : 100000;
  const double rate = args.size() > 1 ? std::atof(args[1]) : 20000.0;
  if (steps < 100 || !(rate > 0)) {
    std::fprintf(stderr, "usage: agent_overhead [steps >= 100] [steps_per_second > 0] [--json]\n");
    return 2;
  }
  const long base_kb = PeakRssKb();

  trainwatch::server::ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.metrics_listen = "";
  char dir[] = "/tmp/tw_agent_bench_XXXXXX";
  so.db_path = std::string(mkdtemp(dir)) + "/tw.db";
  auto server = trainwatch::server::Server::Start(so);
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  const std::string up = "127.0.0.1:" + std::to_string((*server)->port());

  // A port nobody listens on, and one that accepts and never reads.
  const int hole = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(hole, reinterpret_cast<sockaddr*>(&a), sizeof a);
  listen(hole, 16);
  socklen_t len = sizeof a;
  getsockname(hole, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string blackhole = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  const int spare = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in b{};
  b.sin_family = AF_INET;
  b.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(spare, reinterpret_cast<sockaddr*>(&b), sizeof b);
  len = sizeof b;
  getsockname(spare, reinterpret_cast<sockaddr*>(&b), &len);
  const std::string down = "127.0.0.1:" + std::to_string(ntohs(b.sin_port));
  close(spare);  // nobody listens there now

  std::printf("Agent::Step() latency, statistics excluded, %lld steps per mode at %.0f/s\n\n",
              static_cast<long long>(steps), rate);
  std::printf("%-12s %9s %9s %9s %9s %16s %10s %10s %9s\n", "server", "p50 us", "p99 us",
              "p99.9 us", "max us", ">100us (preempt)", "acked", "dropped", "peak RSS");
  std::vector<std::string> figures;
  struct Mode {
    const char* name;
    std::string address;
  };
  bool ok = true;
  for (const Mode& m : {Mode{"up", up}, Mode{"down", down}, Mode{"black-holed", blackhole}}) {
    const Result r = Measure(m.address, steps, rate);
    std::printf("%-12s %9.2f %9.2f %9.2f %9.1f %8lld (%5lld) %10lld %10lld %7.1f MB\n", m.name,
                r.p50_us, r.p99_us, r.p999_us, r.max_us, static_cast<long long>(r.slow),
                static_cast<long long>(r.slow_preempted),
                static_cast<long long>(r.stats.records_acked),
                static_cast<long long>(r.stats.records_dropped), r.rss_kb / 1024.0);
    ok = ok && r.p50_us <= 2.0 && r.p99_us <= 20.0 && r.p999_us <= 20.0;
    // One run per mode: no spread to give, so median/min/max stay empty.
    for (const auto& [what, v] : {std::pair<const char*, double>{"p50", r.p50_us},
                                  {"p99", r.p99_us},
                                  {"p99.9", r.p999_us},
                                  {"max", r.max_us}}) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "{\"figure\": \"agent Step() %s with the server %s\", \"unit\": \"us\", "
                    "\"value\": %.3f, \"baseline\": null, \"ratio\": null, \"median\": null, "
                    "\"min\": null, \"max\": null}",
                    what, m.name, v);
      figures.emplace_back(line);
    }
  }
  std::printf("\ngoals: p50 <= 2 us, p99 and p99.9 <= 20 us in every mode: %s\n",
              ok ? "met" : "NOT met");
  std::printf("process peak RSS before any agent: %.1f MB (includes the in-process server)\n",
              base_kb / 1024.0);
  if (const char* path = std::getenv("TW_BENCH_JSON"); path != nullptr && *path != '\0') {
    std::ofstream out(path, std::ios::app);
    for (const std::string& f : figures) out << f << "\n";
  } else if (json) {
    for (const std::string& f : figures) std::printf("%s\n", f.c_str());
  }
  close(hole);
  (*server)->Shutdown();
  return 0;
}
