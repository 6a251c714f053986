#include "gpu_partition.h"

#include <algorithm>

namespace trainwatch::kernels::internal {

void BuildGpuPartition(const TensorView* tensors, size_t count,
                       GpuPartition* out) {
  out->segs.clear();
  out->blocks.clear();
  out->tensor_seg_begin.assign(count + 1, 0);
  out->numel = 0;
  for (size_t t = 0; t < count; ++t) {
    const TensorView& v = tensors[t];
    out->tensor_seg_begin[t] = static_cast<int32_t>(out->segs.size());
    out->numel += v.numel;
    const int64_t esize = static_cast<int64_t>(DTypeSize(v.dtype));
    const int64_t seg_elems = kSegmentBytes / esize;
    for (int64_t off = 0; off < v.numel; off += seg_elems) {
      out->segs.push_back({static_cast<const char*>(v.data) + off * esize,
                           std::min(seg_elems, v.numel - off),
                           static_cast<int32_t>(v.dtype),
                           static_cast<int32_t>(t)});
    }
  }
  out->tensor_seg_begin[count] = static_cast<int32_t>(out->segs.size());
  const int32_t nseg = static_cast<int32_t>(out->segs.size());
  for (int32_t i = 0; i < nseg;) {
    if (out->segs[i].numel >= kPackedMaxElems) {
      out->blocks.push_back({i, i + 1});
      ++i;
      continue;
    }
    int32_t j = i;
    int64_t total = 0;
    while (j < nseg && j - i < kMaxPackedSegments &&
           out->segs[j].numel < kPackedMaxElems &&
           total + out->segs[j].numel <= kPackedBlockMaxElems) {
      total += out->segs[j].numel;
      ++j;
    }
    out->blocks.push_back({i, j});
    i = j;
  }
}

void RebindGpuPartition(const TensorView* tensors, size_t count,
                        GpuPartition* p) {
  for (size_t t = 0; t < count; ++t) {
    const TensorView& v = tensors[t];
    const int64_t esize = static_cast<int64_t>(DTypeSize(v.dtype));
    const int64_t seg_elems = kSegmentBytes / esize;
    for (int32_t k = p->tensor_seg_begin[t]; k < p->tensor_seg_begin[t + 1];
         ++k) {
      p->segs[k].data = static_cast<const char*>(v.data) +
                        (k - p->tensor_seg_begin[t]) * seg_elems * esize;
    }
  }
}

}  // namespace trainwatch::kernels::internal
