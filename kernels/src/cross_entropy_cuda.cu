// CrossEntropyGpu: cross-entropy with z-loss, its gradient in place or into
// a buffer of its own, and log Z, on the trainer's stream (the shared row
// machinery is in logsumexp_cuda.cuh).

#include <string>

#include "logsumexp_cuda.cuh"
#include "trainwatch/kernels/cuda.h"

namespace trainwatch::kernels {
namespace internal {
namespace {

struct CrossEntropyResultDev {
  double loss_sum;
  double z_loss_sum;
  double log_z_sum;
  unsigned long long rows_counted;
  unsigned long long invalid_labels;
};

// ---- cross entropy

template <int D>
__device__ __forceinline__ uint32_t FromFloat(float g) {
  if constexpr (D == kDTypeF32) {
    return __float_as_uint(g);
  } else if constexpr (D == kDTypeBf16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(g));
  } else {
    return __half_as_ushort(__float2half_rn(g));
  }
}

template <int D>
__device__ __forceinline__ void StoreBits(void* p, int64_t i, uint32_t bits) {
  if constexpr (D == kDTypeF32) {
    static_cast<uint32_t*>(p)[i] = bits;
  } else {
    static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(bits);
  }
}

template <int D>
__device__ __forceinline__ uint32_t GradWord(uint32_t w, int64_t j,
                                             const float lz, float coef,
                                             float one, int32_t y) {
  const auto g = [&](float u, int64_t jj) {
    return FromFloat<D>(FastExp2(SoftmaxExp2Arg(u, lz)) * coef -
                        (jj == y ? one : 0.0f));
  };
  if constexpr (D == kDTypeF32) {
    return g(__uint_as_float(w), j);
  } else {
    return g(ToFloat<D>(w & 0xffffu), j) | (g(ToFloat<D>(w >> 16), j + 1) << 16);
  }
}

// The gradient of elements [j0, j0 + n) of row r:
// g_j = (p_j * (1 + 2 alpha log Z) - [j == y]) * scale, p_j = exp(u_j - log Z).
// Each thread reads a logit and then writes its gradient in the same place,
// so grad_logits == logits (in place) is safe. Where the two rows have the
// same phase within a 16-byte line (always, for same-shaped buffers) a
// scalar head is peeled so that any row offset — vocab 50,257 in bf16 puts
// 7 rows in 8 off the 16-byte grid — takes the vector path.
template <int D>
__device__ __forceinline__ void GradSweep(const char* row, char* grow,
                                          int64_t j0, int64_t n, int32_t y,
                                          double log_z, double alpha,
                                          double grad_scale, bool valid) {
  constexpr int kEB = ElemBytes<D>();
  constexpr int kPerVec = 16 / kEB;
  const float lz = static_cast<float>(log_z);
  const float coef =
      valid ? static_cast<float>((1.0 + 2.0 * alpha * log_z) * grad_scale)
            : nanf("");
  const float one = static_cast<float>(grad_scale);
  const char* in = row + j0 * kEB;
  char* out = grow + j0 * kEB;
  const int32_t yl = y - static_cast<int32_t>(j0);  // y within the chunk
  const auto scalar = [&](int64_t i) {
    const float u = ToFloat<D>(LoadBits<D>(in, i));
    StoreBits<D>(out, i,
                 FromFloat<D>(FastExp2(SoftmaxExp2Arg(u, lz)) * coef -
                              (i == yl ? one : 0.0f)));
  };
  if (((reinterpret_cast<uintptr_t>(in) ^ reinterpret_cast<uintptr_t>(out)) &
       15) != 0) {
    for (int64_t i = threadIdx.x; i < n; i += kRowThreads) scalar(i);
    return;
  }
  const WalkShape shape =
      ShapeOfWalk(reinterpret_cast<uintptr_t>(out), n, kEB);
  const uint4* vin = reinterpret_cast<const uint4*>(in + shape.head * kEB);
  uint4* vout = reinterpret_cast<uint4*>(out + shape.head * kEB);
  constexpr int kWordElems = 4 / kEB;
  const auto convert = [&](const uint4& x, int64_t v) {
    const int64_t i0 = shape.head + v * kPerVec;
    return make_uint4(GradWord<D>(x.x, i0, lz, coef, one, yl),
                      GradWord<D>(x.y, i0 + kWordElems, lz, coef, one, yl),
                      GradWord<D>(x.z, i0 + 2 * kWordElems, lz, coef, one, yl),
                      GradWord<D>(x.w, i0 + 3 * kWordElems, lz, coef, one, yl));
  };
  constexpr int kUnroll = 2;
  WalkThread<kRowThreads, kUnroll>(
      shape, n, threadIdx.x, scalar,
      [&](int64_t v) {
        uint4 x[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) x[u] = __ldg(vin + v + u * kRowThreads);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          vout[v + u * kRowThreads] = convert(x[u], v + u * kRowThreads);
        }
      },
      [&](int64_t v) { vout[v] = convert(__ldg(vin + v), v); });
}

template <int D>
__device__ __forceinline__ void ZeroRow(char* grow, int64_t j0, int64_t n) {
  for (int64_t j = j0 + threadIdx.x; j < j0 + n; j += kRowThreads) {
    StoreBits<D>(grow, j, 0u);
  }
}

// The rows' sums, in a fixed order, by one block of kThreads threads. The
// per-row values are read through L2 (__ldcg): in a split launch they were
// written by other blocks of the same kernel.
template <int kThreads>
__device__ void CrossEntropyReduce(const double* ws_loss, const double* ws_z,
                                   const double* ws_log_z, int64_t rows,
                                   int64_t vocab, const int32_t* labels,
                                   int32_t ignore_index,
                                   CrossEntropyResultDev* out) {
  __shared__ double s_d[kThreads / 32];
  __shared__ unsigned long long s_u[kThreads / 32];
  double loss = 0.0, z = 0.0, lz = 0.0;
  unsigned long long counted = 0, invalid = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    const int32_t y = labels[r];
    if (y == ignore_index) continue;
    ++counted;
    if (y < 0 || y >= vocab) ++invalid;
    loss += __ldcg(ws_loss + r);
    z += __ldcg(ws_z + r);
    lz += __ldcg(ws_log_z + r);
  }
  const auto add = [](auto x, auto y) { return x + y; };
  const auto wd = [](double v) { return WarpSum(v); };
  const auto wu = [](unsigned long long v) { return WarpSum(v); };
  loss = BlockReduce<kThreads>(loss, 0.0, s_d, wd, add);
  z = BlockReduce<kThreads>(z, 0.0, s_d, wd, add);
  lz = BlockReduce<kThreads>(lz, 0.0, s_d, wd, add);
  counted = BlockReduce<kThreads>(counted, 0ull, s_u, wu, add);
  invalid = BlockReduce<kThreads>(invalid, 0ull, s_u, wu, add);
  if (threadIdx.x == 0) {
    out->loss_sum = loss;
    out->z_loss_sum = z;
    out->log_z_sum = lz;
    out->rows_counted = counted;
    out->invalid_labels = invalid;
  }
}

