// CPU grad stats throughput on 256 MB of gradients, against a plain sum over
// the same bytes measured in the same run and the same iterations.
//
// The baseline is a single-threaded sum of the buffer as 64-bit words with
// four independent accumulators: nothing but loads and integer adds, so it
// runs at the memory's read bandwidth. The goal is grad stats >= 80% of it
// (counter "vs_plain_sum" >= 0.8) for fp32 and bf16.
//
// Each BM_GradStats iteration times the plain sum and then the grad stats on
// the same buffer; the benchmark's own time is the grad stats' (manual time),
// and the counters carry both bandwidths and their ratio.

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "trainwatch/kernels/grad_stats.h"
#include "trainwatch/kernels/half.h"
#include "trainwatch/kernels/tensor_view.h"

namespace {

using trainwatch::kernels::CpuPath;
using trainwatch::kernels::DType;
using trainwatch::kernels::GradStats;
using trainwatch::kernels::GradStatsOptions;
using trainwatch::kernels::TensorView;

constexpr size_t kBytes = size_t{256} << 20;

struct Buffer {
  explicit Buffer(DType dtype) : dtype(dtype) {
    data.reset(static_cast<char*>(std::aligned_alloc(64, kBytes)));
    uint64_t s = 0x1234567 + static_cast<uint64_t>(dtype);
    const size_t esize = trainwatch::kernels::DTypeSize(dtype);
    const size_t n = kBytes / esize;
    for (size_t i = 0; i < n; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      // Roughly normal-sized gradients around 1e-3.
      const float f =
          (static_cast<float>(static_cast<int32_t>(s >> 32)) / 2147483648.0f) *
          1e-3f;
      if (dtype == DType::kFloat32) {
        std::memcpy(data.get() + i * 4, &f, 4);
      } else {
        const uint16_t h = dtype == DType::kBFloat16
                               ? trainwatch::kernels::FloatToBFloat16Bits(f)
                               : trainwatch::kernels::FloatToHalfBits(f);
        std::memcpy(data.get() + i * 2, &h, 2);
      }
    }
  }
  TensorView view() const {
    return TensorView{
        data.get(), dtype,
        static_cast<int64_t>(kBytes / trainwatch::kernels::DTypeSize(dtype))};
  }
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data;
  DType dtype;
};

const Buffer& GetBuffer(DType dtype) {
  static const Buffer f32(DType::kFloat32);
  static const Buffer bf16(DType::kBFloat16);
  static const Buffer f16(DType::kFloat16);
  switch (dtype) {
    case DType::kFloat32:
      return f32;
    case DType::kBFloat16:
      return bf16;
    default:
      return f16;
  }
}

// The baseline. noinline so that it is measured as written.
__attribute__((noinline)) uint64_t PlainWordSum(const void* data,
                                                size_t bytes) {
  const uint64_t* p = static_cast<const uint64_t*>(data);
  const uint64_t* const end = p + bytes / 8;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (; end - p >= 4; p += 4) {
    s0 += p[0];
    s1 += p[1];
    s2 += p[2];
    s3 += p[3];
  }
  while (p < end) s0 += *p++;
  return s0 + s1 + s2 + s3;
}

void BM_PlainSum(benchmark::State& state) {
  const Buffer& b = GetBuffer(DType::kFloat32);
  for (auto _ : state) {
    benchmark::DoNotOptimize(PlainWordSum(b.data.get(), kBytes));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kBytes);
}
BENCHMARK(BM_PlainSum)->Unit(benchmark::kMillisecond);

void BM_GradStats(benchmark::State& state) {
  const DType dtype = static_cast<DType>(state.range(0));
  const CpuPath path = static_cast<CpuPath>(state.range(1));
  if (!trainwatch::kernels::CpuPathSupported(path)) {
    state.SkipWithError("CPU path not supported here");
    return;
  }
  const Buffer& b = GetBuffer(dtype);
  const TensorView view = b.view();
  GradStatsOptions options;
  options.cpu_path = path;
  GradStats stats;
  double plain_s = 0, stats_s = 0;
  using Clock = std::chrono::steady_clock;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    benchmark::DoNotOptimize(PlainWordSum(b.data.get(), kBytes));
    const auto t1 = Clock::now();
    if (!trainwatch::kernels::ComputeGradStats(&view, 1, options, &stats)
             .ok()) {
      state.SkipWithError("ComputeGradStats failed");
      return;
    }
    benchmark::DoNotOptimize(stats.sum_squares);
    const auto t2 = Clock::now();
    const double p = std::chrono::duration<double>(t1 - t0).count();
    const double g = std::chrono::duration<double>(t2 - t1).count();
    plain_s += p;
    stats_s += g;
    state.SetIterationTime(g);
  }
  const double n = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kBytes);
  state.counters["stats_GB/s"] = kBytes * n / stats_s / 1e9;
  state.counters["plain_sum_GB/s"] = kBytes * n / plain_s / 1e9;
  state.counters["vs_plain_sum"] = plain_s / stats_s;
  state.SetLabel(
      std::string(trainwatch::kernels::DTypeName(dtype)) + " " +
      trainwatch::kernels::CpuPathName(
          path == CpuPath::kAuto ? trainwatch::kernels::BestCpuPath() : path));
}
BENCHMARK(BM_GradStats)
    ->ArgNames({"dtype", "path"})
    ->Args({static_cast<int>(DType::kFloat32),
            static_cast<int>(CpuPath::kAuto)})
    ->Args({static_cast<int>(DType::kBFloat16),
            static_cast<int>(CpuPath::kAuto)})
    ->Args({static_cast<int>(DType::kFloat16),
            static_cast<int>(CpuPath::kAuto)})
    ->Args({static_cast<int>(DType::kFloat32),
            static_cast<int>(CpuPath::kPortable)})
    ->Args({static_cast<int>(DType::kBFloat16),
            static_cast<int>(CpuPath::kPortable)})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
