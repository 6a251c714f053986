// Agent overhead per step, statistics excluded: the latency of Agent::Step()
// (reduction, rule engine, hand-off to the sender) with the server up, down,
// and black-holed (accepting connections, never reading), side by side in
// one run; and the process's peak RSS with the default configuration.
//
//   agent_overhead [steps] [steps_per_second] [--json]
//                  [--server=process|in-process|both] [--trainwatchd=PATH]
//                  [--sender_nice=N] [--layout=own-core|shared|both]
//                                   (default 100,000 at 20,000/s, process)
//
// Steps are paced (busy-waiting between them), far above any real trainer's
// rate but within what the sender can stream, so that "up" measures the
// steady state with every record acknowledged.
//
// "up" is trainwatchd as production runs it: a process of its own, started
// from PATH (default: the trainwatchd beside this binary), at the same
// priority as this one. --server=in-process runs it inside this process
// instead, as this bench did before: its threads then share the training
// thread's address space (its munmaps shoot down the training thread's TLB)
// as well as the cores; --server=both measures the two side by side.
// --sender_nice sets AgentConfig::sender_nice (default: the agent's).
//
// Per mode it prints p50, p99, p99.9 and the maximum, and how many steps
// took over 100 us, with how many of those the kernel preempted the
// training thread during the step (involuntary context switches, from
// getrusage(RUSAGE_THREAD) read just outside the timed region). A second
// table says what every step over 20 us (the p99.9 goal) was made of, each
// counted once, in this
// order: preempted (the machine's: another thread took the core); blocked
// (a voluntary switch: the step slept in the kernel, on a lock or a
// syscall: the agent's own); faulted (a page fault: first touch of memory);
// on-CPU (the step's own thread CPU time, CLOCK_THREAD_CPUTIME_ID, is at
// least half its wall time: the agent's own work); other (off the CPU with
// no switch the thread saw: interrupts, a hypervisor's steal). The last
// row, "none (floor)", has no agent: its timed region is a 1.5 us spin,
// about a step's median, so it shows what the machine alone does to so
// short a region (timer ticks and preemption land on it too). It also
// gives the step at which the agent took the server's rules, and that
// step's latency, warm-up or not.
//
// --layout says where the threads run. "own-core" gives the training
// thread a core of its own (the first one this process may use) and puts
// the agent's sender thread and trainwatchd on the others: a trainer's host
// has dozens of cores and trainwatchd runs on another host, so this is the
// layout a Step() in production sees. "shared" leaves every thread free to
// run on every core, so that on a small machine the training thread also
// waits for trainwatchd's threads and the sender. "both" (the default)
// measures the two side by side, each with its own floor row.
//
// With --json, or when $TW_BENCH_JSON names a file (bench/run_all.py), the
// figures are also written as JSON objects, one a line, with keys {"figure",
// "value", "baseline", "ratio", "unit", "median", "min", "max"}: to stdout
// after the table with --json, appended to the file otherwise.

#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
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
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "trainwatch/agent/agent.h"
#include "daemon/server.h"
#include "testing/temp_dir.h"

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

// What the kernel says about the calling thread, read outside the timed
// region on both sides of a step.
struct ThreadProbe {
  long involuntary, voluntary, faults;
  int64_t cpu_ns;
  static ThreadProbe Now() {
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return {u.ru_nivcsw, u.ru_nvcsw, u.ru_minflt + u.ru_majflt,
            static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec};
  }
};

// A slow step: over the goal (p99.9 <= 20 us), and what the table below the
// first says the slow steps were made of.
constexpr double kSlowUs = 20.0;

// The calling thread's CPU set; threads it creates (the agent's sender) and
// processes it forks (trainwatchd) start with it.
void PinCallingThread(const cpu_set_t& cpus) {
  pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
}

// Where the training thread and everything else run in one layout.
struct Layout {
  std::string name;   // "own-core" or "shared"
  cpu_set_t trainer;  // the training thread's CPUs while it steps
  cpu_set_t rest;     // the sender thread's and trainwatchd's
};