// Thread 0 of a row's (first) block: the row's loss and its parts.
__device__ __forceinline__ void StoreRowLoss(int64_t r, bool valid, float uy,
                                             double log_z, double alpha,
                                             double* ws_loss, double* ws_z,
                                             double* ws_log_z,
                                             float* user_row_loss) {
  const double z = alpha * log_z * log_z;
  const double loss = valid ? log_z - static_cast<double>(uy) + z : nan("");
  ws_loss[r] = loss;
  ws_z[r] = z;
  ws_log_z[r] = log_z;
  if (user_row_loss != nullptr) user_row_loss[r] = static_cast<float>(loss);
}

__device__ __forceinline__ void StoreIgnoredRow(int64_t r, double* ws_loss,
                                                double* ws_z, double* ws_log_z,
                                                float* user_row_loss) {
  ws_loss[r] = 0.0;
  ws_z[r] = 0.0;
  ws_log_z[r] = 0.0;
  if (user_row_loss != nullptr) user_row_loss[r] = 0.0f;
}

// One block per row: log Z, the loss, then the gradient sweep. `base` and
// `grad` may be the same memory (in place), so neither is __restrict__.
template <int D>
__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyKernel(const char* base, int64_t rows, int64_t vocab,
                       int64_t stride_bytes, const int32_t* __restrict__ labels,
                       int32_t ignore_index, double alpha, char* grad,
                       int64_t grad_stride_bytes, double grad_scale,
                       double* __restrict__ ws_loss, double* __restrict__ ws_z,
                       double* __restrict__ ws_log_z,
                       float* __restrict__ user_row_loss) {
  __shared__ Lse scratch[kRowWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t y = labels[r];
    char* grow = grad == nullptr ? nullptr : grad + r * grad_stride_bytes;
    if (y == ignore_index) {
      if (grow != nullptr) ZeroRow<D>(grow, 0, vocab);
      if (threadIdx.x == 0) {
        StoreIgnoredRow(r, ws_loss, ws_z, ws_log_z, user_row_loss);
      }
      continue;
    }
    const bool valid = y >= 0 && y < vocab;
    const char* row = base + r * stride_bytes;
    // Read before the barriers in BlockRowLogZ: once they are passed, other
    // threads overwrite the row when the gradient is in place.
    float uy = 0.0f;
    if (threadIdx.x == 0 && valid) uy = ToFloat<D>(LoadBits<D>(row, y));
    float row_max;
    const double log_z = BlockRowLogZ<D>(row, vocab, scratch, &row_max);
    if (threadIdx.x == 0) {
      StoreRowLoss(r, valid, uy, log_z, alpha, ws_loss, ws_z, ws_log_z,
                   user_row_loss);
    }
    if (grow == nullptr) continue;
    GradSweep<D>(row, grow, 0, vocab, y, log_z, alpha, grad_scale, valid);
  }
}

