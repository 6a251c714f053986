// What LogitStatsGpu (logit_stats_cuda.cu) and CrossEntropyGpu
// (cross_entropy_cuda.cu) share: one block per row computes log Z by online
// softmax in registers (per thread: a running max and a sum rescaled when the
// max grows, one rescale per 16-byte group), the block combines the
// per-thread states in a fixed order, and a one-block kernel reduces the rows
// in a fixed order in fp64. Long rows of a short batch are split into
// chunks whose (max, sum) pairs are merged in a fixed order.
//
// exp is the hardware ex2.approx (about 2 ulp) on (u - max) * log2(e)
// (SoftmaxExp2Arg, softmax_math.h): at bf16 rates the special-function units
// would be the bottleneck with an exact expf. Rows a label or mask leaves
// out are never read.
//
// Private to the two .cu files: everything here has internal linkage.
#pragma once

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
}  // namespace trainwatch::kernels
