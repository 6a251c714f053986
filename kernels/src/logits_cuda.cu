// LogitStatsGpu and CrossEntropyGpu: one block per row computes log Z by
// online softmax in registers (per thread: a running max and a sum rescaled
// when the max grows, one rescale per 16-byte group), the block combines the
// per-thread states in a fixed order, and a one-block kernel reduces the rows
// in a fixed order in fp64.
//
// exp is the hardware ex2.approx (about 2 ulp) on u * log2(e) - max *
// log2(e), one FMA: at bf16 rates the special-function units would be the
// bottleneck with an exact expf. Rows a label or mask leaves out are never
// read.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <string>

#include "cuda_common.cuh"
#include "trainwatch/kernels/cuda.h"

namespace trainwatch::kernels {
namespace internal {
namespace {

constexpr int kRowThreads = 256;  // several rows per SM in flight, so one row's
                                  // reduction overlaps the others' loads
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kFinalThreads = 1024;
constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kMaxGrid = 1u << 30;

struct LogitResultDev {
  double sum_log_z;
  unsigned long long rows_counted;
  unsigned long long nonfinite_rows;
  double max_logit;
};

struct CrossEntropyResultDev {
  double loss_sum;
  double z_loss_sum;
  double log_z_sum;
  unsigned long long rows_counted;
  unsigned long long invalid_labels;
};

__device__ __forceinline__ float NegInf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float PosInf() { return __int_as_float(0x7f800000); }

// Online logsumexp state: m = max of the finite logits seen (-inf: none yet),
// s = sum of exp(u - m) over them.
struct Lse {
  float m;
  float s;
};

__device__ __forceinline__ Lse LseCombine(Lse a, Lse b) {
  const float m = fmaxf(a.m, b.m);
  if (m == NegInf()) return {m, 0.0f};
  return {m, a.s * FastExp2((a.m - m) * kLog2e) +
                 b.s * FastExp2((b.m - m) * kLog2e)};
}

// A logit on the careful path: as fp32 with nonfinite values replaced by
// -inf (which contribute exp(-inf) = 0), recording NaN and +inf.
__device__ __forceinline__ float Classify(float x, bool& nan, bool& pinf) {
  nan |= x != x;
  pinf |= x == PosInf();
  return fabsf(x) < PosInf() ? x : NegInf();
}

// A logit on the fast path: unchanged, flagging NaN and +inf in one compare
// (!(x < inf) holds for exactly those two). -inf needs no care: fmaxf and
// exp handle it. A flagged row is reduced again on the careful path.
__device__ __forceinline__ float Flag(float x, bool& bad) {
  bad |= !(x < PosInf());
  return x;
}

// Either path, as one call site: kCareful selects Classify or Flag.
template <bool kCareful>
__device__ __forceinline__ float Prepare(float x, bool& a, bool& b) {
  if constexpr (kCareful) {
    return Classify(x, a, b);
  } else {
    return Flag(x, a);
  }
}

template <int N>
__device__ __forceinline__ void LseAddGroup(const float (&x)[N], Lse& st) {
  float lm = x[0];
#pragma unroll
  for (int k = 1; k < N; ++k) lm = fmaxf(lm, x[k]);
  if (lm > st.m) {
    st.s *= FastExp2((st.m - lm) * kLog2e);  // st.m == -inf: st.s is 0
    st.m = lm;
  }
  if (st.m != NegInf()) {
    const float ml = st.m * kLog2e;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) acc += FastExp2(fmaf(x[k], kLog2e, -ml));
    st.s += acc;
  }
}

template <int D>
constexpr int ElemBytes() {
  return D == kDTypeF32 ? 4 : 2;
}

// The 16 / ElemBytes logits of a 16-byte vector, prepared.
template <int D, bool kCareful>
__device__ __forceinline__ void Unpack(const uint4& v,
                                       float (&x)[16 / ElemBytes<D>()], bool& a,
                                       bool& b) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (D == kDTypeF32) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      x[k] = Prepare<kCareful>(__uint_as_float(w[k]), a, b);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[2 * k] = Prepare<kCareful>(ToFloat<D>(w[k] & 0xffffu), a, b);
      x[2 * k + 1] = Prepare<kCareful>(ToFloat<D>(w[k] >> 16), a, b);
    }
  }
}