__global__ void __launch_bounds__(kFinalThreads) CrossEntropyFinalizeKernel(
    const double* __restrict__ ws_loss, const double* __restrict__ ws_z,
    const double* __restrict__ ws_log_z, int64_t rows, int64_t vocab,
    const int32_t* __restrict__ labels, int32_t ignore_index,
    CrossEntropyResultDev* __restrict__ out) {
  CrossEntropyReduce<kFinalThreads>(ws_loss, ws_z, ws_log_z, rows, vocab,
                                    labels, ignore_index, out);
}

// Kernel 2 of a split launch: block b merges the partials of row
// b / splits, writes the gradient of its chunk, and the row's first chunk
// its loss; the last block to finish (an integer ticket, so no float
// atomics) sums the rows in a fixed order and rearms the ticket.
template <int D>
__global__ void __launch_bounds__(kRowThreads) CrossEntropySplitKernel(
    const char* base, int64_t rows, int64_t vocab, int64_t stride_bytes,
    int64_t splits, int64_t chunk, const int32_t* __restrict__ labels,
    int32_t ignore_index, double alpha, char* grad, int64_t grad_stride_bytes,
    double grad_scale, const ChunkPartial* __restrict__ part,
    const float* __restrict__ ws_uy, double* ws_loss, double* ws_z,
    double* ws_log_z, float* __restrict__ user_row_loss, unsigned* ticket,
    CrossEntropyResultDev* __restrict__ out) {
  const int64_t nblocks = rows * splits;
  for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const int64_t r = b / splits;
    const int64_t c = b % splits;
    const int64_t j0 = c * chunk;
    const int64_t n = chunk < vocab - j0 ? chunk : vocab - j0;
    const int32_t y = labels[r];
    char* grow = grad == nullptr ? nullptr : grad + r * grad_stride_bytes;
    if (y == ignore_index) {
      if (grow != nullptr) ZeroRow<D>(grow, j0, n);
      if (c == 0 && threadIdx.x == 0) {
        StoreIgnoredRow(r, ws_loss, ws_z, ws_log_z, user_row_loss);
      }
      continue;
    }
    const bool valid = y >= 0 && y < vocab;
    const double log_z = LogZOf(MergeRow(part, r, splits));
    if (c == 0 && threadIdx.x == 0) {
      StoreRowLoss(r, valid, ws_uy[r], log_z, alpha, ws_loss, ws_z, ws_log_z,
                   user_row_loss);
    }
    if (grow == nullptr) continue;
    GradSweep<D>(base + r * stride_bytes, grow, j0, n, y, log_z, alpha,
                 grad_scale, valid);
  }
  __shared__ bool s_last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // this block's row results before its ticket
    s_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  CrossEntropyReduce<kRowThreads>(ws_loss, ws_z, ws_log_z, rows, vocab, labels,
                                  ignore_index, out);
  if (threadIdx.x == 0) *ticket = 0;
}

}  // namespace
}  // namespace internal

// ---------------------------------------------------------- CrossEntropyGpu

struct CrossEntropyGpu::Impl {
  int64_t max_rows = 0;
  int sm_count = 1;
  internal::DeviceArray<double> ws_loss;
  internal::DeviceArray<double> ws_z;
  internal::DeviceArray<double> ws_log_z;
  internal::DeviceArray<float> ws_uy;
  internal::DeviceArray<internal::ChunkPartial> ws_part;
  internal::DeviceArray<unsigned> ticket;
  internal::DeviceArray<internal::CrossEntropyResultDev> d_result;
  internal::PinnedArray<internal::CrossEntropyResultDev> h_result;
};

