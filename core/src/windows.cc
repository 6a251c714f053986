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

DecayingMean::DecayingMean(double span_steps, double min_span_samples)
    : keep_(1.0 - 2.0 / (span_steps + 1.0)),
      log_keep_(std::log(keep_)),
      min_keep_(min_span_samples > 1.0 ? 1.0 - 2.0 / (min_span_samples + 1.0) : 0.0) {}

double DecayingMean::DecayOver(int64_t gap) const {
  return std::max(min_keep_, std::exp(log_keep_ * static_cast<double>(gap)));
}

// --------------------------------------------------------------- SlidingMedian

SlidingMedian::SlidingMedian(int64_t window_steps)
    : window_(window_steps),
      ring_(static_cast<size_t>(window_steps)),
      sorted_form_(window_steps <= kSortedMaxWindow) {
  if (sorted_form_) {
    values_.resize(ring_.size());
    sorted_.resize(ring_.size());
    return;
  }
  // Each heap holds at most half the window (its side of the middle ranks),
  // plus one between an insertion and the rebalance after it, and the run
  // one over its capacity: reserved once, never grown.
  low_.reserve(ring_.size() / 2 + 2);
  mid_.reserve(kMidCapacity + 2);
  high_.reserve(ring_.size() / 2 + 2);
}

size_t SlidingMedian::MemoryBytes() const {
  return ring_.capacity() * sizeof(Slot) +
         (low_.capacity() + mid_.capacity() + high_.capacity()) * sizeof(Entry) +
         (values_.capacity() + sorted_.capacity()) * sizeof(double);
}

size_t SlidingMedian::LowerBound(double value) const {
  // The first index whose value is not below `value`, by halving with a
  // conditional move instead of a branch.
  const double* const first = sorted_.data();
  const double* base = first;
  size_t n = count_;
  if (n == 0) return 0;
  while (n > 1) {
    const size_t half = n / 2;
    base = base[half] < value ? base + half : base;
    n -= half;
  }
  return static_cast<size_t>(base - first) + (*base < value ? 1 : 0);
}

void SlidingMedian::SortedReplace(double old_value, double value) {
  // REQUIRES: count_ > 0. The two searches of LowerBound in one loop: they
  // are independent, so their loads overlap and the loop's count is shared.
  // Any entry equal to the old value is as good as another: equal values are
  // interchangeable in every later median.
  double* const a = sorted_.data();
  const double* at_old = a;
  const double* at_new = a;
  for (size_t n = count_; n > 1;) {
    const size_t half = n / 2;
    at_old = at_old[half] < old_value ? at_old + half : at_old;
    at_new = at_new[half] < value ? at_new + half : at_new;
    n -= half;
  }
  const size_t p = static_cast<size_t>(at_old - a) + (*at_old < old_value ? 1 : 0);
  const size_t q = static_cast<size_t>(at_new - a) + (*at_new < value ? 1 : 0);
  if (q > p) {
    std::copy(a + p + 1, a + q, a + p);
    a[q - 1] = value;
  } else {
    std::copy_backward(a + q, a + p, a + p + 1);
    a[q] = value;
  }
}

template <bool kLow>
void SlidingMedian::Place(size_t pos, Entry e) {
  Heap<kLow>()[pos] = e;
  ring_[e.slot].pos = static_cast<int32_t>(pos);
  ring_[e.slot].part = kLow ? kInLow : kInHigh;
}

// The max-heap puts larger values first, the min-heap smaller ones.
#define TW_BEFORE(a, b) (kLow ? (a).value > (b).value : (a).value < (b).value)  // NOLINT

template <bool kLow>
void SlidingMedian::SiftUp(size_t pos) {
  std::vector<Entry>& heap = Heap<kLow>();
  const Entry e = heap[pos];
  while (pos > 0) {
    const size_t parent = (pos - 1) / 2;
    if (!TW_BEFORE(e, heap[parent])) break;
    Place<kLow>(pos, heap[parent]);
    pos = parent;
  }
  Place<kLow>(pos, e);
}

template <bool kLow>
void SlidingMedian::SiftDown(size_t pos) {
  std::vector<Entry>& heap = Heap<kLow>();
  const size_t n = heap.size();
  const Entry e = heap[pos];
  for (;;) {
    size_t child = 2 * pos + 1;
    if (child >= n) break;
    // A data-dependent but branch-free choice: the comparison of two random
    // siblings is a coin toss the branch predictor would lose half the time.
    if (child + 1 < n) child += TW_BEFORE(heap[child + 1], heap[child]) ? 1 : 0;
    if (!TW_BEFORE(heap[child], e)) break;
    Place<kLow>(pos, heap[child]);
    pos = child;
  }
  Place<kLow>(pos, e);
}

