#include "latency_histogram.h"

#include <algorithm>
#include <cmath>

namespace trainwatch::bench {

LatencyHistogram::LatencyHistogram() {
  for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
}

int LatencyHistogram::BucketOf(int64_t nanos) {
  const uint64_t v = static_cast<uint64_t>(nanos);
  if (v < static_cast<uint64_t>(kSubBuckets)) return static_cast<int>(v);
  const int exponent = 63 - __builtin_clzll(v);  // >= kSubBucketBits
  const int sub =
      static_cast<int>((v >> (exponent - kSubBucketBits)) & (kSubBuckets - 1));
  return (exponent - kSubBucketBits + 1) * kSubBuckets + sub;
}

int64_t LatencyHistogram::ValueOf(int bucket) {
  if (bucket < kSubBuckets) return bucket;
  const int exponent = bucket / kSubBuckets + kSubBucketBits - 1;
  const int sub = bucket % kSubBuckets;
  const int shift = exponent - kSubBucketBits;
  const uint64_t lower = static_cast<uint64_t>(kSubBuckets + sub) << shift;
  const uint64_t width = uint64_t{1} << shift;
  return static_cast<int64_t>(lower + (width - 1) / 2);
}

void LatencyHistogram::Record(int64_t nanos) {
  if (nanos < 0) nanos = 0;
  counts_[BucketOf(nanos)].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(nanos, std::memory_order_relaxed);
  int64_t seen = max_.load(std::memory_order_relaxed);
  while (nanos > seen &&
         !max_.compare_exchange_weak(seen, nanos, std::memory_order_relaxed)) {
  }
}

int64_t LatencyHistogram::Quantile(double q) const {
  const uint64_t total = count_.load(std::memory_order_relaxed);
  if (total == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  const uint64_t rank = std::max<uint64_t>(
      1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(total))));
  uint64_t seen = 0;
  const int64_t max = max_.load(std::memory_order_relaxed);
  for (int b = 0; b < kNumBuckets; ++b) {
    seen += counts_[b].load(std::memory_order_relaxed);
    if (seen >= rank) return std::min(ValueOf(b), max);
  }
  return max;
}

LatencySummary LatencyHistogram::Summarize() const {
  LatencySummary s;
  s.count = count_.load(std::memory_order_relaxed);
  if (s.count == 0) return s;
  s.p50 = Quantile(0.50);
  s.p90 = Quantile(0.90);
  s.p99 = Quantile(0.99);
  s.max = max_.load(std::memory_order_relaxed);
  s.mean = static_cast<double>(sum_.load(std::memory_order_relaxed)) /
           static_cast<double>(s.count);
  return s;
}

}  // namespace trainwatch::bench
