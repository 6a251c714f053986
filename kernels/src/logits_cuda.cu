// LogitStatsGpu and CrossEntropyGpu: one block per row computes log Z by
// online softmax in registers (per thread: a running max and a sum rescaled
// when the max grows, one rescale per 16-byte group), the block combines the
// per-thread states in a fixed order, and a one-block kernel reduces the rows
// in a fixed order in fp64.
//
// exp is the hardware ex2.approx (about 2 ulp) on (u - max) * log2(e)
// (SoftmaxExp2Arg, softmax_math.h): at bf16 rates the special-function units
// would be the bottleneck with an exact expf. Rows a label or mask leaves
// out are never read.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cuda_common.cuh"
#include "gpu_partition.h"
#include "softmax_math.h"
#include "trainwatch/kernels/cuda.h"

namespace trainwatch::kernels {
namespace internal {
namespace {

constexpr int kRowThreads = 256;  // several rows per SM in flight, so one row's
                                  // reduction overlaps the others' loads
constexpr int kRowWarps = kRowThreads / 32;
// RowLogZKernel asks for at least 4 blocks per SM: a register budget of 64,
// which its row walk fits without spilling (left to itself, ptxas picked 40
// registers and spilled 36 bytes for bf16).
constexpr int kRowMinBlocksPerSm = 4;
constexpr unsigned kMaxGrid = 1u << 30;
// Long rows of a short batch are cut into chunks, one block each, so that
// the grid fills the GPU (one block per row leaves most of an H200 idle
// below ~1,000 rows): enough chunks for kSplitBlocksPerSm blocks per SM,
// none shorter than kMinChunkElems, at most kMaxSplits per row.
constexpr int kSplitBlocksPerSm = 8;
constexpr int64_t kMinChunkElems = 4096;
constexpr int kMaxSplits = 64;

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
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) acc += FastExp2(SoftmaxExp2Arg(x[k], st.m));
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

// The softmax state of the n logits at `p`, for the whole block (every
// thread calls and gets the same result): m = the largest finite logit
// (-inf: none), s = the sum of exp(x - m) over the finite ones, and whether
// a NaN or a +inf was seen. A piece holding a NaN or +inf (rare: a failing
// step) is read a second time on the careful path, which tells the two apart
// and finds the finite max.
struct ChunkLse {
  Lse lse;
  bool nan;
  bool pinf;
};

template <int D>
__device__ __forceinline__ ChunkLse BlockChunkLse(const void* p, int64_t n,
                                                  Lse* scratch) {
  Lse st{NegInf(), 0.0f};
  bool bad = false, unused = false;
  RowWalk<D, false>(p, n, st, bad, unused);
  bool any_nan = false, any_pinf = false;
  if (__syncthreads_or(bad)) {
    st = Lse{NegInf(), 0.0f};
    bool has_nan = false, has_pinf = false;
    RowWalk<D, true>(p, n, st, has_nan, has_pinf);
    any_nan = __syncthreads_or(has_nan);
    any_pinf = __syncthreads_or(has_pinf);
  }
  return {BlockCombine(st, scratch), any_nan, any_pinf};
}

// log Z of a row from its softmax state: NaN when it holds a NaN, +inf when
// it holds a +inf (and no NaN), -inf when every logit is -inf.
__device__ __forceinline__ double LogZOf(const ChunkLse& c) {
  if (c.nan) return nan("");
  if (c.pinf) return static_cast<double>(PosInf());
  if (c.lse.m == NegInf()) return static_cast<double>(NegInf());
  return static_cast<double>(c.lse.m) + log(static_cast<double>(c.lse.s));
}

// log Z of the row at `row` (every thread of the block calls; every thread
// gets the same value). *row_max: the largest finite logit, -inf if none.
template <int D>
__device__ __forceinline__ double BlockRowLogZ(const void* row, int64_t vocab, Lse* scratch,
                               float* row_max) {
  const ChunkLse c = BlockChunkLse<D>(row, vocab, scratch);
  *row_max = c.lse.m;
  return LogZOf(c);
}

__device__ __forceinline__ bool RowCounted(const int32_t* labels,
                                           int32_t ignore_index,
                                           const uint8_t* row_mask, int64_t r) {
  return (labels == nullptr || labels[r] != ignore_index) &&
         (row_mask == nullptr || row_mask[r] != 0);
}

// ---- rows split into chunks

// Rows are cut into `splits` chunks of `chunk` elements (the last one
// shorter); splits == 1: one block per row.
struct Split {
  int64_t splits;
  int64_t chunk;
};

Split SplitFor(int64_t rows, int64_t vocab, int sm_count, int elem_bytes) {
  const int64_t target = int64_t{kSplitBlocksPerSm} * sm_count;
  if (rows <= 0 || rows >= target) return {1, vocab};
  int64_t splits = (target + rows - 1) / rows;
  splits = std::min(splits, vocab / kMinChunkElems);
  splits = std::min<int64_t>(splits, kMaxSplits);
  if (splits <= 1) return {1, vocab};
  const int64_t per_vec = 16 / elem_bytes;
  int64_t chunk = (vocab + splits - 1) / splits;
  chunk = (chunk + per_vec - 1) / per_vec * per_vec;
  return {(vocab + chunk - 1) / chunk, chunk};
}

// rows * splits < 2 * target whenever splits > 1 (rows < target and
// splits <= ceil(target / rows)): the partials' capacity.
int64_t SplitCapacity(int sm_count) {
  return 2 * int64_t{kSplitBlocksPerSm} * sm_count;
}

// One chunk's softmax state, as the first kernel leaves it for the second.
struct ChunkPartial {
  float m;
  float s;
  uint32_t flags;  // 1: NaN seen, 2: +inf seen
};

// The row's state from its chunks' partials, merged in chunk order (every
// caller gets the same bits).
__device__ __forceinline__ ChunkLse MergeRow(const ChunkPartial* part,
                                             int64_t r, int64_t splits) {
  ChunkLse out{{NegInf(), 0.0f}, false, false};
  for (int64_t c = 0; c < splits; ++c) {
    const ChunkPartial p = part[r * splits + c];
    out.lse = LseCombine(out.lse, Lse{p.m, p.s});
    out.nan |= (p.flags & 1u) != 0;
    out.pinf |= (p.flags & 2u) != 0;
  }
  return out;
}

// Kernel 1 of a split launch: block b takes chunk b % splits of row
// b / splits. For cross entropy (uy set) the row's first chunk also keeps
// the label's logit, read here because the second kernel may overwrite the
// row (an in-place gradient).
template <int D>
__global__ void __launch_bounds__(kRowThreads)
    ChunkLseKernel(const char* __restrict__ base, int64_t rows, int64_t vocab,
                   int64_t stride_bytes, int64_t splits, int64_t chunk,
                   const int32_t* __restrict__ labels, int32_t ignore_index,
                   const uint8_t* __restrict__ row_mask,
                   ChunkPartial* __restrict__ part, float* __restrict__ uy) {
  __shared__ Lse scratch[kRowWarps];
  const int64_t nblocks = rows * splits;
  for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const int64_t r = b / splits;
    const int64_t c = b % splits;
    if (!RowCounted(labels, ignore_index, row_mask, r)) continue;
    const char* row = base + r * stride_bytes;
    const int64_t j0 = c * chunk;
    const int64_t n = chunk < vocab - j0 ? chunk : vocab - j0;
    const ChunkLse cl = BlockChunkLse<D>(row + j0 * ElemBytes<D>(), n, scratch);
    if (threadIdx.x == 0) {
      part[b] = {cl.lse.m, cl.lse.s, (cl.nan ? 1u : 0u) | (cl.pinf ? 2u : 0u)};
      if (uy != nullptr && c == 0) {
        const int32_t y = labels[r];
        uy[r] = y >= 0 && y < vocab ? ToFloat<D>(LoadBits<D>(row, y)) : 0.0f;
      }
    }
  }
}

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

unsigned GridFor(int64_t blocks) {
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
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

Status SmCount(int* out) {
  int device = 0;
  TRAINWATCH_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device), "cudaGetDevice");
  TRAINWATCH_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(out, cudaDevAttrMultiProcessorCount, device),
      "multiprocessor count");
  return OkStatus();
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
  if (out == nullptr) return InvalidArgumentError("out is null");
  if (max_rows < 0) return InvalidArgumentError("negative max_rows");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::RequireDevice());
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
  if (out == nullptr) return InvalidArgumentError("out is null");
  if (max_rows < 0) return InvalidArgumentError("negative max_rows");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::RequireDevice());
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
