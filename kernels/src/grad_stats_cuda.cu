// GradStatsGpuPlan: the per-segment partial kernel and the fixed-order final
// reduction over the partition of gpu_partition.h (built once, on the host).
//
// Invariants beyond the partition's:
//   - Every segment's partial is written by exactly one block, so no atomics
//     are needed and the final reduction reads each partial once.
//   - Within a thread squares add up in fp32 (fast path below); across
//     threads, warps, segments and tensors everything is fp64 in a fixed
//     order.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_common.cuh"
#include "gpu_partition.h"
#include "trainwatch/kernels/cuda.h"

namespace trainwatch::kernels {
namespace internal {
namespace {

// 256 threads (kPartialThreads), at least 4 blocks per SM (64 registers, no
// spills): one block's reduction overlaps the others' loads, and 4 x 16-byte
// loads per thread in flight keep ~64 KiB per SM outstanding.
constexpr int kThreads = kPartialThreads;
constexpr int kMinBlocksPerSm = 4;
constexpr int kWarps = kPartialWarps;

// Each thread first walks its elements on the fast path, which assumes they
// are all finite: per 32-bit word only a magnitude mask, an integer max of
// the magnitude bits (two 16-bit halves at once for bf16 / fp16) and the
// fused multiply-adds. If the max shows a NaN or inf, the thread walks its
// elements again on the careful path, which classifies each element, counts
// the nonfinite ones and leaves them out; if the fp32 sum overflowed, it
// walks them again in fp64. Both second walks are per thread and only happen
// in a step that is failing or holds gradients near 1e19.

// Visits thread `tid`'s share (stride kStride) of n elements at `data`, in
// the order of WalkThread (gpu_partition.h): single elements before the
// first 16-byte boundary and after the last one (elem(bits)), 16-byte
// vectors in between (vec(uint4)), kUnroll loads in flight.
template <int D, int kStride, int kUnroll, typename ElemFn, typename VecFn>
__device__ __forceinline__ void Walk(const void* data, int64_t n, int tid,
                                     ElemFn elem, VecFn vec) {
  constexpr int kElemBytes = D == kDTypeF32 ? 4 : 2;
  const WalkShape shape =
      ShapeOfWalk(reinterpret_cast<uintptr_t>(data), n, kElemBytes);
  const uint4* v = reinterpret_cast<const uint4*>(
      static_cast<const char*>(data) + shape.head * kElemBytes);
  WalkThread<kStride, kUnroll>(
      shape, n, tid, [&](int64_t i) { elem(LoadBits<D>(data, i)); },
      [&](int64_t i) {
        uint4 r[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) r[u] = __ldg(v + i + u * kStride);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) vec(r[u]);
      },
      [&](int64_t i) { vec(__ldg(v + i)); });
}

// ---- fast path

struct FastState {
  float s0 = 0.0f;
  float s1 = 0.0f;
  uint32_t max_bits = 0;  // fp32: |x| bits; 16-bit: two halves, each a max
};

// One 32-bit word: one fp32, or two 16-bit elements (a single element sits
// in the low half with a zero high half, which adds nothing).
template <int D>
__device__ __forceinline__ void FastWord(uint32_t w, FastState& st) {
  if constexpr (D == kDTypeF32) {
    st.max_bits = max(st.max_bits, w & 0x7fffffffu);
    const float f = __uint_as_float(w);
    st.s0 = fmaf(f, f, st.s0);
  } else {
    const uint32_t a = w & 0x7fff7fffu;
    st.max_bits = __vmaxu2(st.max_bits, a);
    float lo, hi;
    if constexpr (D == kDTypeBf16) {
      lo = __uint_as_float(w << 16);
      hi = __uint_as_float(w & 0xffff0000u);
    } else {
      // fp16 magnitude -> fp32, exact for normals and subnormals alike:
      // the fp16 bits shifted into fp32 position are the value times 2^-112.
      lo = __uint_as_float((a & 0xffffu) << 13) * 0x1p112f;
      hi = __uint_as_float((a >> 16) << 13) * 0x1p112f;
    }
    st.s0 = fmaf(lo, lo, st.s0);
    st.s1 = fmaf(hi, hi, st.s1);
  }
}

template <int D>
__device__ __forceinline__ void FastVec(const uint4& v, FastState& st) {
  if constexpr (D == kDTypeF32) {
    // Two accumulators, for shorter dependency chains.
    const uint32_t m = 0x7fffffffu;
    st.max_bits =
        max(max(st.max_bits, v.x & m), max(v.y & m, max(v.z & m, v.w & m)));
    const float a = __uint_as_float(v.x), b = __uint_as_float(v.y);
    const float c = __uint_as_float(v.z), d = __uint_as_float(v.w);
    st.s0 = fmaf(c, c, fmaf(a, a, st.s0));
    st.s1 = fmaf(d, d, fmaf(b, b, st.s1));
  } else {
    FastWord<D>(v.x, st);
    FastWord<D>(v.y, st);
    FastWord<D>(v.z, st);
    FastWord<D>(v.w, st);
  }
}

// ---- careful path

template <int D, typename Acc>
__device__ __forceinline__ void AccumulateBits(uint32_t bits, Acc& sum,
                                               unsigned& bad, float& mx) {
  bool finite;
  float a = AbsFinite<D>(bits, &finite);
  a = finite ? a : 0.0f;
  bad += finite ? 0u : 1u;
  mx = fmaxf(mx, a);
  if constexpr (std::is_same_v<Acc, float>) {
    sum = fmaf(a, a, sum);
  } else {
    sum += static_cast<double>(a) * static_cast<double>(a);
  }
}

template <int D, typename Acc>
__device__ __forceinline__ void AccumulateWord(uint32_t w, Acc& sum,
                                               unsigned& bad, float& mx) {
  if constexpr (D == kDTypeF32) {
    AccumulateBits<D>(w, sum, bad, mx);
  } else {
    AccumulateBits<D>(w & 0xffffu, sum, bad, mx);
    AccumulateBits<D>(w >> 16, sum, bad, mx);
  }
}

template <int D, typename Acc, int kStride, int kUnroll>
__device__ __forceinline__ void CarefulWalk(const void* data, int64_t n,
                                            int tid, Acc& sum, unsigned& bad,
                                            float& mx) {
  Walk<D, kStride, kUnroll>(
      data, n, tid,
      [&](uint32_t bits) { AccumulateBits<D>(bits, sum, bad, mx); },
      [&](const uint4& v) {
        AccumulateWord<D>(v.x, sum, bad, mx);
        AccumulateWord<D>(v.y, sum, bad, mx);
        AccumulateWord<D>(v.z, sum, bad, mx);
        AccumulateWord<D>(v.w, sum, bad, mx);
      });
}

// This thread's share of a segment of dtype D.
template <int D, int kStride, int kUnroll>
__device__ __forceinline__ void ThreadPartialTyped(const void* data, int64_t n,
                                                   int tid, double* sum,
                                                   unsigned* bad, float* mx) {
  FastState st;
  Walk<D, kStride, kUnroll>(
      data, n, tid, [&](uint32_t bits) { FastWord<D>(bits, st); },
      [&](const uint4& v) { FastVec<D>(v, st); });
  uint32_t max_bits;
  uint32_t inf_bits;
  if constexpr (D == kDTypeF32) {
    max_bits = st.max_bits;
    inf_bits = 0x7f800000u;
  } else {
    max_bits = max(st.max_bits & 0xffffu, st.max_bits >> 16);
    inf_bits = D == kDTypeBf16 ? 0x7f80u : 0x7c00u;
  }
  if (max_bits < inf_bits) {
    const float sf = st.s0 + st.s1;
    if (!isinf(sf)) {
      *sum = static_cast<double>(sf);
    } else {
      double sd = 0.0;
      unsigned b = 0;
      float m = 0.0f;
      CarefulWalk<D, double, kStride, kUnroll>(data, n, tid, sd, b, m);
      *sum = sd;
    }
    *bad = 0;
    *mx = D == kDTypeF32    ? __uint_as_float(max_bits)
          : D == kDTypeBf16 ? __uint_as_float(max_bits << 16)
                            : HalfBitsToFloatDevice(max_bits);
    return;
  }
  float sf = 0.0f;
  unsigned b = 0;
  float m = 0.0f;
  CarefulWalk<D, float, kStride, kUnroll>(data, n, tid, sf, b, m);
  if (isinf(sf)) {
    double sd = 0.0;
    unsigned b2 = 0;
    float m2 = 0.0f;
    CarefulWalk<D, double, kStride, kUnroll>(data, n, tid, sd, b2, m2);
    *sum = sd;
  } else {
    *sum = static_cast<double>(sf);
  }
  *bad = b;
  *mx = m;
}

template <int kStride, int kUnroll>
__device__ __forceinline__ void ThreadPartial(const GpuSegment& s, int tid,
                                              double* sum, unsigned* bad,
                                              float* mx) {
  switch (s.dtype) {
    case kDTypeF32:
      ThreadPartialTyped<kDTypeF32, kStride, kUnroll>(s.data, s.numel, tid, sum,
                                                      bad, mx);
      break;
    case kDTypeBf16:
      ThreadPartialTyped<kDTypeBf16, kStride, kUnroll>(s.data, s.numel, tid,
                                                       sum, bad, mx);
      break;
    default:
      ThreadPartialTyped<kDTypeF16, kStride, kUnroll>(s.data, s.numel, tid, sum,
                                                      bad, mx);
      break;
  }
}

__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    GradPartialsKernel(const GpuSegment* __restrict__ segs,
                       const GpuBlock* __restrict__ blocks,
                       double* __restrict__ seg_sum,
                       unsigned* __restrict__ seg_bad,
                       float* __restrict__ seg_max) {
  __shared__ double s_sum[kWarps];
  __shared__ unsigned long long s_bad[kWarps];
  __shared__ float s_max[kWarps];
  const GpuBlock b = blocks[blockIdx.x];
  const GpuSegment first = segs[b.seg_begin];
  if (IsWideBlock(b, first)) {
    double sum;
    unsigned bad;
    float mx;
    ThreadPartial<kThreads, kWideUnroll>(first, threadIdx.x, &sum, &bad, &mx);
    const auto add = [](auto x, auto y) { return x + y; };
    const double bsum = BlockReduce<kThreads>(
        sum, 0.0, s_sum, [](double v) { return WarpSum(v); }, add);
    const unsigned long long bbad = BlockReduce<kThreads>(
        static_cast<unsigned long long>(bad), 0ull, s_bad,
        [](unsigned long long v) { return WarpSum(v); }, add);
    const float bmax = BlockReduce<kThreads>(
        mx, 0.0f, s_max, [](float v) { return WarpMax(v); },
        [](float x, float y) { return fmaxf(x, y); });
    if (threadIdx.x == 0) {
      seg_sum[b.seg_begin] = bsum;
      seg_bad[b.seg_begin] = static_cast<unsigned>(bbad);
      seg_max[b.seg_begin] = bmax;
    }
    return;
  }
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  for (int k = b.seg_begin + warp; k < b.seg_end; k += kWarps) {
    double sum;
    unsigned bad;
    float mx;
    ThreadPartial<32, kPackedUnroll>(segs[k], lane, &sum, &bad, &mx);
    sum = WarpSum(sum);
    const unsigned long long wbad =
        WarpSum(static_cast<unsigned long long>(bad));
    mx = WarpMax(mx);
    if (lane == 0) {
      seg_sum[k] = sum;
      seg_bad[k] = static_cast<unsigned>(wbad);
      seg_max[k] = mx;
    }
  }
}

// Grid: FinalizeGrid(ntensors, per_tensor) blocks (gpu_partition.h). Block
// 0 writes the header; every other block writes the per-tensor results of
// up to 32 tensors, one warp each.
__global__ void __launch_bounds__(kFinalThreads)
    GradFinalizeKernel(const double* __restrict__ seg_sum,
                       const unsigned* __restrict__ seg_bad,
                       const float* __restrict__ seg_max, int64_t nseg,
                       const int32_t* __restrict__ tensor_seg_begin,
                       int32_t ntensors, long long numel,
                       char* __restrict__ result) {
  if (blockIdx.x == 0) {
    __shared__ double s_sum[kFinalThreads / 32];
    __shared__ unsigned long long s_bad[kFinalThreads / 32];
    __shared__ float s_max[kFinalThreads / 32];
    double sum = 0.0;
    unsigned long long bad = 0;
    float mx = 0.0f;
    for (int64_t s = threadIdx.x; s < nseg; s += kFinalThreads) {
      sum += seg_sum[s];
      bad += seg_bad[s];
      mx = fmaxf(mx, seg_max[s]);
    }
    const auto add = [](auto x, auto y) { return x + y; };
    sum = BlockReduce<kFinalThreads>(
        sum, 0.0, s_sum, [](double v) { return WarpSum(v); }, add);
    bad = BlockReduce<kFinalThreads>(
        bad, 0ull, s_bad, [](unsigned long long v) { return WarpSum(v); },
        add);
    mx = BlockReduce<kFinalThreads>(
        mx, 0.0f, s_max, [](float v) { return WarpMax(v); },
        [](float x, float y) { return fmaxf(x, y); });
    if (threadIdx.x == 0) {
      GpuGradStatsHeader* h = reinterpret_cast<GpuGradStatsHeader*>(result);
      h->sum_squares = sum;
      h->nonfinite = bad;
      h->numel = numel;
      h->max_abs = mx;
    }
    return;
  }
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t t = FinalizeTensorOf(blockIdx.x, warp);
  if (t >= ntensors) return;  // the whole warp; no block barrier follows
  double* t_sum =
      reinterpret_cast<double*>(result + sizeof(GpuGradStatsHeader));
  unsigned long long* t_bad =
      reinterpret_cast<unsigned long long*>(t_sum + ntensors);
  double* t_max = reinterpret_cast<double*>(t_bad + ntensors);
  double ts = 0.0;
  unsigned long long tb = 0;
  float tm = 0.0f;
  for (int64_t s = tensor_seg_begin[t] + lane; s < tensor_seg_begin[t + 1];
       s += 32) {
    ts += seg_sum[s];
    tb += seg_bad[s];
    tm = fmaxf(tm, seg_max[s]);
  }
  ts = WarpSum(ts);
  tb = WarpSum(tb);
  tm = WarpMax(tm);
  if (lane == 0) {
    t_sum[t] = ts;
    t_bad[t] = tb;
    t_max[t] = tm;
  }
}

size_t ResultBytes(size_t ntensors, bool per_tensor) {
  return sizeof(GpuGradStatsHeader) +
         (per_tensor
              ? ntensors * (2 * sizeof(double) + sizeof(unsigned long long))
              : 0);
}

}  // namespace

}  // namespace internal