// Thread threadIdx.x's share of one row: scalar head up to a 16-byte
// boundary, 16-byte vectors with 4 loads in flight, scalar tail. The flags a
// and b: on the fast path a = "NaN or +inf seen"; on the careful path a =
// NaN seen, b = +inf seen.
template <int D, bool kCareful>
__device__ __forceinline__ void RowWalk(const void* row, int64_t n, Lse& st,
                                        bool& a, bool& b) {
  constexpr int kEB = ElemBytes<D>();
  constexpr int kPerVec = 16 / kEB;
  constexpr int kUnroll = 4;
  const int tid = threadIdx.x;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(row);
  int64_t head = static_cast<int64_t>(((16 - (addr & 15)) & 15) / kEB);
  head = head < n ? head : n;
  for (int64_t i = tid; i < head; i += kRowThreads) {
    const float x[1] = {
        Prepare<kCareful>(ToFloat<D>(LoadBits<D>(row, i)), a, b)};
    LseAddGroup(x, st);
  }
  const uint4* v = reinterpret_cast<const uint4*>(
      static_cast<const char*>(row) + head * kEB);
  const int64_t nvec = (n - head) / kPerVec;
  int64_t i = tid;
  for (; i + (kUnroll - 1) * kRowThreads < nvec; i += kUnroll * kRowThreads) {
    uint4 r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) r[u] = __ldg(v + i + u * kRowThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float x[kPerVec];
      Unpack<D, kCareful>(r[u], x, a, b);
      LseAddGroup(x, st);
    }
  }
  for (; i < nvec; i += kRowThreads) {
    float x[kPerVec];
    Unpack<D, kCareful>(__ldg(v + i), x, a, b);
    LseAddGroup(x, st);
  }
  for (int64_t k = head + nvec * kPerVec + tid; k < n; k += kRowThreads) {
    const float x[1] = {
        Prepare<kCareful>(ToFloat<D>(LoadBits<D>(row, k)), a, b)};
    LseAddGroup(x, st);
  }
}

// Combines the threads' states in a fixed order: a butterfly per warp, then
// the warps in index order. Every thread gets the same result.
__device__ __forceinline__ Lse BlockCombine(Lse st, Lse* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const Lse other{__shfl_xor_sync(kFullMask, st.m, o),
                    __shfl_xor_sync(kFullMask, st.s, o)};
    st = LseCombine(st, other);
  }
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = st;
  __syncthreads();
  Lse r{NegInf(), 0.0f};
  for (int w = 0; w < kRowWarps; ++w) r = LseCombine(r, scratch[w]);
  __syncthreads();  // scratch is reused by the next call
  return r;
}

// log Z of the row at `row` (every thread of the block calls; every thread
// gets the same value). *row_max: the largest finite logit, -inf if none.
// A row holding a NaN or +inf (rare: a failing step) is read a second time
// on the careful path, which tells the two apart and finds the finite max.
template <int D>
__device__ double BlockRowLogZ(const void* row, int64_t vocab, Lse* scratch,
                               float* row_max) {
  Lse st{NegInf(), 0.0f};
  bool bad = false, unused = false;
  RowWalk<D, false>(row, vocab, st, bad, unused);
  if (!__syncthreads_or(bad)) {
    const Lse r = BlockCombine(st, scratch);
    *row_max = r.m;
    if (r.m == NegInf()) return static_cast<double>(NegInf());
    return static_cast<double>(r.m) + log(static_cast<double>(r.s));
  }
  st = Lse{NegInf(), 0.0f};
  bool has_nan = false, has_pinf = false;
  RowWalk<D, true>(row, vocab, st, has_nan, has_pinf);
  const bool any_nan = __syncthreads_or(has_nan);
  const Lse r = BlockCombine(st, scratch);
  *row_max = r.m;
  // No NaN: the flag came from a +inf.
  return any_nan ? nan("") : static_cast<double>(PosInf());
}

__device__ __forceinline__ bool RowCounted(const int32_t* labels,
                                           int32_t ignore_index,
                                           const uint8_t* row_mask, int64_t r) {
  return (labels == nullptr || labels[r] != ignore_index) &&
         (row_mask == nullptr || row_mask[r] != 0);
}

template <int D>
__global__ void __launch_bounds__(kRowThreads)
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

