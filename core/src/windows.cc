#include "trainwatch/core/windows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace trainwatch::core {

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

// ---------------------------------------------------------------- DecayingMean

DecayingMean::DecayingMean(double span_steps)
    : keep_(1.0 - 2.0 / (span_steps + 1.0)), log_keep_(std::log(keep_)) {}

double DecayingMean::Decay(int64_t gap) const {
  // One step is by far the common case; exp(log) only for gaps.
  return gap == 1 ? keep_ : std::exp(log_keep_ * static_cast<double>(gap));
}

void DecayingMean::Add(int64_t step, double value) {
  if (count_ > 0) {
    const double d = Decay(step - last_step_);
    num_ *= d;
    den_ *= d;
  }
  num_ += value;
  den_ += 1.0;
  last_step_ = step;
  ++count_;
}

double DecayingMean::Value() const { return count_ ? num_ / den_ : kNaN; }

// --------------------------------------------------------------- SlidingMedian

SlidingMedian::SlidingMedian(int64_t window_steps)
    : window_(window_steps), ring_(static_cast<size_t>(window_steps)) {
  low_.reserve(ring_.size());
  high_.reserve(ring_.size());
}

size_t SlidingMedian::MemoryBytes() const {
  return ring_.capacity() * sizeof(Slot) +
         (low_.capacity() + high_.capacity()) * sizeof(int32_t);
}

bool SlidingMedian::Before(bool low, int32_t a, int32_t b) const {
  // The max-heap puts larger values first, the min-heap smaller ones.
  return low ? ring_[a].value > ring_[b].value : ring_[a].value < ring_[b].value;
}

void SlidingMedian::Place(bool low, size_t pos, int32_t slot) {
  (low ? low_ : high_)[pos] = slot;
  ring_[slot].pos = static_cast<int32_t>(pos);
  ring_[slot].in_low = low;
}

void SlidingMedian::SiftUp(bool low, size_t pos) {
  auto& heap = low ? low_ : high_;
  const int32_t slot = heap[pos];
  while (pos > 0) {
    const size_t parent = (pos - 1) / 2;
    if (!Before(low, slot, heap[parent])) break;
    Place(low, pos, heap[parent]);
    pos = parent;
  }
  Place(low, pos, slot);
}

void SlidingMedian::SiftDown(bool low, size_t pos) {
  auto& heap = low ? low_ : high_;
  const size_t n = heap.size();
  const int32_t slot = heap[pos];
  for (;;) {
    size_t child = 2 * pos + 1;
    if (child >= n) break;
    if (child + 1 < n && Before(low, heap[child + 1], heap[child])) ++child;
    if (!Before(low, heap[child], slot)) break;
    Place(low, pos, heap[child]);
    pos = child;
  }
  Place(low, pos, slot);
}

void SlidingMedian::PushHeap(bool low, int32_t slot) {
  auto& heap = low ? low_ : high_;
  heap.push_back(slot);
  SiftUp(low, heap.size() - 1);
}

int32_t SlidingMedian::PopTop(bool low) {
  auto& heap = low ? low_ : high_;
  const int32_t top = heap[0];
  const int32_t last = heap.back();
  heap.pop_back();
  if (!heap.empty()) {
    heap[0] = last;
    SiftDown(low, 0);
  }
  return top;
}

void SlidingMedian::Rebalance() {
  while (low_.size() > high_.size() + 1) PushHeap(false, PopTop(true));
  while (high_.size() > low_.size()) PushHeap(true, PopTop(false));
}

void SlidingMedian::Insert(int32_t slot) {
  const bool to_low = low_.empty() || ring_[slot].value <= ring_[low_[0]].value;
  PushHeap(to_low, slot);
  Rebalance();
}

void SlidingMedian::Remove(int32_t slot) {
  const bool low = ring_[slot].in_low;
  auto& heap = low ? low_ : high_;
  const size_t pos = static_cast<size_t>(ring_[slot].pos);
  const int32_t last = heap.back();
  heap.pop_back();
  if (pos < heap.size()) {
    // The moved element may belong above or below its new position.
    Place(low, pos, last);
    SiftUp(low, pos);
    SiftDown(low, static_cast<size_t>(ring_[last].pos));
  }
  Rebalance();
}

void SlidingMedian::PopOldest() {
  Remove(static_cast<int32_t>(head_));
  head_ = (head_ + 1) % ring_.size();
  --count_;
}

void SlidingMedian::EvictBefore(int64_t min_step) {
  while (count_ > 0 && ring_[head_].step < min_step) PopOldest();
}

