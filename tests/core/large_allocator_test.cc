#include "trainwatch/core/large_allocator.h"

#include <sys/resource.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace trainwatch::core {
namespace {

long MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// The page faults of first touching `bytes` through `v` (empty).
template <typename A>
long FaultsToFill(size_t bytes, std::vector<uint64_t, A>& v) {
  v.reserve(bytes / sizeof(uint64_t));
  const long before = MinorFaults();
  for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i) v.push_back(i);
  const long faults = MinorFaults() - before;
  CHECK(v[12345] == 12345);
  return faults;
}

// The kernel's transparent huge page mode: "always", "madvise" (Debian's
// default), "never", or "" when it has none.
std::string HugePageMode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  const size_t open = line.find('['), close = line.find(']');
  return open == std::string::npos || close < open ? "" : line.substr(open + 1, close - open - 1);
}

TEST_CASE("large allocator: small requests from operator new - large ones 2 MiB aligned",
          "[core][large_allocator]") {
  LargeAllocator<char> a;
  char* small = a.allocate(100);
  std::memset(small, 1, 100);
  a.deallocate(small, 100);
  for (size_t bytes : {kLargeAllocationBytes, kLargeAllocationBytes + 1, size_t{5} << 20}) {
    char* p = a.allocate(bytes);
    CHECK(reinterpret_cast<uintptr_t>(p) % kLargeAllocationBytes == 0);
    p[0] = 1;
    p[bytes - 1] = 2;
    CHECK(p[0] + p[bytes - 1] == 3);
    a.deallocate(p, bytes);
  }
  // More than the address space: refused, never a wrapped small size.
  CHECK_THROWS_AS(a.allocate(static_cast<size_t>(-1)), std::bad_alloc);
  CHECK_THROWS_AS(LargeAllocator<uint64_t>().allocate(static_cast<size_t>(-1) / 4),
                  std::bad_array_new_length);
}

TEST_CASE("large allocator: a vector grows - copies and shrinks across the threshold",
          "[core][large_allocator]") {
  std::vector<uint32_t, LargeAllocator<uint32_t>> v;
  for (uint32_t i = 0; i < (3u << 20); ++i) v.push_back(i * 7);  // 12 MiB, through every size
  auto copy = v;
  v.resize(10);
  v.shrink_to_fit();
  REQUIRE(copy.size() == (3u << 20));
  for (uint32_t i = 0; i < copy.size(); i += 4099) CHECK(copy[i] == i * 7);
  CHECK(v[9] == 63);
}

// The /proc/self/smaps entry of the mapping that holds `p`: its "VmFlags:"
// line (the advice given: "hg" for MADV_HUGEPAGE) and its AnonHugePages in
// KiB (what the kernel gave). False when no mapping holds it.
bool SmapsOf(const void* p, std::string* flags, long* huge_kb) {
  std::ifstream f("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false, found = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
      found |= inside;
      continue;
    }
    if (!inside) continue;
    if (line.rfind("AnonHugePages:", 0) == 0) *huge_kb = std::stol(line.substr(14));
    if (line.rfind("VmFlags:", 0) == 0) *flags = line;
  }
  return found;
}

// What it is for: first touches of a whole log's rows in huge pages, not one
// fault per 4 KiB (a third of a 500k-step replay on a virtual machine).
TEST_CASE("large allocator: its memory is advised huge - filled in a fraction of malloc's faults",
          "[core][large_allocator]") {
  const std::string mode = HugePageMode();
  if (mode != "madvise" && mode != "always") {
    WARN("transparent huge pages are '" << mode << "' in this kernel: nothing to compare");
    return;
  }
  constexpr size_t kBytes = size_t{64} << 20;
  long plain;
  {
    std::vector<uint64_t> m;
    plain = FaultsToFill(kBytes, m);
  }
  std::vector<uint64_t, LargeAllocator<uint64_t>> v;
  const long large = FaultsToFill(kBytes, v);
  std::string flags;
  long huge_kb = 0;
  REQUIRE(SmapsOf(v.data(), &flags, &huge_kb));
  // The advice is the allocator's own doing, whatever the kernel had free.
  CHECK(flags.find(" hg") != std::string::npos);
  WARN("page faults filling 64 MiB (THP " << mode << "): malloc " << plain << ", large allocator "
                                          << large << " (" << huge_kb / 1024 << " MiB huge)");
  if (huge_kb < 32 * 1024) {
    // Fragmented memory: the kernel gave small pages, as it may.
    WARN("the kernel had huge pages for " << huge_kb / 1024 << " MiB only: faults not compared");
    return;
  }
  // 16,384 4 KiB pages against 32 huge ones. With THP "always" malloc's
  // memory gets huge pages too.
  if (mode == "madvise") CHECK(plain > 8000);
  CHECK(large < 16384 / 4);
}

}  // namespace
}  // namespace trainwatch::core