__global__ void __launch_bounds__(kFinalThreads) LogitFinalizeKernel(
    const double* __restrict__ ws_log_z, const float* __restrict__ ws_max,
    int64_t rows, const int32_t* __restrict__ labels, int32_t ignore_index,
    const uint8_t* __restrict__ row_mask, LogitResultDev* __restrict__ out) {
  __shared__ double s_sum[kFinalThreads / 32];
  __shared__ unsigned long long s_cnt[kFinalThreads / 32];
  __shared__ float s_max[kFinalThreads / 32];
  double sum = 0.0;
  unsigned long long counted = 0, bad = 0;
  float mx = NegInf();
  for (int64_t r = threadIdx.x; r < rows; r += kFinalThreads) {
    if (!RowCounted(labels, ignore_index, row_mask, r)) continue;
    ++counted;
    const double lz = ws_log_z[r];
    if (isfinite(lz)) {
      sum += lz;
    } else {
      ++bad;
    }
    mx = fmaxf(mx, ws_max[r]);
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
__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyKernel(const char* __restrict__ base, int64_t rows,
                       int64_t vocab, int64_t stride_bytes,
                       const int32_t* __restrict__ labels, int32_t ignore_index,
                       double alpha, char* __restrict__ grad,
                       int64_t grad_stride_bytes, double grad_scale,
                       double* __restrict__ ws_loss, double* __restrict__ ws_z,
                       double* __restrict__ ws_log_z,
                       float* __restrict__ user_row_loss) {
  constexpr int kEB = ElemBytes<D>();
  constexpr int kPerVec = 16 / kEB;
  __shared__ Lse scratch[kRowWarps];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t y = labels[r];
    char* grow = grad == nullptr ? nullptr : grad + r * grad_stride_bytes;
    if (y == ignore_index) {
      if (grow != nullptr) {
        for (int64_t j = threadIdx.x; j < vocab; j += kRowThreads) {
          StoreBits<D>(grow, j, 0u);
        }
      }
      if (threadIdx.x == 0) {
        ws_loss[r] = 0.0;
        ws_z[r] = 0.0;
        ws_log_z[r] = 0.0;
        if (user_row_loss != nullptr) user_row_loss[r] = 0.0f;
      }
      continue;
    }
    const bool valid = y >= 0 && y < vocab;
    const char* row = base + r * stride_bytes;
    float row_max;
    const double log_z = BlockRowLogZ<D>(row, vocab, scratch, &row_max);
    if (threadIdx.x == 0) {
      const double z = alpha * log_z * log_z;
      const double uy =
          valid ? static_cast<double>(ToFloat<D>(LoadBits<D>(row, y))) : 0.0;
      const double loss = valid ? log_z - uy + z : nan("");
      ws_loss[r] = loss;
      ws_z[r] = z;
      ws_log_z[r] = log_z;
      if (user_row_loss != nullptr) user_row_loss[r] = static_cast<float>(loss);
    }
    if (grow == nullptr) continue;
    // g_j = (p_j * (1 + 2 alpha log Z) - [j == y]) * scale, p_j = exp(u_j - log
    // Z).
    const float lzl = static_cast<float>(log_z * static_cast<double>(kLog2e));
    const float coef =
        valid ? static_cast<float>((1.0 + 2.0 * alpha * log_z) * grad_scale)
              : nanf("");
    const float one = static_cast<float>(grad_scale);
    const auto grad_of = [&](float u, int64_t j) {
      const float p = FastExp2(fmaf(u, kLog2e, -lzl));
      return p * coef - (j == y ? one : 0.0f);
    };
    const bool aligned = ((reinterpret_cast<uintptr_t>(row) |
                           reinterpret_cast<uintptr_t>(grow)) &
                          15) == 0;
    const int64_t nvec = aligned ? vocab / kPerVec : 0;
    const uint4* vin = reinterpret_cast<const uint4*>(row);
    uint4* vout = reinterpret_cast<uint4*>(grow);
    for (int64_t v = threadIdx.x; v < nvec; v += kRowThreads) {
      const uint4 in = __ldg(vin + v);
      const uint32_t w[4] = {in.x, in.y, in.z, in.w};
      uint32_t o[4];
      const int64_t j0 = v * kPerVec;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (D == kDTypeF32) {
          o[k] = FromFloat<D>(grad_of(__uint_as_float(w[k]), j0 + k));
        } else {
          const uint32_t lo =
              FromFloat<D>(grad_of(ToFloat<D>(w[k] & 0xffffu), j0 + 2 * k));
          const uint32_t hi =
              FromFloat<D>(grad_of(ToFloat<D>(w[k] >> 16), j0 + 2 * k + 1));
          o[k] = lo | (hi << 16);
        }
      }
      vout[v] = make_uint4(o[0], o[1], o[2], o[3]);
    }
    for (int64_t j = nvec * kPerVec + threadIdx.x; j < vocab;
         j += kRowThreads) {
      StoreBits<D>(grow, j,
                   FromFloat<D>(grad_of(ToFloat<D>(LoadBits<D>(row, j)), j)));
    }
  }
}

