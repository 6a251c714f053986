// Windowed statistics over a stream of (step, value) samples, the health math
// under the rule engine. Every structure here has a fixed capacity chosen at
// construction and never allocates afterwards, so a run state's memory is
// known up front and the per-step cost has no allocator in it.
//
// Windows are measured in steps, not samples: a log that reports every K
// steps gets the same time horizons as one that reports every step. Steps fed
// to one structure must be strictly increasing; callers check that once, at
// the engine's entry.
//
// None of these classes is thread-safe; a run state is owned by one thread.

#ifndef TRAINWATCH_CORE_WINDOWS_H_
#define TRAINWATCH_CORE_WINDOWS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace trainwatch::core {

// Reads and writes the private state of these classes for the engine's
// snapshots (core/src/engine_state_codec.cc), so that a restored window is
// the same object, bit for bit, as the one that lived the history.
struct StateCodec;

// An exponentially weighted mean with a span in steps, bias-corrected so that
// it is meaningful from the first sample: after samples x_k at steps s_k, the
// value is sum_k w_k x_k / sum_k w_k with w_k = (1 - a)^(s_last - s_k) and
// a = 2 / (span + 1). With one sample per step this is the usual EMA once the
// first few hundred steps are past; with gaps between samples the decay
// follows the steps, not the sample count, down to a floor: the mean spans
// at least `min_span_samples` samples, so that a log written every 500 steps
// is not averaged over two records by a 1,000-step span.
class DecayingMean {
  friend struct StateCodec;

 public:
  explicit DecayingMean(double span_steps, double min_span_samples = 0);

  // REQUIRES: step > the step of the previous Add(). Inline, as Value(): the
  // engine calls them about ten times a step, and the call was most of
  // their cost.
  void Add(int64_t step, double value) {
    if (count_ > 0) {
      // One step is by far the common case; exp(log) only for gaps.
      const int64_t gap = step - last_step_;
      const double d = gap == 1 ? keep_ : DecayOver(gap);
      num_ *= d;
      den_ *= d;
    }
    num_ += value;
    den_ += 1.0;
    last_step_ = step;
    ++count_;
  }
  // NaN while empty.
  double Value() const {
    return count_ ? num_ / den_ : std::numeric_limits<double>::quiet_NaN();
  }
  bool empty() const { return count_ == 0; }
  int64_t count() const { return count_; }
  int64_t last_step() const { return last_step_; }

 private:
  // (1 - a)^gap for a gap of more than one step.
  double DecayOver(int64_t gap) const;

  double keep_;       // 1 - a
  double log_keep_;   // log(1 - a), for gaps longer than one step
  double min_keep_;   // the least decay over one gap: 1 - 2 / (min_span_samples + 1)
  double num_ = 0.0;  // sum of w_k x_k
  double den_ = 0.0;  // sum of w_k
  int64_t last_step_ = 0;
  int64_t count_ = 0;
};

// The median of the samples whose step lies in [now - window, now), in
// O(1) expected per update for a stream of values that wander slowly against
// the window. The live values are split three ways: a max-heap of the
// lowest, a short sorted run around the middle ranks, and a min-heap of the
// highest, over a ring of slots that records where each sample is, so that
// the oldest can be removed from the middle of a heap by its position.
// Invariants between calls: every live sample is in exactly one part; every
// value in low_ is <= every value in mid_, which is sorted, and every value
// in mid_ is <= every value in high_; and both middle ranks, (n - 1) / 2 and
// n / 2, fall inside mid_ (low_.size() <= (n - 1) / 2 < n / 2 < low_.size() +
// mid_.size()).
//
// Why the run in the middle: with two halves and no run, every other sample
// crosses from one half to the other, and a crossing moves a top through
// both heaps, twice their depth (a 5,000-step grad-norm window, every step:
// the rule engine's hottest loop). With the run, a sample entering or
// leaving a heap mostly stays near its leaves, and the run is refilled from a
// heap's top only when the middle ranks walk off one of its ends.
//
// The heaps hold the values themselves beside their slot numbers, so a sift
// compares adjacent heap entries instead of chasing each into the ring. The
// median depends only on the multiset of live values, never on the parts'
// layout, so it is the same bit for bit whatever the order of repairs.
//
// A window of at most kSortedMaxWindow samples keeps its live values in one
// sorted array instead: a replacement is two branch-free binary searches and
// one shift of the entries between the old value and the new one, and the
// median is read from the middle. For a few dozen values that is cheaper
// than the heaps' sifts, whose comparisons the branch predictor loses; the
// medians are the same, since both depend on the multiset alone.
class SlidingMedian {
  friend struct StateCodec;

 public:
  // Holds at most `window_steps` samples: with strictly increasing integer
  // steps no more can fall inside the window.
  explicit SlidingMedian(int64_t window_steps);

  // The largest window kept as a sorted array rather than as two heaps.
  static constexpr int64_t kSortedMaxWindow = 128;

