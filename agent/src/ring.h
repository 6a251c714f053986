// Private: the lock-free hand-off between one producer (the training
// thread) and one consumer (the pump). Slots are allocated once and reused
// in place, so a push in the steady state allocates nothing. Full means the
// newest item is refused, and counted: the step never waits for the pump.

#ifndef TRAINWATCH_AGENT_SRC_RING_H_
#define TRAINWATCH_AGENT_SRC_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace trainwatch::agent::internal {

template <typename T>
class Ring {
 public:
  // Room for at least `capacity` items (rounded up to a power of two).
  explicit Ring(size_t capacity) {
    size_t cap = 1;
    while (cap < capacity) cap <<= 1;
    slots_.resize(cap);
    mask_ = cap - 1;
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // Producer: the slot to fill, or nullptr (counted in dropped()) when the
  // ring is full. The slot still holds whatever it held last time round.
  T* BeginPush() {
    const uint64_t head = head_.load(std::memory_order_relaxed);
    if (head - tail_.load(std::memory_order_acquire) > mask_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    return &slots_[head & mask_];
  }
  // Producer: publishes the slot BeginPush() returned.
  void EndPush() {
    head_.store(head_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  // Consumer: the oldest published item, or nullptr when empty. Mutable so
  // that the consumer may move out what it keeps.
  T* Front() {
    const uint64_t tail = tail_.load(std::memory_order_relaxed);
    if (tail == head_.load(std::memory_order_acquire)) return nullptr;
    return &slots_[tail & mask_];
  }
  // Consumer: hands the front slot back to the producer.
  void Pop() {
    tail_.store(tail_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  size_t capacity() const { return slots_.size(); }
  // Pushes refused because the ring was full. Any thread.
  int64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  std::vector<T> slots_;
  size_t mask_;
  // The producer's line, then the consumer's.
  alignas(64) std::atomic<uint64_t> head_{0};
  std::atomic<int64_t> dropped_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
};

}  // namespace trainwatch::agent::internal

#endif  // TRAINWATCH_AGENT_SRC_RING_H_
