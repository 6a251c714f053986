// LogitStatsGpu: log Z per row and its sum over the rows counted, on the
// trainer's stream (the shared row machinery is in logsumexp_cuda.cuh).

#include <cstring>
#include <string>

#include "logsumexp_cuda.cuh"
#include "trainwatch/kernels/cuda.h"

namespace trainwatch::kernels {
namespace internal {
namespace {

struct LogitResultDev {
  double sum_log_z;
  unsigned long long rows_counted;
  unsigned long long nonfinite_rows;
  double max_logit;
};

// ---- logit stats

template <int D>
__global__ void __launch_bounds__(kRowThreads, kRowMinBlocksPerSm)
    RowLogZKernel(const char* __restrict__ base, int64_t rows, int64_t vocab,
                  int64_t stride_bytes, const int32_t* __restrict__ labels,
                  int32_t ignore_index, const uint8_t* __restrict__ row_mask,
                  double* __restrict__ ws_log_z, float* __restrict__ ws_max,
                  float* __restrict__ user_log_z) {
  __shared__ Lse scratch[kRowWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (!RowCounted(labels, ignore_index, row_mask, r)) {
      if (threadIdx.x == 0 && user_log_z != nullptr) user_log_z[r] = nanf("");
      continue;
    }
    float row_max;
    const double log_z =
        BlockRowLogZ<D>(base + r * stride_bytes, vocab, scratch, &row_max);
    if (threadIdx.x == 0) {
      ws_log_z[r] = log_z;
      ws_max[r] = row_max;
      if (user_log_z != nullptr) user_log_z[r] = static_cast<float>(log_z);
    }
  }
}

// splits == 1: the rows' log Z and max are in ws_log_z / ws_max (and
// user_log_z is written); splits > 1: merged here from the chunks' partials.
__global__ void __launch_bounds__(kFinalThreads) LogitFinalizeKernel(
    const double* __restrict__ ws_log_z, const float* __restrict__ ws_max,
    const ChunkPartial* __restrict__ part, int64_t splits, int64_t rows,
    const int32_t* __restrict__ labels, int32_t ignore_index,
    const uint8_t* __restrict__ row_mask, float* __restrict__ user_log_z,
    LogitResultDev* __restrict__ out) {
  __shared__ double s_sum[kFinalThreads / 32];
  __shared__ unsigned long long s_cnt[kFinalThreads / 32];
  __shared__ float s_max[kFinalThreads / 32];
  double sum = 0.0;
  unsigned long long counted = 0, bad = 0;
  float mx = NegInf();
  for (int64_t r = threadIdx.x; r < rows; r += kFinalThreads) {
    if (!RowCounted(labels, ignore_index, row_mask, r)) {
      if (splits > 1 && user_log_z != nullptr) user_log_z[r] = nanf("");
      continue;
    }
    ++counted;
    double lz;
    float row_max;
    if (splits > 1) {
      const ChunkLse c = MergeRow(part, r, splits);
      lz = LogZOf(c);
      row_max = c.lse.m;
      if (user_log_z != nullptr) user_log_z[r] = static_cast<float>(lz);
    } else {
      lz = ws_log_z[r];
      row_max = ws_max[r];
    }
    if (isfinite(lz)) {
      sum += lz;
    } else {
      ++bad;
    }
    mx = fmaxf(mx, row_max);
  }
  const auto add = [](auto x, auto y) { return x + y; };
  const auto warp_ull = [](unsigned long long v) { return WarpSum(v); };
  sum = BlockReduce<kFinalThreads>(
      sum, 0.0, s_sum, [](double v) { return WarpSum(v); }, add);
  counted = BlockReduce<kFinalThreads>(counted, 0ull, s_cnt, warp_ull, add);
  bad = BlockReduce<kFinalThreads>(bad, 0ull, s_cnt, warp_ull, add);
  mx = BlockReduce<kFinalThreads>(
      mx, NegInf(), s_max, [](float v) { return WarpMax(v); },
      [](float x, float y) { return fmaxf(x, y); });
  if (threadIdx.x == 0) {
    out->sum_log_z = sum;
    out->rows_counted = counted;
    out->nonfinite_rows = bad;
    out->max_logit = mx;
  }
}

}  // namespace
}  // namespace internal

// ------------------------------------------------------------ LogitStatsGpu

struct LogitStatsGpu::Impl {
  int64_t max_rows = 0;
  int sm_count = 1;
  internal::DeviceArray<double> ws_log_z;
  internal::DeviceArray<float> ws_max;
  internal::DeviceArray<internal::ChunkPartial> ws_part;
  internal::DeviceArray<internal::LogitResultDev> d_result;
  internal::PinnedArray<internal::LogitResultDev> h_result;
};

LogitStatsGpu::LogitStatsGpu(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
LogitStatsGpu::~LogitStatsGpu() = default;

Status LogitStatsGpu::Create(int64_t max_rows,
                             std::unique_ptr<LogitStatsGpu>* out) {
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::CheckCreate(max_rows, out));
  auto impl = std::make_unique<Impl>();
  impl->max_rows = max_rows;
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::SmCount(&impl->sm_count));
  const size_t n = static_cast<size_t>(max_rows);
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_log_z.Allocate(n, "row log Z"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_max.Allocate(n, "row max"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_part.Allocate(
      static_cast<size_t>(internal::SplitCapacity(impl->sm_count)),
      "chunk partials"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->d_result.Allocate(1, "result"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(
      impl->h_result.Allocate(1, "pinned result"));
  std::memset(impl->h_result.get(), 0, sizeof(internal::LogitResultDev));
  out->reset(new LogitStatsGpu(std::move(impl)));
  return OkStatus();
}

Status LogitStatsGpu::Launch(const LogitsView& logits,
                             const LogitStatsOptions& options,
                             cudaStream_t stream) {
  Impl& m = *impl_;
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::CheckRows(logits, m.max_rows));
  const int esize = static_cast<int>(DTypeSize(logits.dtype));
  const int64_t stride_bytes = logits.stride() * esize;
  const char* base = static_cast<const char*>(logits.data);
  const internal::Split sp =
      internal::SplitFor(logits.rows, logits.vocab, m.sm_count, esize);
  if (logits.rows > 0) {
    if (sp.splits == 1) {
      const unsigned grid = internal::GridFor(logits.rows);
      internal::ForDType(logits.dtype, [&](auto d) {
        internal::RowLogZKernel<decltype(d)::value><<<grid, internal::kRowThreads, 0, stream>>>(
            base, logits.rows, logits.vocab, stride_bytes, options.labels, options.ignore_index,
            options.row_mask, m.ws_log_z.get(), m.ws_max.get(), options.row_log_z);
      });
    } else {
      const unsigned grid = internal::GridFor(logits.rows * sp.splits);
      internal::ForDType(logits.dtype, [&](auto d) {
        internal::ChunkLseKernel<decltype(d)::value><<<grid, internal::kRowThreads, 0, stream>>>(
            base, logits.rows, logits.vocab, stride_bytes, sp.splits, sp.chunk, options.labels,
            options.ignore_index, options.row_mask, m.ws_part.get(), nullptr);
      });
    }
  }
  internal::LogitFinalizeKernel<<<1, internal::kFinalThreads, 0, stream>>>(
      m.ws_log_z.get(), m.ws_max.get(), m.ws_part.get(), sp.splits, logits.rows, options.labels,
      options.ignore_index, options.row_mask, options.row_log_z, m.d_result.get());
  return internal::CudaError(cudaGetLastError(), "logit stats launch");
}

Status LogitStatsGpu::ReadbackAsync(cudaStream_t stream) {
  return internal::CudaError(
      cudaMemcpyAsync(impl_->h_result.get(), impl_->d_result.get(),
                      sizeof(internal::LogitResultDev), cudaMemcpyDeviceToHost,
                      stream),
      "logit stats readback");
}

Status LogitStatsGpu::Result(LogitStats* out) const {
  return ResultFrom(impl_->h_result.get(), out);
}

const void* LogitStatsGpu::device_result() const {
  return impl_->d_result.get();
}

size_t LogitStatsGpu::result_bytes() {
  return sizeof(internal::LogitResultDev);
}

Status LogitStatsGpu::ResultFrom(const void* host_copy, LogitStats* out) {
  if (out == nullptr || host_copy == nullptr) {
    return InvalidArgumentError("out or host_copy is null");
  }
  internal::LogitResultDev r;
  std::memcpy(&r, host_copy, sizeof r);
  out->sum_log_z = r.sum_log_z;
  out->rows_counted = static_cast<int64_t>(r.rows_counted);
  out->nonfinite_rows = static_cast<int64_t>(r.nonfinite_rows);
  out->max_logit = r.max_logit;
  return OkStatus();
}

Status ComputeLogitStatsGpu(const LogitsView& logits,
                            const LogitStatsOptions& options,
                            cudaStream_t stream, LogitStats* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateLogitsView(logits));
  std::unique_ptr<LogitStatsGpu> ws;
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(LogitStatsGpu::Create(logits.rows, &ws));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ws->Launch(logits, options, stream));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ws->ReadbackAsync(stream));
  TRAINWATCH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "synchronize");
  return ws->Result(out);
}

}  // namespace trainwatch::kernels