struct Result {
  double p50_us, p99_us, p999_us, max_us;
  int64_t over_100 = 0, over_100_preempted = 0;
  int64_t slow = 0;  // steps over kSlowUs, and what each was made of
  int64_t preempted = 0, blocked = 0, faulted = 0, on_cpu = 0, other = 0;
  long rss_kb;
  int64_t switch_step = -1;
  double switch_us = 0;
  trainwatch::agent::AgentStats stats;
};

// The floor's timed region: a busy spin about as long as a step's median.
constexpr auto kFloorSpin = std::chrono::nanoseconds(1500);

// `floor`: no agent at all; the timed region only spins (kFloorSpin), so
// that what the machine alone does to so short a region is on the table.
Result Measure(const std::string& address, int64_t steps, double rate, bool floor,
               int sender_nice, const Layout& layout, bool liveness = true) {
  PinCallingThread(layout.rest);  // the sender thread is created with this set
  std::unique_ptr<Agent> agent;
  if (!floor) {
    AgentConfig cfg;
    cfg.server_address = address;
    cfg.run_id = "bench";
    cfg.liveness = liveness;
    if (sender_nice >= 0) cfg.sender_nice = sender_nice;
    auto created = Agent::Create(cfg, std::make_unique<SingleProcessReducer>());
    if (!created.ok()) {
      std::fprintf(stderr, "agent: %s\n", std::string(created.status().message()).c_str());
      std::exit(1);
    }
    agent = *std::move(created);
  }
  std::mt19937_64 rng(1);
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> us;
  us.reserve(static_cast<size_t>(steps));
  // One cause per step, as in the header's order (0: a fast step).
  enum Cause : uint8_t { kFast, kPreempted, kBlocked, kFaulted, kOnCpu, kOther };
  std::vector<uint8_t> cause;
  cause.reserve(static_cast<size_t>(steps));
  PinCallingThread(layout.trainer);
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
    const ThreadProbe before = ThreadProbe::Now();
    const auto t0 = std::chrono::steady_clock::now();
    if (agent != nullptr) {
      agent->Step(in).IgnoreError();
    } else {
      while (std::chrono::steady_clock::now() - t0 < kFloorSpin) {
      }
    }
    const double wall =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    const ThreadProbe after = ThreadProbe::Now();
    us.push_back(wall);
    Cause c = kFast;
    if (wall > kSlowUs) {
      c = after.involuntary != before.involuntary ? kPreempted
          : after.voluntary != before.voluntary   ? kBlocked
          : after.faults != before.faults         ? kFaulted
          : (after.cpu_ns - before.cpu_ns) * 2 >= static_cast<int64_t>(wall * 1000) ? kOnCpu
                                                                                    : kOther;
    }
    cause.push_back(c);
  }
  PinCallingThread(layout.rest);
  Result r;
  if (agent != nullptr) r.stats = agent->Stats();
  const int64_t sw = r.stats.server_rules_from_step;
  r.switch_step = sw;
  r.switch_us = sw >= 0 && sw < static_cast<int64_t>(us.size()) ? us[static_cast<size_t>(sw)] : 0;
  // The steady state: the first steps allocate the engine's windows.
  const size_t warm = std::min<size_t>(us.size() / 10, 10000);
  for (size_t i = warm; i < us.size(); ++i) {
    if (us[i] > 100.0) {
      ++r.over_100;
      r.over_100_preempted += cause[i] == kPreempted ? 1 : 0;
    }
    switch (cause[i]) {
      case kFast: continue;
      case kPreempted: ++r.preempted; break;
      case kBlocked: ++r.blocked; break;
      case kFaulted: ++r.faulted; break;
      case kOnCpu: ++r.on_cpu; break;
      case kOther: ++r.other; break;
    }
    ++r.slow;
  }
  us.erase(us.begin(), us.begin() + warm);
  std::sort(us.begin(), us.end());
  r.p50_us = us[us.size() / 2];
  r.p99_us = us[us.size() * 99 / 100];
  r.p999_us = us[us.size() * 999 / 1000];
  r.max_us = us.back();
  if (agent != nullptr) {
    agent->Close(address.empty() ? 0 : 3000);
    r.stats = agent->Stats();
  }
  r.rss_kb = PeakRssKb();
  return r;
}

