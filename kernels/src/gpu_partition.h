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
__host__ __device__
#endif
    inline bool
    IsWideBlock(const GpuBlock& b, const GpuSegment& first) {
  return b.seg_end - b.seg_begin == 1 && first.numel >= kPackedMaxElems;
}

}  // namespace trainwatch::kernels::internal

#endif  // TRAINWATCH_KERNELS_SRC_GPU_PARTITION_H_
