// Private: the partition of a tensor list into GPU work, built on the host
// (plain C++, so it is tested on machines without a GPU). Invariants, which
// the kernels in grad_stats_cuda.cu rely on:
//   - Each non-empty tensor is cut into segments of at most kSegmentBytes,
//     from its first element; segments are ordered by tensor, then offset, so
//     tensor t owns [tensor_seg_begin[t], tensor_seg_begin[t + 1]).
//   - Blocks cover the segments in order without gaps or overlap. A block is
//     "wide" — exactly one segment of at least kPackedMaxElems elements,
//     reduced by the whole CUDA block — or "packed" — up to
//     kMaxPackedSegments segments shorter than kPackedMaxElems, together at
//     most kPackedBlockMaxElems elements, one warp per segment.
// The partition depends on the tensor sizes and dtypes only.
//
// The second half of this header is the kernels' index arithmetic — which
// thread reads which element, which block finalizes which tensor — as
// host-and-device functions: grad_stats_cuda.cu runs them on the GPU, and
// tests/kernels/gpu_sim.h runs the very same functions over host buffers, so
// the indexing is tested on machines without a GPU.

#ifndef TRAINWATCH_KERNELS_SRC_GPU_PARTITION_H_
#define TRAINWATCH_KERNELS_SRC_GPU_PARTITION_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainwatch/kernels/tensor_view.h"

namespace trainwatch::kernels::internal {

constexpr int64_t kSegmentBytes = 128 * 1024;
constexpr int64_t kPackedMaxElems = 2048;
constexpr int kMaxPackedSegments = 64;
constexpr int64_t kPackedBlockMaxElems = 32768;

// Copied to the device as is: keep it trivially copyable, 24 bytes.
struct GpuSegment {
  const void* data;  // first element of the segment
  int64_t numel;
  int32_t dtype;
  int32_t tensor;
};

struct GpuBlock {
  int32_t seg_begin;
  int32_t seg_end;
};

struct GpuPartition {
  std::vector<GpuSegment> segs;
  std::vector<GpuBlock> blocks;
  std::vector<int32_t> tensor_seg_begin;  // count + 1 entries
  int64_t numel = 0;
};

// REQUIRES: ValidateTensorViews(tensors, count).ok().
void BuildGpuPartition(const TensorView* tensors, size_t count,
                       GpuPartition* out);

// Points the segments at new buffers of the same shapes.
// REQUIRES: the same count, dtypes and sizes as the partition was built for.
void RebindGpuPartition(const TensorView* tensors, size_t count,
                        GpuPartition* p);

#if defined(__CUDACC__)
#define TRAINWATCH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TRAINWATCH_HOST_DEVICE inline
#endif

TRAINWATCH_HOST_DEVICE bool IsWideBlock(const GpuBlock& b,
                                        const GpuSegment& first) {
  return b.seg_end - b.seg_begin == 1 && first.numel >= kPackedMaxElems;
}

// ---- the partial kernel: one CUDA block per GpuBlock

constexpr int kPartialThreads = 256;
constexpr int kPartialWarps = kPartialThreads / 32;
// A wide block's threads stride over its segment with kWideUnroll loads in
// flight; in a packed block, warp w reduces segments seg_begin + w,
// seg_begin + w + kPartialWarps, ..., its lanes striding with
// kPackedUnroll loads in flight.
constexpr int kWideUnroll = 4;
constexpr int kPackedUnroll = 2;

// How one segment of n elements at address `addr` is read: elements
// [0, head) one by one up to the first 16-byte boundary, then nvec 16-byte
// vectors, then elements [tail_begin, n) one by one.
struct WalkShape {
  int64_t head;
  int64_t nvec;
  int64_t tail_begin;
};

TRAINWATCH_HOST_DEVICE WalkShape ShapeOfWalk(uintptr_t addr, int64_t n,
                                             int elem_bytes) {
  const int64_t per_vec = 16 / elem_bytes;
  int64_t head = static_cast<int64_t>(((16 - (addr & 15)) & 15) / elem_bytes);
  head = head < n ? head : n;
  const int64_t nvec = (n - head) / per_vec;
  return {head, nvec, head + nvec * per_vec};
}

// Thread `tid`'s share, stride kStride, of a walk of shape `s` over n
// elements: elem(i) for each single element i; vec_group(v) for the vectors
// v, v + kStride, ..., v + (kUnroll - 1) * kStride, all below s.nvec (loaded
// together, so kUnroll loads are in flight); vec(v) for the vectors left.
template <int kStride, int kUnroll, typename Elem, typename VecGroup,
          typename Vec>
TRAINWATCH_HOST_DEVICE void WalkThread(const WalkShape& s, int64_t n, int tid,
                                       Elem elem, VecGroup vec_group,
                                       Vec vec) {
  for (int64_t i = tid; i < s.head; i += kStride) elem(i);
  int64_t v = tid;
  for (; v + (kUnroll - 1) * kStride < s.nvec; v += kUnroll * kStride) {
    vec_group(v);
  }
  for (; v < s.nvec; v += kStride) vec(v);
  for (int64_t k = s.tail_begin + tid; k < n; k += kStride) elem(k);
}

// ---- the finalize kernel

constexpr int kFinalThreads = 1024;
constexpr int kFinalTensorsPerBlock = kFinalThreads / 32;

// Its grid: block 0 reduces every segment's partial into the header; with
// per-tensor results, blocks 1 .. ceil(n / 32) reduce 32 tensors each, one
// warp per tensor, so the rounds per warp do not grow with the tensor count.
TRAINWATCH_HOST_DEVICE int64_t FinalizeGrid(int64_t ntensors,
                                            bool per_tensor) {
  return 1 + (per_tensor ? (ntensors + kFinalTensorsPerBlock - 1) /
                               kFinalTensorsPerBlock
                         : 0);
}

// The tensor warp `warp` of finalize block `block` (>= 1) reduces; none
// when the result is >= the tensor count.
TRAINWATCH_HOST_DEVICE int64_t FinalizeTensorOf(int64_t block, int warp) {
  return (block - 1) * kFinalTensorsPerBlock + warp;
}

}  // namespace trainwatch::kernels::internal

#endif  // TRAINWATCH_KERNELS_SRC_GPU_PARTITION_H_