// trainwatchd as a child process in its own process group, its output in
// `log`; stopped (SIGTERM, then SIGKILL) on destruction.
class ServerProcess {
 public:
  ServerProcess(const std::string& binary, const std::string& db, const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execl(binary.c_str(), binary.c_str(), "--listen", "127.0.0.1:0", "--metrics_listen", "",
            "--db", db.c_str(), static_cast<char*>(nullptr));
      std::fprintf(stderr, "exec %s: %s\n", binary.c_str(), std::strerror(errno));
      _exit(127);
    }
    // Its port, from its first lines; a bench, so a plain poll for 10 s.
    for (int i = 0; i < 1000 && port_ == 0; ++i) {
      std::ifstream in(log);
      for (std::string line; std::getline(in, line);) {
        std::sscanf(line.c_str(), "listening on 127.0.0.1:%d", &port_);
      }
      if (port_ == 0) {
        if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
  ~ServerProcess() {
    if (pid_ <= 0) return;
    kill(-pid_, SIGTERM);
    for (int i = 0; i < 500; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// This binary's folder, where the build puts trainwatchd too.
std::string SiblingBinary(const char* name) {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string();
  dir = dir.substr(0, dir.rfind('/') + 1);
  return dir + name;
}

// Liveness on and off (AgentConfig::liveness), side by side against the
// same server: kLivenessRounds of each, alternated so that the machine's
// drift lands on both; the medians' ratios, on over off.
constexpr int kLivenessRounds = 3;

void LivenessAB(const std::string& address, int64_t steps, double rate, int sender_nice,
                const Layout& layout, std::vector<std::string>* figures) {
  std::vector<double> p50[2], p999[2];  // [0]: off, [1]: on
  for (int round = 0; round < kLivenessRounds; ++round) {
    for (int on = 1; on >= 0; --on) {
      const Result r = Measure(address, steps, rate, false, sender_nice, layout, on == 1);
      p50[on].push_back(r.p50_us);
      p999[on].push_back(r.p999_us);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("\nliveness on vs off (the step's timing for the heartbeats), %d rounds of each, "
              "alternated, medians:\n",
              kLivenessRounds);
  for (const auto& [what, v] : {std::pair<const char*, std::vector<double>*>{"p50", p50},
                                {"p99.9", p999}}) {
    const double on = median(v[1]), off = median(v[0]);
    const auto [lo, hi] = std::minmax_element(v[1].begin(), v[1].end());
    std::printf("  Step() %-6s on %7.2f us [%.2f-%.2f], off %7.2f us: ratio %.3f\n", what, on,
                *lo, *hi, off, on / off);
    char line[400];
    std::snprintf(line, sizeof line,
                  "{\"figure\": \"agent Step() %s, liveness on vs off (%s)\", \"unit\": \"us\", "
                  "\"value\": %.3f, \"baseline\": %.3f, \"ratio\": %.4f, \"median\": %.3f, "
                  "\"min\": %.3f, \"max\": %.3f}",
                  what, layout.name.c_str(), on, off, on / off, on, *lo, *hi);
    figures->emplace_back(line);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::string server_mode = "process";
  std::string trainwatchd = SiblingBinary("trainwatchd");
  int sender_nice = -1;  // the agent's default
  bool nice_given = false;
  std::string layout_mode = "both";
  std::vector<const char*> args;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strncmp(argv[i], "--server=", 9) == 0) {
      server_mode = argv[i] + 9;
    } else if (std::strncmp(argv[i], "--trainwatchd=", 14) == 0) {
      trainwatchd = argv[i] + 14;
    } else if (std::strncmp(argv[i], "--layout=", 9) == 0) {
      layout_mode = argv[i] + 9;
    } else if (std::strncmp(argv[i], "--sender_nice=", 14) == 0) {
      sender_nice = std::atoi(argv[i] + 14);
      nice_given = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  const int64_t steps = args.size() > 0 ? std::atoll(args[0]) : 100000;
  const double rate = args.size() > 1 ? std::atof(args[1]) : 20000.0;
  if (steps < 100 || !(rate > 0) ||
      (server_mode != "process" && server_mode != "in-process" && server_mode != "both") ||
      (layout_mode != "own-core" && layout_mode != "shared" && layout_mode != "both") ||
      (nice_given && (sender_nice < 0 || sender_nice > 19))) {
    std::fprintf(stderr,
                 "usage: agent_overhead [steps >= 100] [steps_per_second > 0] [--json] "
                 "[--server=process|in-process|both] [--trainwatchd=PATH] "
                 "[--sender_nice=0..19] [--layout=own-core|shared|both]\n");
    return 2;
  }
  const long base_kb = PeakRssKb();
  // Declared before the servers: they stop before their files go.
  const trainwatch::testing::ScopedTempDir dir("tw_agent_bench_");
  if (dir.path().empty()) {
    std::perror("agent_overhead: a folder under $TMPDIR");
    return 1;
  }
  const std::string& tmp = dir.path();

  // The layouts: own-core needs two CPUs this process may use.
  cpu_set_t all;
  CPU_ZERO(&all);
  sched_getaffinity(0, sizeof all, &all);
  std::vector<Layout> layouts;
  if (layout_mode != "shared") {
    if (CPU_COUNT(&all) < 2) {
      std::printf("own-core layout skipped: this process may use only one CPU\n");
    } else {
      Layout own{"own-core", {}, all};
      CPU_ZERO(&own.trainer);
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &all)) {
          CPU_SET(c, &own.trainer);
          CPU_CLR(c, &own.rest);
          break;
        }
      }
      layouts.push_back(own);
    }
  }
  if (layout_mode != "own-core") layouts.push_back({"shared", all, all});

  struct Mode {
    std::string name;
    std::string address;
    bool floor = false;
  };
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

  std::printf("Agent::Step() latency, statistics excluded, %lld steps per mode at %.0f/s; "
              "trainwatchd %s\n",
              static_cast<long long>(steps), rate,
              server_mode == "process"      ? "in a process of its own"
              : server_mode == "in-process" ? "inside this process"
                                            : "in a process of its own, then inside this one");
  std::vector<std::string> figures;
  bool ok = true;
  for (const Layout& layout : layouts) {
    const bool own = layout.name == "own-core";
    std::printf("\n%s\n", own ? "own-core: the training thread on a core of its own, the sender "
                                "and trainwatchd on the others (a trainer's host)"
                              : "shared: every thread on every core");
    // Started from a thread holding the layout's other CPUs: its threads
    // inherit them.
    PinCallingThread(layout.rest);
    std::vector<Mode> modes;
    std::unique_ptr<ServerProcess> child;
    if (server_mode != "in-process") {
      child = std::make_unique<ServerProcess>(trainwatchd, tmp + "/" + layout.name + ".db",
                                              tmp + "/" + layout.name + ".log");
      if (child->port() == 0) {
        std::ifstream log(tmp + "/" + layout.name + ".log");
        std::stringstream text;
        text << log.rdbuf();
        std::fprintf(stderr, "trainwatchd (%s) did not start; its output:\n%s\n",
                     trainwatchd.c_str(), text.str().c_str());
        return 1;
      }
      modes.push_back({"up", "127.0.0.1:" + std::to_string(child->port())});
    }
    // Inside this process: its threads share the training thread's memory,
    // so the shared layout only.
    std::unique_ptr<trainwatch::server::Server> in_process;
    if (server_mode != "process" && !own) {
      trainwatch::server::ServerOptions so;
      so.listen = "127.0.0.1:0";
      so.metrics_listen = "";
      so.db_path = tmp + "/tw.db";
      auto server = trainwatch::server::Server::Start(so);
      if (!server.ok()) {
        std::fprintf(stderr, "server: %s\n", std::string(server.status().message()).c_str());
        return 1;
      }
      in_process = *std::move(server);
      modes.push_back({server_mode == "both" ? "up in-process" : "up",
                       "127.0.0.1:" + std::to_string(in_process->port())});
    }
    modes.push_back({"down", down});
    modes.push_back({"black-holed", blackhole});
    modes.push_back({"none (floor)", "", true});

    std::printf("%-14s %9s %9s %9s %9s %16s %10s %10s %9s\n", "server", "p50 us", "p99 us",
                "p99.9 us", "max us", ">100us (preempt)", "acked", "dropped", "peak RSS");
    std::vector<std::pair<std::string, Result>> results;
    for (const Mode& m : modes) {
      const Result r = Measure(m.address, steps, rate, m.floor, sender_nice, layout);
      results.emplace_back(m.name, r);
      std::printf("%-14s %9.2f %9.2f %9.2f %9.1f %8lld (%5lld) %10lld %10lld %7.1f MB\n",
                  m.name.c_str(), r.p50_us, r.p99_us, r.p999_us, r.max_us,
                  static_cast<long long>(r.over_100),
                  static_cast<long long>(r.over_100_preempted),
                  static_cast<long long>(r.stats.records_acked),
                  static_cast<long long>(r.stats.records_dropped), r.rss_kb / 1024.0);
      // The floor is the machine's, not a figure of the agent's; but it is
      // what the agent's figures stand on, so it goes into the JSON too.
      if (!m.floor) ok = ok && r.p50_us <= 2.0 && r.p99_us <= 20.0 && r.p999_us <= 20.0;
      const std::string what_of =
          m.floor ? std::string("no-agent floor (a 1.5 us spin)") : "agent Step()";
      const std::string where = m.floor ? std::string() : " with the server " + m.name;
      // One run per mode: no spread to give, so median/min/max stay empty.
      for (const auto& [what, v] : {std::pair<const char*, double>{"p50", r.p50_us},
                                    {"p99", r.p99_us},
                                    {"p99.9", r.p999_us},
                                    {"max", r.max_us}}) {
        char line[320];
        std::snprintf(line, sizeof line,
                      "{\"figure\": \"%s %s%s (%s)\", \"unit\": \"us\", "
                      "\"value\": %.3f, \"baseline\": null, \"ratio\": null, \"median\": null, "
                      "\"min\": null, \"max\": null}",
                      what_of.c_str(), what, where.c_str(), layout.name.c_str(), v);
        figures.emplace_back(line);
      }
    }
    if (!modes.empty() && modes[0].name == "up") {
      LivenessAB(modes[0].address, steps, rate, sender_nice, layout, &figures);
    }
    std::printf("\nsteps over %.0f us (%s), by what they were made of (see the header), and the "
                "step that switched to the server's rules:\n",
                kSlowUs, "the p99.9 goal");
    std::printf("%-14s %9s %9s %9s %9s %9s %22s\n", "server", "preempted", "blocked", "faulted",
                "on-CPU", "other", "server rules at step");
    for (const auto& [name, r] : results) {
      std::printf("%-14s %9lld %9lld %9lld %9lld %9lld %9lld (%7.1f us)\n", name.c_str(),
                  static_cast<long long>(r.preempted), static_cast<long long>(r.blocked),
                  static_cast<long long>(r.faulted), static_cast<long long>(r.on_cpu),
                  static_cast<long long>(r.other), static_cast<long long>(r.switch_step),
                  r.switch_us);
    }
    if (in_process != nullptr) in_process->Shutdown();
  }
  PinCallingThread(all);
  std::printf("\ngoals: p50 <= 2 us, p99 and p99.9 <= 20 us in every mode and layout: %s\n",
              ok ? "met" : "NOT met");
  std::printf("process peak RSS before any agent: %.1f MB%s\n", base_kb / 1024.0,
              server_mode == "process" ? "" : " (before the in-process server)");
  if (const char* path = std::getenv("TW_BENCH_JSON"); path != nullptr && *path != '\0') {
    std::ofstream out(path, std::ios::app);
    for (const std::string& f : figures) out << f << "\n";
  } else if (json) {
    for (const std::string& f : figures) std::printf("%s\n", f.c_str());
  }
  close(hole);
  return 0;
}