struct GradStatsGpuPlan::Impl {
  std::vector<TensorView> tensors;  // shapes (and the bound pointers)
  bool per_tensor = false;
  internal::GpuPartition part;

  internal::DeviceArray<internal::GpuSegment> d_segs;
  internal::DeviceArray<internal::GpuBlock> d_blocks;
  internal::DeviceArray<int32_t> d_tensor_seg_begin;
  internal::DeviceArray<double> d_seg_sum;
  internal::DeviceArray<unsigned> d_seg_bad;
  internal::DeviceArray<float> d_seg_max;
  internal::DeviceArray<char> d_result;
  internal::PinnedArray<char> h_result;
  // The tables' upload at Create, then each Rebind's segment table. Pinned
  // and allocated at Create: an allocation of pinned memory synchronizes the
  // whole device, which Rebind promises not to do.
  internal::PinnedArray<char> h_staging;
  cudaEvent_t upload_done = nullptr;
  bool upload_pending = false;

  ~Impl() {
    if (upload_done != nullptr) cudaEventDestroy(upload_done);
  }
};

GradStatsGpuPlan::GradStatsGpuPlan(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
GradStatsGpuPlan::~GradStatsGpuPlan() = default;

Status GradStatsGpuPlan::Create(const TensorView* tensors, size_t count,
                                const GradStatsOptions& options,
                                std::unique_ptr<GradStatsGpuPlan>* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateTensorViews(tensors, count));
  if (count > static_cast<size_t>(INT32_MAX / 2)) {
    return InvalidArgumentError("too many tensors");
  }
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::RequireDevice());
  int64_t max_segments = 0;
  for (size_t t = 0; t < count; ++t) {
    max_segments += 1 + tensors[t].numel *
                            static_cast<int64_t>(DTypeSize(tensors[t].dtype)) /
                            internal::kSegmentBytes;
  }
  if (max_segments > INT32_MAX / 2) {
    return InvalidArgumentError("too many segments for one plan");
  }
  auto impl = std::make_unique<Impl>();
  impl->tensors.assign(tensors, tensors + count);
  impl->per_tensor = options.per_tensor;
  internal::BuildGpuPartition(tensors, count, &impl->part);
  const internal::GpuPartition& part = impl->part;
  const size_t nseg = part.segs.size();
  const size_t result_bytes = internal::ResultBytes(count, options.per_tensor);
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->d_segs.Allocate(nseg, "segments"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(
      impl->d_blocks.Allocate(part.blocks.size(), "blocks"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(
      impl->d_tensor_seg_begin.Allocate(count + 1, "tensor table"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(
      impl->d_seg_sum.Allocate(nseg, "partials"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(
      impl->d_seg_bad.Allocate(nseg, "partials"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(
      impl->d_seg_max.Allocate(nseg, "partials"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(
      impl->d_result.Allocate(result_bytes, "result"));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(
      impl->h_result.Allocate(result_bytes, "pinned result"));
  std::memset(impl->h_result.get(), 0, result_bytes);
  // Segments, blocks and the tensor table, back to back in one staging
  // buffer (each part stays aligned: 24-, 8- and 4-byte entries).
  const size_t seg_bytes = nseg * sizeof(internal::GpuSegment);
  const size_t block_bytes = part.blocks.size() * sizeof(internal::GpuBlock);
  const size_t table_bytes = (count + 1) * sizeof(int32_t);
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(impl->h_staging.Allocate(
      seg_bytes + block_bytes + table_bytes, "pinned staging"));
  TRAINWATCH_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&impl->upload_done, cudaEventDisableTiming),
      "event");
  char* staging = impl->h_staging.get();
  std::memcpy(staging, part.segs.data(), seg_bytes);
  std::memcpy(staging + seg_bytes, part.blocks.data(), block_bytes);
  std::memcpy(staging + seg_bytes + block_bytes, part.tensor_seg_begin.data(),
              table_bytes);
  // The upload must be complete, not merely started, when Create returns: a
  // plain cudaMemcpy from pageable memory may return while its last chunk
  // is still in flight, and a Launch on a cudaStreamNonBlocking stream is
  // not ordered after it. So: async copies from pinned memory on a private
  // stream, then a wait for that stream (which leaves the caller's streams
  // alone).
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::UploadAndWait(
      {{impl->d_segs.get(), staging, seg_bytes},
       {impl->d_blocks.get(), staging + seg_bytes, block_bytes},
       {impl->d_tensor_seg_begin.get(), staging + seg_bytes + block_bytes,
        table_bytes}}));
  out->reset(new GradStatsGpuPlan(std::move(impl)));
  return OkStatus();
}

Status GradStatsGpuPlan::Rebind(const TensorView* tensors, size_t count,
                                cudaStream_t stream) {
  Impl& m = *impl_;
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateTensorViews(tensors, count));
  if (count != m.tensors.size()) {
    return InvalidArgumentError("Rebind: " + std::to_string(count) +
                                " tensors, the plan has " +
                                std::to_string(m.tensors.size()));
  }
  for (size_t t = 0; t < count; ++t) {
    if (tensors[t].dtype != m.tensors[t].dtype ||
        tensors[t].numel != m.tensors[t].numel) {
      return InvalidArgumentError("Rebind: tensor " + std::to_string(t) +
                                  " changed dtype or size");
    }
  }
  const size_t nseg = m.part.segs.size();
  if (nseg == 0) return OkStatus();
  if (m.upload_pending) {
    // The previous upload must have left the staging buffer before it is
    // overwritten; it was enqueued a step ago, so this does not wait.
    TRAINWATCH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(m.upload_done),
                                    "previous upload");
  }
  for (size_t t = 0; t < count; ++t) m.tensors[t].data = tensors[t].data;
  internal::RebindGpuPartition(tensors, count, &m.part);
  std::memcpy(m.h_staging.get(), m.part.segs.data(),
              nseg * sizeof(internal::GpuSegment));
  TRAINWATCH_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(m.d_segs.get(), m.h_staging.get(),
                      nseg * sizeof(internal::GpuSegment),
                      cudaMemcpyHostToDevice, stream),
      "upload segments");
  TRAINWATCH_CUDA_RETURN_IF_ERROR(cudaEventRecord(m.upload_done, stream),
                                  "record upload");
  m.upload_pending = true;
  return OkStatus();
}

Status GradStatsGpuPlan::Launch(cudaStream_t stream) {
  Impl& m = *impl_;
  const unsigned nblocks = static_cast<unsigned>(m.part.blocks.size());
  if (nblocks > 0) {
    internal::GradPartialsKernel<<<nblocks, internal::kThreads, 0, stream>>>(
        m.d_segs.get(), m.d_blocks.get(), m.d_seg_sum.get(), m.d_seg_bad.get(),
        m.d_seg_max.get());
  }
  const unsigned final_grid = static_cast<unsigned>(
      internal::FinalizeGrid(static_cast<int64_t>(m.tensors.size()),
                             m.per_tensor));
  internal::GradFinalizeKernel<<<final_grid, internal::kFinalThreads, 0,
                                 stream>>>(
      m.d_seg_sum.get(), m.d_seg_bad.get(), m.d_seg_max.get(),
      static_cast<int64_t>(m.part.segs.size()), m.d_tensor_seg_begin.get(),
      static_cast<int32_t>(m.tensors.size()), m.part.numel, m.d_result.get());
  return internal::CudaError(cudaGetLastError(), "grad stats launch");
}

Status GradStatsGpuPlan::ReadbackAsync(cudaStream_t stream) {
  Impl& m = *impl_;
  return internal::CudaError(
      cudaMemcpyAsync(m.h_result.get(), m.d_result.get(), m.d_result.size(),
                      cudaMemcpyDeviceToHost, stream),
      "grad stats readback");
}

Status GradStatsGpuPlan::Result(GradStats* out) const {
  return ResultFrom(impl_->h_result.get(), out);
}

size_t GradStatsGpuPlan::result_bytes() const { return impl_->d_result.size(); }

Status GradStatsGpuPlan::ResultFrom(const void* host_copy, GradStats* out) const {
  if (out == nullptr || host_copy == nullptr) {
    return InvalidArgumentError("out or host_copy is null");
  }
  const Impl& m = *impl_;
  const char* result = static_cast<const char*>(host_copy);
  GpuGradStatsHeader h;
  std::memcpy(&h, result, sizeof h);
  out->sum_squares = h.sum_squares;
  out->nonfinite = static_cast<int64_t>(h.nonfinite);
  out->numel = h.numel;
  out->max_abs = h.max_abs;
  const size_t n = m.per_tensor ? m.tensors.size() : 0;
  out->tensor_sum_squares.resize(n);
  out->tensor_nonfinite.resize(n);
  out->tensor_max_abs.resize(n);
  if (n > 0) {
    const char* p = result + sizeof(GpuGradStatsHeader);
    std::memcpy(out->tensor_sum_squares.data(), p, n * sizeof(double));
    p += n * sizeof(double);
    for (size_t t = 0; t < n; ++t) {
      unsigned long long b;
      std::memcpy(&b, p + t * sizeof b, sizeof b);
      out->tensor_nonfinite[t] = static_cast<int64_t>(b);
    }
    p += n * sizeof(unsigned long long);
    std::memcpy(out->tensor_max_abs.data(), p, n * sizeof(double));
  }
  return OkStatus();
}

const GpuGradStatsHeader* GradStatsGpuPlan::device_result() const {
  return reinterpret_cast<const GpuGradStatsHeader*>(impl_->d_result.get());
}

size_t GradStatsGpuPlan::tensor_count() const { return impl_->tensors.size(); }
int64_t GradStatsGpuPlan::segment_count() const {
  return static_cast<int64_t>(impl_->part.segs.size());
}
int64_t GradStatsGpuPlan::block_count() const {
  return static_cast<int64_t>(impl_->part.blocks.size());
}

Status ComputeGradStatsGpu(const TensorView* tensors, size_t count,
                           const GradStatsOptions& options, cudaStream_t stream,
                           GradStats* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  std::unique_ptr<GradStatsGpuPlan> plan;
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(
      GradStatsGpuPlan::Create(tensors, count, options, &plan));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(plan->Launch(stream));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(plan->ReadbackAsync(stream));
  TRAINWATCH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "synchronize");
  return plan->Result(out);
}

}  // namespace trainwatch::kernels
