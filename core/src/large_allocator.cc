#include "trainwatch/core/large_allocator.h"

#include <sys/mman.h>

#include <cstdint>

namespace trainwatch::core {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t bytes) { return (bytes + kHugePage - 1) & ~(kHugePage - 1); }

}  // namespace

void* AllocateLarge(size_t bytes) {
  const size_t size = RoundUp(bytes);
  if (size < bytes) throw std::bad_alloc();
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
  // Advice only: refused (no THP in this kernel), the pages are small ones.
  ::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

void FreeLarge(void* p, size_t bytes) { ::munmap(p, RoundUp(bytes)); }

}  // namespace trainwatch::core