__global__ void __launch_bounds__(kFinalThreads) CrossEntropyFinalizeKernel(
    const double* __restrict__ ws_loss, const double* __restrict__ ws_z,
    const double* __restrict__ ws_log_z, int64_t rows, int64_t vocab,
    const int32_t* __restrict__ labels, int32_t ignore_index,
    CrossEntropyResultDev* __restrict__ out) {
  __shared__ double s_d[kFinalThreads / 32];
  __shared__ unsigned long long s_u[kFinalThreads / 32];
  double loss = 0.0, z = 0.0, lz = 0.0;
  unsigned long long counted = 0, invalid = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kFinalThreads) {
    const int32_t y = labels[r];
    if (y == ignore_index) continue;
    ++counted;
    if (y < 0 || y >= vocab) ++invalid;
    loss += ws_loss[r];
    z += ws_z[r];
    lz += ws_log_z[r];
  }
  const auto add = [](auto x, auto y) { return x + y; };
  const auto wd = [](double v) { return WarpSum(v); };
  const auto wu = [](unsigned long long v) { return WarpSum(v); };
  loss = BlockReduce<kFinalThreads>(loss, 0.0, s_d, wd, add);
  z = BlockReduce<kFinalThreads>(z, 0.0, s_d, wd, add);
  lz = BlockReduce<kFinalThreads>(lz, 0.0, s_d, wd, add);
  counted = BlockReduce<kFinalThreads>(counted, 0ull, s_u, wu, add);
  invalid = BlockReduce<kFinalThreads>(invalid, 0ull, s_u, wu, add);
  if (threadIdx.x == 0) {
    out->loss_sum = loss;
    out->z_loss_sum = z;
    out->log_z_sum = lz;
    out->rows_counted = counted;
    out->invalid_labels = invalid;
  }
}

unsigned GridFor(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxGrid ? rows : kMaxGrid);
}

Status CheckRows(const LogitsView& logits, int64_t max_rows) {
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateLogitsView(logits));
  if (logits.rows > max_rows) {
    return InvalidArgumentError("logits.rows " + std::to_string(logits.rows) +
                                " > the workspace's max_rows " +
                                std::to_string(max_rows));
  }
  return OkStatus();
}

}  // namespace
}  // namespace internal

// ------------------------------------------------------------ LogitStatsGpu

struct LogitStatsGpu::Impl {
  int64_t max_rows = 0;
  internal::DeviceArray<double> ws_log_z;
  internal::DeviceArray<float> ws_max;
  internal::DeviceArray<internal::LogitResultDev> d_result;
  internal::PinnedArray<internal::LogitResultDev> h_result;
};

