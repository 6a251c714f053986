// The host-side partition behind the GPU grad stats: checked on any machine,
// since the kernels' correctness rests on its invariants (gpu_partition.h).

#include "gpu_partition.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "test_data.h"

namespace trainwatch::kernels::internal {
namespace {

void CheckInvariants(const std::vector<TensorView>& tensors,
                     const GpuPartition& p) {
  REQUIRE(p.tensor_seg_begin.size() == tensors.size() + 1);
  int64_t numel = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TensorView& v = tensors[t];
    numel += v.numel;
    const int64_t esize = static_cast<int64_t>(DTypeSize(v.dtype));
    int64_t covered = 0;
    for (int32_t k = p.tensor_seg_begin[t]; k < p.tensor_seg_begin[t + 1];
         ++k) {
      const GpuSegment& s = p.segs[k];
      REQUIRE(s.tensor == static_cast<int32_t>(t));
      REQUIRE(s.dtype == static_cast<int32_t>(v.dtype));
      REQUIRE(s.data == static_cast<const char*>(v.data) + covered * esize);
      REQUIRE(s.numel > 0);
      REQUIRE(s.numel * esize <= kSegmentBytes);
      covered += s.numel;
    }
    REQUIRE(covered == v.numel);
  }
  CHECK(p.numel == numel);
  int32_t next = 0;
  for (const GpuBlock& b : p.blocks) {
    REQUIRE(b.seg_begin == next);
    REQUIRE(b.seg_end > b.seg_begin);
    next = b.seg_end;
    if (IsWideBlock(b, p.segs[b.seg_begin])) continue;
    REQUIRE(b.seg_end - b.seg_begin <= kMaxPackedSegments);
    int64_t total = 0;
    for (int32_t k = b.seg_begin; k < b.seg_end; ++k) {
      REQUIRE(p.segs[k].numel < kPackedMaxElems);
      total += p.segs[k].numel;
    }
    REQUIRE(total <= kPackedBlockMaxElems);
  }
  REQUIRE(next == static_cast<int32_t>(p.segs.size()));
}

TEST_CASE("gpu partition covers every element once", "[partition]") {
  testing::Rng rng(21);
  auto hosts = testing::ManySmallTensors(rng, 3000, 0.0);
  hosts.emplace_back(DType::kBFloat16, 5 * 65536 + 3);
  hosts.emplace_back(DType::kFloat32, 0);
  hosts.emplace_back(DType::kFloat32, 2048);
  hosts.emplace_back(DType::kFloat32, 2047);
  const auto views = testing::Views(hosts);
  GpuPartition p;
  BuildGpuPartition(views.data(), views.size(), &p);
  CheckInvariants(views, p);
  // Small tensors share blocks: far fewer blocks than tensors.
  CHECK(p.blocks.size() < views.size() / 10);

  // Rebinding to other buffers of the same shapes moves every segment.
  std::vector<testing::HostTensor> copies;
  for (const auto& h : hosts) copies.emplace_back(h.dtype(), h.numel());
  const auto moved = testing::Views(copies);
  RebindGpuPartition(moved.data(), moved.size(), &p);
  CheckInvariants(moved, p);
}

TEST_CASE("gpu partition of 1000 small tensors needs few blocks",
          "[partition]") {
  testing::Rng rng(22);
  std::vector<testing::HostTensor> hosts;
  for (int i = 0; i < 1000; ++i)
    hosts.emplace_back(DType::kBFloat16, 1 + rng.Below(100));
  const auto views = testing::Views(hosts);
  GpuPartition p;
  BuildGpuPartition(views.data(), views.size(), &p);
  CheckInvariants(views, p);
  CHECK(p.segs.size() == 1000);
  CHECK(p.blocks.size() ==
        (1000 + kMaxPackedSegments - 1) / kMaxPackedSegments);
}

TEST_CASE("gpu partition of nothing is empty", "[partition]") {
  GpuPartition p;
  BuildGpuPartition(nullptr, 0, &p);
  CHECK(p.segs.empty());
  CHECK(p.blocks.empty());
  CHECK(p.tensor_seg_begin == std::vector<int32_t>{0});
}

}  // namespace
}  // namespace trainwatch::kernels::internal
