// An allocator for the few buffers that hold a whole file's worth of data at
// once (twctl replay's text and rows: about 70 MB for a 500k-step log).
//
// Why: Debian's transparent huge pages are "madvise" by default, so such a
// buffer from malloc is touched in 4 KiB pages, each its own page fault. On a
// virtual machine a fault costs microseconds: a 500k-step replay took 22,000
// of them, a third of its time. Above kLargeAllocationBytes this allocator maps
// the memory itself, 2 MiB aligned, and asks for huge pages (madvise
// MADV_HUGEPAGE): a few dozen faults instead. Where the kernel has no huge
// pages the advice is ignored and the memory is plain pages, as before.
// Smaller requests go to operator new.

#ifndef TRAINWATCH_CORE_LARGE_ALLOCATOR_H_
#define TRAINWATCH_CORE_LARGE_ALLOCATOR_H_

#include <cstddef>
#include <new>

namespace trainwatch::core {

inline constexpr size_t kLargeAllocationBytes = size_t{2} << 20;

// `bytes` at least kLargeAllocationBytes; throws std::bad_alloc on failure.
void* AllocateLarge(size_t bytes);
void FreeLarge(void* p, size_t bytes);

template <typename T>
struct LargeAllocator {
  using value_type = T;

  LargeAllocator() = default;
  template <typename U>
  LargeAllocator(const LargeAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    const size_t bytes = n * sizeof(T);
    if (bytes < kLargeAllocationBytes) return static_cast<T*>(::operator new(bytes));
    return static_cast<T*>(AllocateLarge(bytes));
  }
  // The standard passes back the n given to allocate(), so the same test
  // picks the same path.
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes < kLargeAllocationBytes) {
      ::operator delete(p);
    } else {
      FreeLarge(p, bytes);
    }
  }

  template <typename U>
  bool operator==(const LargeAllocator<U>&) const noexcept { return true; }
  template <typename U>
  bool operator!=(const LargeAllocator<U>&) const noexcept { return false; }
};

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_LARGE_ALLOCATOR_H_