#undef TW_BEFORE

template <bool kLow>
void SlidingMedian::Repair(size_t pos) {
  const int32_t slot = Heap<kLow>()[pos].slot;
  SiftUp<kLow>(pos);
  SiftDown<kLow>(static_cast<size_t>(ring_[slot].pos));
}

template <bool kLow>
void SlidingMedian::PushHeap(Entry e) {
  std::vector<Entry>& heap = Heap<kLow>();
  heap.push_back(e);
  SiftUp<kLow>(heap.size() - 1);
}

template <bool kLow>
SlidingMedian::Entry SlidingMedian::PopTop() {
  std::vector<Entry>& heap = Heap<kLow>();
  const Entry top = heap[0];
  const Entry last = heap.back();
  heap.pop_back();
  if (!heap.empty()) {
    Place<kLow>(0, last);
    SiftDown<kLow>(0);
  }
  return top;
}

template <bool kLow>
void SlidingMedian::RemoveAt(size_t pos) {
  std::vector<Entry>& heap = Heap<kLow>();
  const Entry last = heap.back();
  heap.pop_back();
  if (pos < heap.size()) {
    // The moved entry may belong above or below its new position.
    Place<kLow>(pos, last);
    Repair<kLow>(pos);
  }
}

void SlidingMedian::MidInsert(Entry e) {
  // Rare (a sample lands in the run about once in window / kMidCapacity
  // steps), so a plain search.
  auto at = std::upper_bound(mid_.begin(), mid_.end(), e.value,
                             [](double v, const Entry& x) { return v < x.value; });
  ring_[e.slot].part = kInMid;
  mid_.insert(at, e);
}

void SlidingMedian::MidPushFront(Entry e) {
  ring_[e.slot].part = kInMid;
  mid_.insert(mid_.begin(), e);
}

void SlidingMedian::MidPushBack(Entry e) {
  ring_[e.slot].part = kInMid;
  mid_.push_back(e);
}

void SlidingMedian::Rebalance() {
  const size_t n = low_.size() + mid_.size() + high_.size();
  if (n == 0) return;
  const size_t lower = (n - 1) / 2;  // the middle ranks
  const size_t upper = n / 2;
  // An end of a full run goes to the heap on its side; the one whose middle
  // ranks stay inside the run (kMidCapacity >= 2 leaves room for either).
  if (mid_.size() > kMidCapacity) {
    if (low_.size() < lower) {
      PushHeap<true>(mid_.front());
      mid_.erase(mid_.begin());
    } else {
      PushHeap<false>(mid_.back());
      mid_.pop_back();
    }
  }
  while (low_.size() > lower) {
    if (mid_.size() >= kMidCapacity) {
      PushHeap<false>(mid_.back());
      mid_.pop_back();
    }
    MidPushFront(PopTop<true>());
  }
  while (low_.size() + mid_.size() <= upper) {
    if (mid_.size() >= kMidCapacity) {
      PushHeap<true>(mid_.front());
      mid_.erase(mid_.begin());
    }
    MidPushBack(PopTop<false>());
  }
}

void SlidingMedian::Insert(Entry e) {
  if (!low_.empty() && e.value <= low_[0].value) {
    PushHeap<true>(e);
  } else if (!high_.empty() && e.value >= high_[0].value) {
    PushHeap<false>(e);
  } else {
    MidInsert(e);
  }
  Rebalance();
}

