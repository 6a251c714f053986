// The GPU grad stats plan — partition, per-thread walk, finalize grid — run
// on the CPU by the simulation of gpu_sim.h, against the fp64 reference: on
// every machine, every build, so the kernels' indexing is tested without a
// GPU.

#include "gpu_sim.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "test_data.h"
#include "trainwatch/kernels/reference.h"

namespace trainwatch::kernels::testing {
namespace {

constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16,
                             DType::kFloat16};

// A size drawn to hit the partition's edges: empty, tiny, around the packed
// limit (2,048) and the segment sizes (32,768 / 65,536 elements), and now and
// then several segments.
int64_t RandomNumel(Rng& rng) {
  switch (rng.Below(8)) {
    case 0:
      return 0;
    case 1:
    case 2:
      return rng.Below(18);
    case 3:
      return 2040 + rng.Below(16);
    case 4:
      return rng.Below(5000);
    case 5: {
      const int64_t edges[] = {32768, 65536};
      return edges[rng.Below(2)] - 3 + rng.Below(7);
    }
    case 6:
      return rng.Below(40000);
    default:
      return rng.Below(8) == 0 ? 65536 * 2 + rng.Below(70000) : rng.Below(300);
  }
}

TEST_CASE("simulated gpu plan matches the reference on random tensor lists",
          "[partition][gpu_sim]") {
  Rng rng(31);
  int lists = 0, tensors = 0, empty = 0, misaligned = 0;
  int64_t elements = 0;
  for (int list = 0; list < 2000; ++list) {
    std::vector<HostTensor> hosts;
    const int n = static_cast<int>(rng.Below(list % 100 == 0 ? 400 : 24));
    for (int i = 0; i < n; ++i) {
      const DType d = kDTypes[rng.Below(3)];
      const int64_t offset = rng.Below(8);  // start anywhere in a 16-byte line
      hosts.emplace_back(d, RandomNumel(rng), offset);
      FillGrad(&hosts.back(), rng, rng.Below(4) == 0 ? 0.01 : 0.0);
      empty += hosts.back().numel() == 0;
      misaligned += offset * DTypeSize(d) % 16 != 0;
      elements += hosts.back().numel();
    }
    const std::vector<TensorView> views = Views(hosts);
    const bool per_tensor = rng.Below(2) == 0;
    GradStatsOptions options;
    options.per_tensor = per_tensor;
    GradStats want;
    REQUIRE(ReferenceGradStats(views.data(), views.size(), options, &want)
                .ok());
    const SimResult got = SimulateGradStatsPlan(views, per_tensor, nullptr);
    INFO("list " << list << " of " << n << " tensors");
    REQUIRE(got.errors == "");
    REQUIRE(got.elements_visited == want.numel);
    const std::string mismatch = GradStatsMismatch(got.stats, want, 1e-9);
    REQUIRE(mismatch == "");
    ++lists;
    tensors += n;
  }
  // The lists did cover what they are meant to.
  CHECK(lists == 2000);
  CHECK(empty > 1000);
  CHECK(misaligned > tensors / 2);
  CHECK(elements > 100'000'000);
}

TEST_CASE("simulated gpu plan indexes more than 2^31 elements",
          "[partition][gpu_sim]") {
  // Fake device addresses: never dereferenced (indexing only), chosen
  // misaligned within a 16-byte line.
  const auto at = [](uintptr_t a) { return reinterpret_cast<const void*>(a); };
  const int64_t two31 = int64_t{1} << 31;
  std::vector<TensorView> views = {
      {at(0x7f0000000002), DType::kBFloat16, two31 + 12345},
      {nullptr, DType::kFloat32, 0},
      {at(0x7f2000000004), DType::kFloat32, 300'000'001},
      {at(0x7f4000000006), DType::kFloat16, (int64_t{1} << 30) + 7},
      {at(0x7f6000000000), DType::kBFloat16, 5},
  };
  const std::vector<double> constant = {0.5, 0.0, -3.0, 0.25, NAN};
  REQUIRE(ValidateTensorViews(views.data(), views.size()).ok());
  const SimResult got =
      SimulateGradStatsPlan(views, true, constant.data(), false);
  REQUIRE(got.errors == "");
  GradStats want;
  want.tensor_sum_squares.assign(views.size(), 0.0);
  want.tensor_nonfinite.assign(views.size(), 0);
  want.tensor_max_abs.assign(views.size(), 0.0);
  for (size_t t = 0; t < views.size(); ++t) {
    const double n = static_cast<double>(views[t].numel);
    want.numel += views[t].numel;
    if (std::isnan(constant[t])) {
      want.nonfinite += views[t].numel;
      want.tensor_nonfinite[t] = views[t].numel;
      continue;
    }
    const double sq = n * constant[t] * constant[t];
    want.sum_squares += sq;
    want.tensor_sum_squares[t] = sq;
    want.tensor_max_abs[t] = std::fabs(constant[t]);
    want.max_abs = std::fmax(want.max_abs, std::fabs(constant[t]));
  }
  CHECK(want.numel > two31 + (int64_t{1} << 30));
  CHECK(got.elements_visited == want.numel);
  CHECK(got.stats.numel == want.numel);
  const std::string mismatch = GradStatsMismatch(got.stats, want, 1e-9);
  CHECK(mismatch == "");
}

TEST_CASE("simulated finalize grid gives each of many tensors one warp",
          "[partition][gpu_sim]") {
  // More tensors than one finalize block has warps, and a count that leaves
  // the last block partly idle.
  for (const int count : {1, 31, 32, 33, 1000, 4097}) {
    INFO(count << " tensors");
    CHECK(internal::FinalizeGrid(count, true) ==
          1 + (count + internal::kFinalTensorsPerBlock - 1) /
                  internal::kFinalTensorsPerBlock);
    CHECK(internal::FinalizeGrid(count, false) == 1);
    Rng rng(40 + count);
    std::vector<HostTensor> hosts;
    for (int i = 0; i < count; ++i) {
      hosts.emplace_back(kDTypes[rng.Below(3)], rng.Below(40), rng.Below(4));
      FillGrad(&hosts.back(), rng, 0.02);
    }
    const auto views = Views(hosts);
    GradStatsOptions options;
    options.per_tensor = true;
    GradStats want;
    REQUIRE(ReferenceGradStats(views.data(), views.size(), options, &want)
                .ok());
    const SimResult got = SimulateGradStatsPlan(views, true, nullptr);
    CHECK(got.errors == "");
    const std::string mismatch = GradStatsMismatch(got.stats, want, 1e-9);
    CHECK(mismatch == "");
  }
}

}  // namespace
}  // namespace trainwatch::kernels::testing
