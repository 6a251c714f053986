// A log-linear histogram of durations, for ack latencies.
//
// Thread-safe: Record() may be called from any number of threads at once
// (relaxed atomics; a reader sees every completed Record() once the writers
// have been joined or otherwise synchronised with). Memory is fixed (about
// 30 KiB) whatever the number of samples.
//
// Values below 64 ns are exact; above that each power of two is split into 64
// buckets, so a reported percentile is within 1/64 (1.6 %) of the true
// sample. The maximum is exact.

#ifndef TRAINWATCH_BENCH_INGEST_LATENCY_HISTOGRAM_H_
#define TRAINWATCH_BENCH_INGEST_LATENCY_HISTOGRAM_H_

#include <array>
#include <atomic>
#include <cstdint>

namespace trainwatch::bench {

struct LatencySummary {
  uint64_t count = 0;
  // All in nanoseconds; zero when count is zero.
  int64_t p50 = 0;
  int64_t p90 = 0;
  int64_t p99 = 0;
  int64_t max = 0;
  double mean = 0;
};

class LatencyHistogram {
 public:
  LatencyHistogram();
  LatencyHistogram(const LatencyHistogram&) = delete;
  LatencyHistogram& operator=(const LatencyHistogram&) = delete;

  // Adds one sample. Negative values (a clock step) count as zero.
  void Record(int64_t nanos);

  // The value at quantile q in [0, 1]: the smallest recorded value v such
  // that at least q of the samples are <= v, up to the bucket resolution.
  int64_t Quantile(double q) const;

  LatencySummary Summarize() const;

 private:
  static constexpr int kSubBucketBits = 6;
  static constexpr int kSubBuckets = 1 << kSubBucketBits;
  // Covers every non-negative int64: exponents 6..62 plus the exact range.
  static constexpr int kNumBuckets = (63 - kSubBucketBits + 1) * kSubBuckets;

  static int BucketOf(int64_t nanos);
  // A representative value of the bucket (its midpoint).
  static int64_t ValueOf(int bucket);

  std::array<std::atomic<uint64_t>, kNumBuckets> counts_;
  std::atomic<uint64_t> count_{0};
  std::atomic<int64_t> max_{0};
  // Sum in nanoseconds; 2^63 ns is 292 years of summed latency.
  std::atomic<int64_t> sum_{0};
};

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_LATENCY_HISTOGRAM_H_
