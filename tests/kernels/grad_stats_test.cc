// ComputeGradStats (every CPU path) against ReferenceGradStats.

#include "trainwatch/kernels/grad_stats.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "test_data.h"
#include "trainwatch/kernels/reference.h"

namespace trainwatch::kernels {
namespace {

using testing::CheckGradStats;
using testing::HostTensor;
using testing::Rng;

std::vector<CpuPath> Paths() {
  std::vector<CpuPath> paths = {CpuPath::kPortable};
  if (CpuPathSupported(CpuPath::kAvx2)) paths.push_back(CpuPath::kAvx2);
  return paths;
}

TEST_CASE("grad stats of thousands of tiny tensors match the reference",
          "[grad]") {
  Rng rng(1);
  const auto tensors = testing::ManySmallTensors(rng, 3000, 0.05);
  const auto views = testing::Views(tensors);
  GradStatsOptions options;
  options.per_tensor = true;
  GradStats want;
  REQUIRE(ReferenceGradStats(views.data(), views.size(), options, &want).ok());
  REQUIRE(want.nonfinite > 0);
  for (CpuPath path : Paths()) {
    INFO("path " << CpuPathName(path));
    options.cpu_path = path;
    GradStats got;
    REQUIRE(ComputeGradStats(views, options, &got).ok());
    CheckGradStats(got, want);
    GradStats again;
    REQUIRE(ComputeGradStats(views, options, &again).ok());
    CHECK(testing::BitIdentical(got, again));
  }
}

TEST_CASE(
    "grad stats of a 16M-element tensor match the reference for every dtype",
    "[grad]") {
  const DType dtype =
      GENERATE(DType::kFloat32, DType::kBFloat16, DType::kFloat16);
  INFO("dtype " << DTypeName(dtype));
  Rng rng(2 + static_cast<int>(dtype));
  HostTensor t(dtype, 16 * 1024 * 1024 + 5);
  testing::FillGrad(&t, rng, 0.0);
  // A few specials at known places, including piece boundaries.
  for (int64_t i : {int64_t{0}, int64_t{4095}, int64_t{4096}, int64_t{123457},
                    t.numel() - 1}) {
    t.SetBits(i, testing::SpecialBits(dtype, rng));
  }
  const TensorView view = t.view();
  GradStatsOptions options;
  GradStats want;
  REQUIRE(ReferenceGradStats(&view, 1, options, &want).ok());
  for (CpuPath path : Paths()) {
    INFO("path " << CpuPathName(path));
    options.cpu_path = path;
    GradStats got, again;
    REQUIRE(ComputeGradStats(&view, 1, options, &got).ok());
    CheckGradStats(got, want);
    REQUIRE(ComputeGradStats(&view, 1, options, &again).ok());
    CHECK(testing::BitIdentical(got, again));
  }
}

TEST_CASE("a huge finite gradient is not counted as nonfinite", "[grad]") {
  // 1e30^2 overflows fp32: the piece is summed again in fp64.
  const DType dtype = GENERATE(DType::kFloat32, DType::kBFloat16);
  HostTensor t(dtype, 10000);
  for (int64_t i = 0; i < t.numel(); ++i) t.Set(i, 1.0f);
  t.Set(17, 1e30f);
  t.Set(9000, -1e30f);
  const double big = testing::LoadAsDoubleForTest(t, 17);
  const TensorView view = t.view();
  for (CpuPath path : Paths()) {
    INFO("path " << CpuPathName(path));
    GradStatsOptions options;
    options.cpu_path = path;
    GradStats got;
    REQUIRE(ComputeGradStats(&view, 1, options, &got).ok());
    CHECK(got.nonfinite == 0);
    CHECK(got.max_abs == big);
    CHECK(std::isfinite(got.sum_squares));
    CHECK(testing::Near(got.sum_squares, 2 * big * big + 9998.0, 1e-12));
    CHECK(std::isfinite(got.norm()));
  }
}

TEST_CASE(
    "a huge or nonfinite value in any accumulator lane of a 16-bit piece is "
    "seen",
    "[grad]") {
  // The AVX2 16-bit pass keeps eight accumulators over 64 values, then a
  // 16-value loop, then scalars: put the value in each of them, in the first
  // piece and in the second (the piece walk restarts the lanes).
  const DType dtype = GENERATE(DType::kBFloat16, DType::kFloat16);
  const int64_t numel = 4096 + 64 + 16 + 5;
  INFO("dtype " << DTypeName(dtype));
  for (int64_t at = 0; at < numel; at += 7) {
    INFO("at " << at);
    HostTensor t(dtype, numel);
    for (int64_t i = 0; i < numel; ++i) t.Set(i, 0.5f);
    const double rest = 0.25 * static_cast<double>(numel - 1);
    for (CpuPath path : Paths()) {
      INFO("path " << CpuPathName(path));
      GradStatsOptions options;
      options.cpu_path = path;
      const TensorView view = t.view();
      GradStats got;
      // fp16's largest value squares to 4.3e9: no overflow, but a max.
      t.Set(at, dtype == DType::kBFloat16 ? -1e30f : -65504.0f);
      const double big = testing::LoadAsDoubleForTest(t, at);
      REQUIRE(ComputeGradStats(&view, 1, options, &got).ok());
      CHECK(got.nonfinite == 0);
      CHECK(got.max_abs == -big);
      CHECK(testing::Near(got.sum_squares, big * big + rest, 1e-6));
      t.SetBits(at, dtype == DType::kBFloat16 ? 0x7fc0 : 0xfc00);  // NaN, -inf
      REQUIRE(ComputeGradStats(&view, 1, options, &got).ok());
      CHECK(got.nonfinite == 1);
      CHECK(got.max_abs == 0.5);
      CHECK(testing::Near(got.sum_squares, rest, 1e-6));
      t.Set(at, 0.5f);
    }
  }
}

TEST_CASE("fp16 and bf16 extremes are finite and exact", "[grad]") {
  HostTensor h(DType::kFloat16, 3);
  h.SetBits(0, 0x7bff);  // 65504
  h.SetBits(1, 0xfbff);  // -65504
  h.SetBits(2, 0x7c00);  // inf
  HostTensor b(DType::kBFloat16, 2);
  b.SetBits(0, 0x7f7f);  // bf16 max
  b.SetBits(1, 0xff81);  // NaN
  const TensorView views[] = {h.view(), b.view()};
  const double bmax = static_cast<double>(BFloat16BitsToFloat(0x7f7f));
  for (CpuPath path : Paths()) {
    INFO("path " << CpuPathName(path));
    GradStatsOptions options;
    options.cpu_path = path;
    options.per_tensor = true;
    GradStats got;
    REQUIRE(ComputeGradStats(views, 2, options, &got).ok());
    CHECK(got.nonfinite == 2);
    CHECK(got.numel == 5);
    CHECK(got.max_abs == bmax);
    CHECK(got.tensor_max_abs[0] == 65504.0);
    CHECK(got.tensor_sum_squares[0] == 2.0 * 65504.0 * 65504.0);
    CHECK(got.tensor_nonfinite[1] == 1);
    CHECK(testing::Near(got.tensor_sum_squares[1], bmax * bmax, 1e-12));
  }
}

TEST_CASE("grad stats of nothing are zero", "[grad]") {
  GradStats got;
  got.sum_squares = 5;
  got.tensor_sum_squares = {1, 2, 3};
  REQUIRE(ComputeGradStats(nullptr, 0, GradStatsOptions(), &got).ok());
  CHECK(got.sum_squares == 0.0);
  CHECK(got.nonfinite == 0);
  CHECK(got.numel == 0);
  CHECK(got.max_abs == 0.0);
  CHECK(got.tensor_sum_squares.empty());
  CHECK(got.nonfinite_fraction() == 0.0);

  const TensorView empty{nullptr, DType::kBFloat16, 0};
  GradStatsOptions options;
  options.per_tensor = true;
  REQUIRE(ComputeGradStats(&empty, 1, options, &got).ok());
  CHECK(got.tensor_sum_squares == std::vector<double>{0.0});
}

TEST_CASE("bad views are rejected with InvalidArgument", "[grad]") {
  float x[4] = {1, 2, 3, 4};
  GradStats out;
  const GradStatsOptions options;
  TensorView v{nullptr, DType::kFloat32, 3};
  CHECK(ComputeGradStats(&v, 1, options, &out).code() ==
        StatusCode::kInvalidArgument);
  v = TensorView{x, static_cast<DType>(7), 3};
  CHECK(ComputeGradStats(&v, 1, options, &out).code() ==
        StatusCode::kInvalidArgument);
  v = TensorView{x, DType::kFloat32, -1};
  CHECK(ComputeGradStats(&v, 1, options, &out).code() ==
        StatusCode::kInvalidArgument);
  v = TensorView{reinterpret_cast<const char*>(x) + 1, DType::kFloat32, 2};
  const Status misaligned = ComputeGradStats(&v, 1, options, &out);
  CHECK(misaligned.code() == StatusCode::kInvalidArgument);
  CHECK(misaligned.message().find("aligned") != std::string::npos);
  CHECK(ComputeGradStats(nullptr, 2, options, &out).code() ==
        StatusCode::kInvalidArgument);
  v = TensorView{x, DType::kFloat32, 4};
  CHECK(ComputeGradStats(&v, 1, options, nullptr).code() ==
        StatusCode::kInvalidArgument);
  GradStatsOptions bad_path;
  bad_path.cpu_path = static_cast<CpuPath>(99);
  CHECK(ComputeGradStats(&v, 1, bad_path, &out).code() ==
        StatusCode::kUnavailable);
}

}  // namespace
}  // namespace trainwatch::kernels