void SlidingMedian::ReplaceOldest(int64_t step, double value) {
  // The new sample goes to the ring's tail and takes over the heap position
  // of the oldest (the same slot when the ring is full).
  const int32_t old = static_cast<int32_t>(head_);
  const int32_t slot = static_cast<int32_t>((head_ + count_) % ring_.size());
  const bool low = ring_[old].in_low;
  if (slot != old) Place(low, static_cast<size_t>(ring_[old].pos), slot);
  head_ = (head_ + 1) % ring_.size();
  ring_[slot].value = value;
  ring_[slot].step = step;
  SiftUp(low, static_cast<size_t>(ring_[slot].pos));
  SiftDown(low, static_cast<size_t>(ring_[slot].pos));
  // Only the replaced value can break max(low) <= min(high); if it does, the
  // two tops trade places and sink.
  if (!low_.empty() && !high_.empty() && ring_[low_[0]].value > ring_[high_[0]].value) {
    const int32_t a = low_[0], b = high_[0];
    Place(true, 0, b);
    Place(false, 0, a);
    SiftDown(true, 0);
    SiftDown(false, 0);
  }
}

void SlidingMedian::PushAndEvict(int64_t step, double value, int64_t min_step) {
  if (ring_.empty()) return;
  if (count_ > 0 && (ring_[head_].step < min_step || count_ == ring_.size())) {
    ReplaceOldest(step, value);
  } else {
    Push(step, value);
  }
  EvictBefore(min_step);
}

void SlidingMedian::Push(int64_t step, double value) {
  if (ring_.empty()) return;
  if (count_ == ring_.size()) {
    ReplaceOldest(step, value);
    return;
  }
  const size_t slot = (head_ + count_) % ring_.size();
  ring_[slot].value = value;
  ring_[slot].step = step;
  ++count_;
  Insert(static_cast<int32_t>(slot));
}

double SlidingMedian::Median() const {
  if (count_ == 0) return kNaN;
  const double lo = ring_[low_[0]].value;
  if (low_.size() > high_.size()) return lo;
  return 0.5 * (lo + ring_[high_[0]].value);
}

// ------------------------------------------------------------------ SlidingMin

SlidingMin::SlidingMin(int64_t window_steps)
    : ring_(static_cast<size_t>(window_steps) + 1) {}

void SlidingMin::Push(int64_t step, double value) {
  // Entries behind a smaller or equal newer value can never be the minimum
  // again: drop them from the back.
  while (count_ > 0) {
    const size_t back = (head_ + count_ - 1) % ring_.size();
    if (ring_[back].value < value) break;
    --count_;
  }
  if (count_ == ring_.size()) {  // only when steps span more than the window
    head_ = (head_ + 1) % ring_.size();
    --count_;
  }
  ring_[(head_ + count_) % ring_.size()] = Entry{step, value};
  ++count_;
}

double SlidingMin::MinSince(int64_t min_step) {
  while (count_ > 0 && ring_[head_].step < min_step) {
    head_ = (head_ + 1) % ring_.size();
    --count_;
  }
  return count_ ? ring_[head_].value : kNaN;
}

// ---------------------------------------------------------------- BucketSeries

BucketSeries::BucketSeries(int64_t width_steps, size_t capacity)
    : width_(width_steps), ring_(capacity) {}

void BucketSeries::Add(int64_t step, double value) {
  // Steps are never negative (the engine rejects them), so plain division.
  const int64_t index = step / width_;
  const size_t cap = ring_.size();
  if (newest_ < 0 || index > newest_) {
    // Open every bucket between the newest and this one, empty ones included,
    // so that Back(k) always means "k buckets ago".
    const int64_t from =
        newest_ < 0 ? index : std::max(newest_ + 1, index - static_cast<int64_t>(cap) + 1);
    for (int64_t b = from; b <= index; ++b) {
      Bucket& fresh = ring_[static_cast<size_t>(b % static_cast<int64_t>(cap))];
      fresh = Bucket{};
      fresh.index = b;
    }
    newest_ = index;
  }
  Bucket& b = ring_[static_cast<size_t>(newest_ % static_cast<int64_t>(cap))];
  if (b.count == 0) {
    b.min = b.max = value;
  } else {
    if (value < b.min) b.min = value;
    if (value > b.max) b.max = value;
  }
  b.sum += value;
  ++b.count;
}

const BucketSeries::Bucket& BucketSeries::Back(size_t back) const {
  if (newest_ < 0 || back >= ring_.size()) return none_;
  const int64_t index = newest_ - static_cast<int64_t>(back);
  if (index < 0) return none_;
  const Bucket& b = ring_[static_cast<size_t>(index % static_cast<int64_t>(ring_.size()))];
  return b.index == index ? b : none_;
}

}  // namespace trainwatch::core