LogitStatsGpu::LogitStatsGpu(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
LogitStatsGpu::~LogitStatsGpu() = default;

Status LogitStatsGpu::Create(int64_t max_rows,
                             std::unique_ptr<LogitStatsGpu>* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  if (max_rows < 0) return InvalidArgumentError("negative max_rows");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::RequireDevice());
  auto impl = std::make_unique<Impl>();
  impl->max_rows = max_rows;
  const size_t n = static_cast<size_t>(max_rows);
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_log_z.Allocate(n, "row log Z"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_max.Allocate(n, "row max"));
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
  const int64_t stride_bytes =
      logits.stride() * static_cast<int64_t>(DTypeSize(logits.dtype));
  const char* base = static_cast<const char*>(logits.data);
  if (logits.rows > 0) {
    const unsigned grid = internal::GridFor(logits.rows);
#define TW_ROW_LAUNCH(D)                                                  \
  internal::RowLogZKernel<D><<<grid, internal::kRowThreads, 0, stream>>>( \
      base, logits.rows, logits.vocab, stride_bytes, options.labels,      \
      options.ignore_index, options.row_mask, m.ws_log_z.get(),           \
      m.ws_max.get(), options.row_log_z)
    switch (logits.dtype) {
      case DType::kFloat32:
        TW_ROW_LAUNCH(internal::kDTypeF32);
        break;
      case DType::kBFloat16:
        TW_ROW_LAUNCH(internal::kDTypeBf16);
        break;
      case DType::kFloat16:
        TW_ROW_LAUNCH(internal::kDTypeF16);
        break;
    }
#undef TW_ROW_LAUNCH
  }
  internal::LogitFinalizeKernel<<<1, internal::kFinalThreads, 0, stream>>>(
      m.ws_log_z.get(), m.ws_max.get(), logits.rows, options.labels,
      options.ignore_index, options.row_mask, m.d_result.get());
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
  if (out == nullptr) return InvalidArgumentError("out is null");
  const internal::LogitResultDev& r = *impl_->h_result.get();
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

// ---------------------------------------------------------- CrossEntropyGpu

struct CrossEntropyGpu::Impl {
  int64_t max_rows = 0;
  internal::DeviceArray<double> ws_loss;
  internal::DeviceArray<double> ws_z;
  internal::DeviceArray<double> ws_log_z;
  internal::DeviceArray<internal::CrossEntropyResultDev> d_result;
  internal::PinnedArray<internal::CrossEntropyResultDev> h_result;
};

CrossEntropyGpu::CrossEntropyGpu(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
CrossEntropyGpu::~CrossEntropyGpu() = default;

Status CrossEntropyGpu::Create(int64_t max_rows,
                               std::unique_ptr<CrossEntropyGpu>* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  if (max_rows < 0) return InvalidArgumentError("negative max_rows");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::RequireDevice());
  auto impl = std::make_unique<Impl>();
  impl->max_rows = max_rows;
  const size_t n = static_cast<size_t>(max_rows);
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_loss.Allocate(n, "row loss"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_z.Allocate(n, "row z-loss"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->ws_log_z.Allocate(n, "row log Z"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->d_result.Allocate(1, "result"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(
      impl->h_result.Allocate(1, "pinned result"));
  std::memset(impl->h_result.get(), 0, sizeof(internal::CrossEntropyResultDev));
  out->reset(new CrossEntropyGpu(std::move(impl)));
  return OkStatus();
}

Status CrossEntropyGpu::Launch(const LogitsView& logits,
                               const CrossEntropyOptions& options,
                               cudaStream_t stream) {
  Impl& m = *impl_;
  if (options.labels == nullptr) {
    return InvalidArgumentError("cross entropy needs labels");
  }
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::CheckRows(logits, m.max_rows));
  if (options.grad_row_stride != 0 && options.grad_row_stride < logits.vocab) {
    return InvalidArgumentError("grad_row_stride < vocab");
  }
  const int64_t esize = static_cast<int64_t>(DTypeSize(logits.dtype));
  if (reinterpret_cast<uintptr_t>(options.grad_logits) % esize != 0) {
    return InvalidArgumentError("grad_logits not aligned to its element size");
  }
  const int64_t stride_bytes = logits.stride() * esize;
  const int64_t grad_stride_bytes =
      (options.grad_row_stride == 0 ? logits.vocab : options.grad_row_stride) *
      esize;
  const char* base = static_cast<const char*>(logits.data);
  char* grad = static_cast<char*>(options.grad_logits);
  if (logits.rows > 0) {
    const unsigned grid = internal::GridFor(logits.rows);
#define TW_CE_LAUNCH(D)                                                        \
  internal::CrossEntropyKernel<D><<<grid, internal::kRowThreads, 0, stream>>>( \
      base, logits.rows, logits.vocab, stride_bytes, options.labels,           \
      options.ignore_index, options.z_loss_alpha, grad, grad_stride_bytes,     \
      options.grad_scale, m.ws_loss.get(), m.ws_z.get(), m.ws_log_z.get(),     \
      options.row_loss)
    switch (logits.dtype) {
      case DType::kFloat32:
        TW_CE_LAUNCH(internal::kDTypeF32);
        break;
      case DType::kBFloat16:
        TW_CE_LAUNCH(internal::kDTypeBf16);
        break;
      case DType::kFloat16:
        TW_CE_LAUNCH(internal::kDTypeF16);
        break;
    }
#undef TW_CE_LAUNCH
  }
  internal::
      CrossEntropyFinalizeKernel<<<1, internal::kFinalThreads, 0, stream>>>(
          m.ws_loss.get(), m.ws_z.get(), m.ws_log_z.get(), logits.rows,
          logits.vocab, options.labels, options.ignore_index, m.d_result.get());
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