  // Drops the samples with step < min_step, but keeps the newest
  // `keep_at_least` (a sparse log's window still holds that many).
  void EvictBefore(int64_t min_step, size_t keep_at_least = 0);
  // REQUIRES: value is finite; step > the previous Push()'s step. When the
  // ring is full the oldest sample is dropped first.
  void Push(int64_t step, double value);
  // Push() and EvictBefore(min_step) in one: when the oldest sample is due
  // for eviction, the new one takes its slot and is sifted from there (one
  // heap repair instead of a removal and an insertion: the steady state of a
  // per-step stream).
  void PushAndEvict(int64_t step, double value, int64_t min_step, size_t keep_at_least = 0);
  // The median of the live samples (mean of the two middle ones for an even
  // count); NaN when empty.
  double Median() const;
  size_t size() const { return count_; }
  int64_t window_steps() const { return window_; }
  // Bytes held, for the memory report.
  size_t MemoryBytes() const;

 private:
  enum Part : uint8_t { kInLow = 0, kInMid = 1, kInHigh = 2 };
  struct Slot {
    int64_t step;
    int32_t pos;  // index inside its heap; not kept for kInMid
    uint8_t part;
  };
  struct Entry {
    double value;
    int32_t slot;  // its ring slot
  };

  // i mod the ring's size for i < 2 * size: a compare instead of a division.
  size_t Wrap(size_t i) const { return i >= ring_.size() ? i - ring_.size() : i; }
  // The most samples the middle run holds between calls.
  static constexpr size_t kMidCapacity = 32;

  void PopOldest();
  // Removes a live heap-form sample, leaving the parts unbalanced.
  void RemoveSlot(const Slot& where, size_t slot);
  void MidInsert(Entry e);
  void MidPushFront(Entry e);
  void MidPushBack(Entry e);
  void ReplaceOldest(int64_t step, double value);
  // The sorted array's primitives, over its first count_ entries.
  size_t LowerBound(double value) const;
  void SortedReplace(double old_value, double value);
  void Insert(Entry e);
  void Rebalance();
  // Heap primitives; kLow selects the max-heap of the lower half.
  template <bool kLow>
  std::vector<Entry>& Heap() { return kLow ? low_ : high_; }
  template <bool kLow>
  void Place(size_t pos, Entry e);
  template <bool kLow>
  void SiftUp(size_t pos);
  template <bool kLow>
  void SiftDown(size_t pos);
  // Up then down: for an entry whose value changed in place.
  template <bool kLow>
  void Repair(size_t pos);
  template <bool kLow>
  void RemoveAt(size_t pos);
  template <bool kLow>
  Entry PopTop();
  template <bool kLow>
  void PushHeap(Entry e);

  int64_t window_;
  std::vector<Slot> ring_;
  size_t head_ = 0;   // oldest live slot
  size_t count_ = 0;
  std::vector<Entry> low_;
  std::vector<Entry> mid_;
  std::vector<Entry> high_;
  // The sorted form (window_ <= kSortedMaxWindow): each ring slot's value,
  // and the live values in ascending order. The heaps stay empty.
  bool sorted_form_;
  std::vector<double> values_;
  std::vector<double> sorted_;
};

// Minimum of the samples whose step lies in [now - window, now], by a
// monotonic deque over a fixed ring: O(1) amortised per sample.
class SlidingMin {
  friend struct StateCodec;

 public:
  explicit SlidingMin(int64_t window_steps);

  // REQUIRES: step > the previous Push()'s step; value finite.
  void Push(int64_t step, double value);
  // Minimum over samples with step >= min_step; NaN if there are none.
  double MinSince(int64_t min_step);
  // Step of the oldest sample still held (for "is the window full" checks);
  // -1 when empty.
  int64_t oldest_step() const { return count_ ? ring_[head_].step : -1; }

 private:
  struct Entry {
    int64_t step;
    double value;
  };
  // i mod the ring's size for i < 2 * size: a compare instead of a division.
  size_t Wrap(size_t i) const { return i >= ring_.size() ? i - ring_.size() : i; }
  std::vector<Entry> ring_;
  size_t head_ = 0;
  size_t count_ = 0;
  int64_t first_step_seen_ = -1;
};

// Per-bucket aggregates of a signal, bucket b covering steps
// [b * width, (b + 1) * width), for the last `capacity` buckets. Used for
// trends (is log_z rising for 5,000 steps?) and for locating where a rise
// began, at a cost of one add per sample.
class BucketSeries {
  friend struct StateCodec;

 public:
  struct Bucket {
    int64_t index = -1;  // -1: never filled
    int64_t count = 0;
    double sum = 0.0;
    double min = 0.0;
    double max = 0.0;
    double mean() const { return count ? sum / count : 0.0; }
    int64_t first_step(int64_t width) const { return index * width; }
  };

  BucketSeries(int64_t width_steps, size_t capacity);

  // REQUIRES: value finite, step non-decreasing across calls.
  void Add(int64_t step, double value);
  // The bucket `back` places before the newest one (0 = newest). Returns a
  // bucket with index -1 past the held history. Buckets with no samples in
  // between are held as count == 0.
  const Bucket& Back(size_t back) const;
  int64_t width() const { return width_; }
  size_t capacity() const { return ring_.size(); }
  // Index of the newest bucket, -1 when nothing was added yet.
  int64_t newest_index() const { return newest_; }

 private:
  static void AddTo(Bucket& b, double value);

  int64_t width_;
  std::vector<Bucket> ring_;
  int64_t newest_ = -1;
  // ring_ index of bucket newest_ (newest_ mod capacity), kept so that a
  // sample in the newest bucket costs no division; not in the snapshot,
  // which restores it from newest_.
  size_t newest_slot_ = 0;
  Bucket none_;
};

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_WINDOWS_H_