CrossEntropyGpu::CrossEntropyGpu(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
CrossEntropyGpu::~CrossEntropyGpu() = default;

Status CrossEntropyGpu::Create(int64_t max_rows,
                               std::unique_ptr<CrossEntropyGpu>* out) {
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::CheckCreate(max_rows, out));
  auto impl = std::make_unique<Impl>();
  impl->max_rows = max_rows;
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::SmCount(&impl->sm_count));
  const size_t n = static_cast<size_t>(max_rows);
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_loss.Allocate(n, "row loss"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_z.Allocate(n, "row z-loss"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_log_z.Allocate(n, "row log Z"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_uy.Allocate(n, "label logits"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_part.Allocate(
      static_cast<size_t>(internal::SplitCapacity(impl->sm_count)),
      "chunk partials"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ticket.Allocate(1, "ticket"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->d_result.Allocate(1, "result"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(
      impl->h_result.Allocate(1, "pinned result"));
  std::memset(impl->h_result.get(), 0, sizeof(internal::CrossEntropyResultDev));
  // The ticket starts at 0, in device memory before any launch on any
  // stream (the zeroed pinned result is the source).
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::UploadAndWait(
      {{impl->ticket.get(), impl->h_result.get(), sizeof(unsigned)}}));
  out->reset(new CrossEntropyGpu(std::move(impl)));
  return OkStatus();
}

Status CrossEntropyGpu::Launch(const LogitsView& logits,
                               const CrossEntropyOptions& options,
                               cudaStream_t stream) {
  Impl& m = *impl_;
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateCrossEntropyArgs(logits, options));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::CheckRows(logits, m.max_rows));
  const int esize = static_cast<int>(DTypeSize(logits.dtype));
  const int64_t stride_bytes = logits.stride() * esize;
  const int64_t grad_stride_bytes =
      (options.grad_row_stride == 0 ? logits.vocab : options.grad_row_stride) *
      esize;
  const char* base = static_cast<const char*>(logits.data);
  char* grad = static_cast<char*>(options.grad_logits);
  const internal::Split sp =
      internal::SplitFor(logits.rows, logits.vocab, m.sm_count, esize);
  if (logits.rows > 0 && sp.splits > 1) {
    const unsigned grid = internal::GridFor(logits.rows * sp.splits);
    internal::ForDType(logits.dtype, [&](auto d) {
      internal::ChunkLseKernel<decltype(d)::value><<<grid, internal::kRowThreads, 0, stream>>>(
          base, logits.rows, logits.vocab, stride_bytes, sp.splits, sp.chunk, options.labels,
          options.ignore_index, nullptr, m.ws_part.get(), m.ws_uy.get());
      internal::CrossEntropySplitKernel<decltype(d)::value>
          <<<grid, internal::kRowThreads, 0, stream>>>(
              base, logits.rows, logits.vocab, stride_bytes, sp.splits, sp.chunk, options.labels,
              options.ignore_index, options.z_loss_alpha, grad, grad_stride_bytes,
              options.grad_scale, m.ws_part.get(), m.ws_uy.get(), m.ws_loss.get(), m.ws_z.get(),
              m.ws_log_z.get(), options.row_loss, m.ticket.get(), m.d_result.get());
    });
    return internal::CudaError(cudaGetLastError(), "cross entropy launch");
  }
  if (logits.rows > 0) {
    const unsigned grid = internal::GridFor(logits.rows);
    internal::ForDType(logits.dtype, [&](auto d) {
      internal::CrossEntropyKernel<decltype(d)::value><<<grid, internal::kRowThreads, 0, stream>>>(
          base, logits.rows, logits.vocab, stride_bytes, options.labels, options.ignore_index,
          options.z_loss_alpha, grad, grad_stride_bytes, options.grad_scale, m.ws_loss.get(),
          m.ws_z.get(), m.ws_log_z.get(), options.row_loss);
    });
  }
  internal::CrossEntropyFinalizeKernel<<<1, internal::kFinalThreads, 0, stream>>>(
      m.ws_loss.get(), m.ws_z.get(), m.ws_log_z.get(), logits.rows, logits.vocab, options.labels,
      options.ignore_index, m.d_result.get());
  return internal::CudaError(cudaGetLastError(), "cross entropy launch");
}

Status CrossEntropyGpu::ReadbackAsync(cudaStream_t stream) {
  return internal::CudaError(
      cudaMemcpyAsync(impl_->h_result.get(), impl_->d_result.get(),
                      sizeof(internal::CrossEntropyResultDev),
                      cudaMemcpyDeviceToHost, stream),
      "cross entropy readback");
}

Status CrossEntropyGpu::Result(CrossEntropyResult* out) const {
  if (out == nullptr) return InvalidArgumentError("out is null");
  const internal::CrossEntropyResultDev& r = *impl_->h_result.get();
  out->loss_sum = r.loss_sum;
  out->z_loss_sum = r.z_loss_sum;
  out->log_z_sum = r.log_z_sum;
  out->rows_counted = static_cast<int64_t>(r.rows_counted);
  out->invalid_labels = static_cast<int64_t>(r.invalid_labels);
  return OkStatus();
}

Status ComputeCrossEntropyZLossGpu(const LogitsView& logits,
                                   const CrossEntropyOptions& options,
                                   cudaStream_t stream,
                                   CrossEntropyResult* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateLogitsView(logits));
  std::unique_ptr<CrossEntropyGpu> ws;
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(CrossEntropyGpu::Create(logits.rows, &ws));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ws->Launch(logits, options, stream));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ws->ReadbackAsync(stream));
  TRAINWATCH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "synchronize");
  return ws->Result(out);
}

}  // namespace trainwatch::kernels
