#include "trainwatch/core/large_allocator.h"

#include <sys/mman.h>

#include <cstdint>
#include <limits>

namespace trainwatch::core {

namespace {

// x86-64's transparent huge page; the threshold above is one of them.
constexpr size_t kHugePage = kLargeAllocationBytes;

size_t RoundUp(size_t bytes) { return (bytes + kHugePage - 1) & ~(kHugePage - 1); }

}  // namespace

void* AllocateLarge(size_t bytes) {
  if (bytes > std::numeric_limits<size_t>::max() - 2 * kHugePage) throw std::bad_alloc();
  const size_t size = RoundUp(bytes);
  // One huge page more than asked, so that a 2 MiB boundary lies inside;
  // what lies outside [aligned, aligned + size) is given back at once.
  const size_t mapped = size + kHugePage;
  void* m = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t aligned = (base + kHugePage - 1) & ~uintptr_t{kHugePage - 1};
  if (aligned > base) ::munmap(m, aligned - base);
  const uintptr_t end = aligned + size;
  if (base + mapped > end) ::munmap(reinterpret_cast<void*>(end), base + mapped - end);
#ifdef MADV_HUGEPAGE
  // Advice only: refused (no THP in this kernel), the pages are small ones.
  ::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
#endif
  return reinterpret_cast<void*>(aligned);
}

void FreeLarge(void* p, size_t bytes) { ::munmap(p, RoundUp(bytes)); }

}  // namespace trainwatch::core