void SlidingMedian::RemoveSlot(const Slot& where, size_t slot) {
  if (where.part == kInLow) {
    RemoveAt<true>(static_cast<size_t>(where.pos));
  } else if (where.part == kInHigh) {
    RemoveAt<false>(static_cast<size_t>(where.pos));
  } else {
    for (size_t i = 0; i < mid_.size(); ++i) {
      if (static_cast<size_t>(mid_[i].slot) == slot) {
        mid_.erase(mid_.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
  }
}

void SlidingMedian::PopOldest() {
  if (sorted_form_) {
    double* const a = sorted_.data();
    const size_t p = LowerBound(values_[head_]);
    std::copy(a + p + 1, a + count_, a + p);
    head_ = Wrap(head_ + 1);
    --count_;
    return;
  }
  RemoveSlot(ring_[head_], head_);
  Rebalance();
  head_ = Wrap(head_ + 1);
  --count_;
}

void SlidingMedian::EvictBefore(int64_t min_step, size_t keep_at_least) {
  while (count_ > keep_at_least && ring_[head_].step < min_step) PopOldest();
}

void SlidingMedian::ReplaceOldest(int64_t step, double value) {
  if (sorted_form_) {
    const double old_value = values_[head_];
    const size_t slot = Wrap(head_ + count_);
    head_ = Wrap(head_ + 1);
    ring_[slot].step = step;
    values_[slot] = value;
    SortedReplace(old_value, value);
    return;
  }
  // The new sample goes to the ring's tail (the oldest's own slot when the
  // ring is full). When it belongs to the heap that holds the oldest, it
  // takes the oldest's position there: one repair, and no part changes size.
  const size_t old_slot = head_;
  const Slot oldest = ring_[old_slot];
  const Entry e{value, static_cast<int32_t>(Wrap(head_ + count_))};
  head_ = Wrap(head_ + 1);
  ring_[e.slot].step = step;
  const size_t pos = static_cast<size_t>(oldest.pos);
  if (oldest.part == kInLow && value <= low_[0].value) {
    Place<true>(pos, e);
    Repair<true>(pos);
  } else if (oldest.part == kInHigh && value >= high_[0].value) {
    Place<false>(pos, e);
    Repair<false>(pos);
  } else {
    RemoveSlot(oldest, old_slot);
    Insert(e);
  }
}

void SlidingMedian::PushAndEvict(int64_t step, double value, int64_t min_step,
                                 size_t keep_at_least) {
  if (ring_.empty()) return;
  if (count_ > 0 && ((ring_[head_].step < min_step && count_ >= keep_at_least) ||
                     count_ == ring_.size())) {
    ReplaceOldest(step, value);
  } else {
    Push(step, value);
  }
  EvictBefore(min_step, keep_at_least);
}

void SlidingMedian::Push(int64_t step, double value) {
  if (ring_.empty()) return;
  if (count_ == ring_.size()) {
    ReplaceOldest(step, value);
    return;
  }
  const size_t slot = Wrap(head_ + count_);
  ring_[slot].step = step;
  if (sorted_form_) {
    values_[slot] = value;
    double* const a = sorted_.data();
    const size_t q = LowerBound(value);
    std::copy_backward(a + q, a + count_, a + count_ + 1);
    a[q] = value;
    ++count_;
    return;
  }
  ++count_;
  Insert(Entry{value, static_cast<int32_t>(slot)});
}

double SlidingMedian::Median() const {
  if (count_ == 0) return kNaN;
  const size_t m = count_ / 2;
  if (sorted_form_) {
    if (count_ % 2) return sorted_[m];
    return 0.5 * (sorted_[m - 1] + sorted_[m]);
  }
  const size_t base = low_.size();
  if (count_ % 2) return mid_[m - base].value;
  return 0.5 * (mid_[m - 1 - base].value + mid_[m - base].value);
}

// ------------------------------------------------------------------ SlidingMin

SlidingMin::SlidingMin(int64_t window_steps)
    : ring_(static_cast<size_t>(window_steps) + 1) {}

void SlidingMin::Push(int64_t step, double value) {
  // Entries behind a smaller or equal newer value can never be the minimum
  // again: drop them from the back.
  while (count_ > 0) {
    if (ring_[Wrap(head_ + count_ - 1)].value < value) break;
    --count_;
  }
  if (count_ == ring_.size()) {  // only when steps span more than the window
    head_ = Wrap(head_ + 1);
    --count_;
  }
  ring_[Wrap(head_ + count_)] = Entry{step, value};
  ++count_;
}

double SlidingMin::MinSince(int64_t min_step) {
  while (count_ > 0 && ring_[head_].step < min_step) {
    head_ = Wrap(head_ + 1);
    --count_;
  }
  return count_ ? ring_[head_].value : kNaN;
}

// ---------------------------------------------------------------- BucketSeries

BucketSeries::BucketSeries(int64_t width_steps, size_t capacity)
    : width_(width_steps), ring_(capacity) {}

void BucketSeries::Add(int64_t step, double value) {
  // Most samples fall in the newest bucket: a multiply tells, and the
  // newest bucket's slot is kept, so that case has no division (two per
  // sample were a twentieth of the engine's time).
  if (newest_ >= 0 && step < (newest_ + 1) * width_) {
    AddTo(ring_[newest_slot_], value);
    return;
  }
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
  newest_slot_ = static_cast<size_t>(newest_ % static_cast<int64_t>(cap));
  AddTo(ring_[newest_slot_], value);
}

void BucketSeries::AddTo(Bucket& b, double value) {
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
