// trainwatchd's allocator settings (server/daemon/malloc_conf.cc): jemalloc asks
// the kernel for transparent huge pages on the memory it maps, so a fresh
// daemon under load takes a fault per 2 MiB instead of per 4 KiB page.

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "stack.h"
#include "test_util.h"
#include "testing/wait.h"

namespace trainwatch::testing {
namespace {

// How many of `pid`'s mappings carry the huge page advice ("hg" in VmFlags,
// from madvise(MADV_HUGEPAGE)).
int HugePageAdvisedMappings(pid_t pid) {
  std::ifstream smaps("/proc/" + std::to_string(pid) + "/smaps");
  int n = 0;
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind("VmFlags:", 0) == 0 && (line + " ").find(" hg ") != std::string::npos) ++n;
  }
  return n;
}

// trainwatchd started with `env`, once it listens.
std::unique_ptr<Child> Start(const TempDir& dir, const std::string& name,
                             const std::map<std::string, std::string>& env) {
  const std::string log = dir.File(name + ".log");
  auto child = std::make_unique<Child>(
      std::vector<std::string>{TRAINWATCHD_PATH, "--listen", "127.0.0.1:0",
                               "--metrics_listen=", "--db", dir.File(name + ".db")},
      log, env);
  const bool listening =
      WaitUntil([&] { return ReadFile(log).find("listening on") != std::string::npos; },
                std::chrono::seconds(10), std::chrono::milliseconds(20));
  INFO(ReadFile(log));
  REQUIRE(listening);
  return child;
}

TEST_CASE("trainwatchd's allocator asks for huge pages and MALLOC_CONF overrides it",
          "[server][malloc]") {
#ifndef TRAINWATCHD_JEMALLOC
  WARN("trainwatchd is built with the system allocator (TRAINWATCH_MALLOC=system)");
  return;
#endif
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::stringstream mode;
  mode << thp.rdbuf();
  if (!thp || mode.str().find("[never]") != std::string::npos) {
    WARN("this kernel gives no transparent huge pages: " << mode.str());
    return;
  }
  TempDir dir;
  const auto configured = Start(dir, "configured", {});
  // The settings in the environment win over the built-in ones: with
  // jemalloc's default back, nothing in trainwatchd asks for huge pages.
  const auto overridden =
      Start(dir, "overridden", {{"MALLOC_CONF", "thp:default,metadata_thp:disabled"}});
  CHECK(HugePageAdvisedMappings(configured->pid()) > 0);
  CHECK(HugePageAdvisedMappings(overridden->pid()) == 0);
}

}  // namespace
}  // namespace trainwatch::testing
