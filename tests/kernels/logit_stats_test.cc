// ComputeLogitStats (every CPU path) against ReferenceLogitStats.

#include "trainwatch/kernels/logit_stats.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "test_data.h"
#include "trainwatch/kernels/reference.h"

namespace trainwatch::kernels {
namespace {

using testing::HostTensor;
using testing::Rng;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kRowTol = 2e-5;

std::vector<CpuPath> Paths() {
  std::vector<CpuPath> paths = {CpuPath::kPortable};
  if (CpuPathSupported(CpuPath::kAvx2)) paths.push_back(CpuPath::kAvx2);
  return paths;
}

// rows x vocab logits with padded rows, some ignored rows, and rows holding
// NaN, +inf, -inf and only -inf.
struct LogitCase {
  LogitCase(DType dtype, int64_t rows, int64_t vocab, int64_t stride,
            uint64_t seed)
      : t(dtype, rows * stride), labels(rows), mask(rows, 1) {
    Rng rng(seed);
    testing::FillLogits(&t, rows, vocab, stride, rng);
    view = LogitsView{t.data(), dtype, rows, vocab, stride};
    for (int64_t r = 0; r < rows; ++r) {
      labels[r] = static_cast<int32_t>(rng.Below(vocab));
      if (rng.Uniform() < 0.15) labels[r] = -100;
      if (rng.Uniform() < 0.1) mask[r] = 0;
    }
    if (rows >= 6) {
      labels[0] = labels[1] = labels[2] = labels[3] = labels[4] = 1;
      mask[0] = mask[1] = mask[2] = mask[3] = mask[4] = 1;
      t.Set(0 * stride + vocab / 2, std::nanf(""));
      t.Set(1 * stride + vocab - 1, kInf);
      t.Set(2 * stride + 3, -kInf);
      t.Set(2 * stride + vocab - 2, -kInf);
      for (int64_t j = 0; j < vocab; ++j) t.Set(3 * stride + j, -kInf);
      // A row whose max comes last, in the last partial chunk.
      t.Set(4 * stride + vocab - 1, 500.0f);
    }
  }
  HostTensor t;
  LogitsView view;
  std::vector<int32_t> labels;
  std::vector<uint8_t> mask;
};

TEST_CASE("logit stats match the reference for every dtype and path",
          "[logits]") {
  const DType dtype =
      GENERATE(DType::kFloat32, DType::kBFloat16, DType::kFloat16);
  INFO("dtype " << DTypeName(dtype));
  const int64_t rows = 41, vocab = 5003, stride = 5011;
  LogitCase c(dtype, rows, vocab, stride, 10 + static_cast<int>(dtype));
  LogitStatsOptions options;
  options.labels = c.labels.data();
  options.row_mask = c.mask.data();
  std::vector<float> want_rows(rows), got_rows(rows);
  options.row_log_z = want_rows.data();
  LogitStats want;
  REQUIRE(ReferenceLogitStats(c.view, options, &want).ok());
  CHECK(want.nonfinite_rows == 3);  // the NaN, +inf and all -inf rows
  for (CpuPath path : Paths()) {
    INFO("path " << CpuPathName(path));
    options.cpu_path = path;
    options.row_log_z = got_rows.data();
    LogitStats got, again;
    REQUIRE(ComputeLogitStats(c.view, options, &got).ok());
    testing::CheckLogitStats(got, want, kRowTol);
    CHECK(testing::RowLogZMismatches(got_rows, want_rows, kRowTol) == 0);
    CHECK(std::isnan(got_rows[0]));
    CHECK(got_rows[1] == kInf);
    CHECK(got_rows[3] == -kInf);
    REQUIRE(ComputeLogitStats(c.view, options, &again).ok());
    CHECK(testing::SameDouble(got.sum_log_z, again.sum_log_z));
  }
}

TEST_CASE("a NaN or an inf logit in any lane of the AVX2 row walk is seen",
          "[logits]") {
  // vocab = one 2048-logit chunk, then 59: the 16-logit loop (both halves),
  // the 8-logit step and the scalar tail. One special per row, at each of
  // those places; the AVX2 pass 1 goes the slow way only for a chunk with a
  // NaN or a +inf, and pass 2 masks +inf only there.
  const DType dtype =
      GENERATE(DType::kFloat32, DType::kBFloat16, DType::kFloat16);
  INFO("dtype " << DTypeName(dtype));
  const int64_t vocab = 2048 + 59;
  const int64_t at[] = {5, 13, 2048 + 20, 2048 + 29, 2048 + 50, 2048 + 57};
  const float special[] = {std::nanf(""), kInf, -kInf};
  const int64_t rows = 3 * 6;
  HostTensor t(dtype, rows * vocab);
  Rng rng(31);
  testing::FillLogits(&t, rows, vocab, vocab, rng);
  for (int64_t r = 0; r < rows; ++r) t.Set(r * vocab + at[r % 6], special[r / 6]);
  const LogitsView view{t.data(), dtype, rows, vocab, 0};
  LogitStatsOptions options;
  std::vector<float> want_rows(rows), got_rows(rows);
  options.row_log_z = want_rows.data();
  LogitStats want;
  REQUIRE(ReferenceLogitStats(view, options, &want).ok());
  for (CpuPath path : Paths()) {
    INFO("path " << CpuPathName(path));
    options.cpu_path = path;
    options.row_log_z = got_rows.data();
    LogitStats got;
    REQUIRE(ComputeLogitStats(view, options, &got).ok());
    testing::CheckLogitStats(got, want, kRowTol);
    CHECK(got.nonfinite_rows == 12);
    for (int64_t r = 0; r < rows; ++r) {
      INFO("row " << r << " special at " << at[r % 6]);
      if (r < 6) CHECK(std::isnan(got_rows[r]));
      if (r >= 6 && r < 12) CHECK(got_rows[r] == kInf);
    }
    CHECK(testing::RowLogZMismatches(got_rows, want_rows, kRowTol) == 0);
  }
}

TEST_CASE("logit stats of a 32k vocabulary match the reference", "[logits]") {
  const DType dtype = GENERATE(DType::kFloat32, DType::kBFloat16);
  const int64_t rows = 24, vocab = 32768;
  HostTensor t(dtype, rows * vocab);
  Rng rng(77);
  testing::FillLogits(&t, rows, vocab, vocab, rng);
  const LogitsView view{t.data(), dtype, rows, vocab, 0};
  LogitStats want;
  REQUIRE(ReferenceLogitStats(view, LogitStatsOptions(), &want).ok());
  for (CpuPath path : Paths()) {
    INFO("path " << CpuPathName(path));
    LogitStatsOptions options;
    options.cpu_path = path;
    LogitStats got;
    REQUIRE(ComputeLogitStats(view, options, &got).ok());
    testing::CheckLogitStats(got, want, kRowTol);
    CHECK(got.rows_counted == rows);
    CHECK(std::fabs(got.mean_log_z() - want.mean_log_z()) < kRowTol);
  }
}

TEST_CASE("logit stats ignore labelled rows without reading them", "[logits]") {
  // Row 1's data pointer region is garbage (NaN); its label is ignored.
  HostTensor t(DType::kFloat32, 3 * 4);
  const float v[12] = {0, 0, 0, 0, NAN, NAN, NAN, NAN, 1, 2, 3, 4};
  for (int i = 0; i < 12; ++i) t.Set(i, v[i]);
  const int32_t labels[3] = {0, -100, 2};
  LogitStatsOptions options;
  options.labels = labels;
  LogitStats got;
  REQUIRE(ComputeLogitStats(LogitsView{t.data(), DType::kFloat32, 3, 4, 0},
                            options, &got)
              .ok());
  CHECK(got.rows_counted == 2);
  CHECK(got.nonfinite_rows == 0);
  CHECK(got.max_logit == 4.0);
  const double want =
      std::log(4.0) +
      (4.0 + std::log(std::exp(-3.0) + std::exp(-2.0) + std::exp(-1.0) + 1.0));
  CHECK(std::fabs(got.sum_log_z - want) < 1e-5);
}

TEST_CASE("logit stats with no counted row", "[logits]") {
  LogitStats got;
  REQUIRE(ComputeLogitStats(LogitsView{nullptr, DType::kBFloat16, 0, 32000, 0},
                            LogitStatsOptions(), &got)
              .ok());
  CHECK(got.rows_counted == 0);
  CHECK(std::isnan(got.mean_log_z()));
  CHECK(got.max_logit == -std::numeric_limits<double>::infinity());
  const LogitsView bad{nullptr, DType::kFloat32, 2, 10, 5};
  CHECK(ComputeLogitStats(bad, LogitStatsOptions(), &got).code() ==
        StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainwatch::kernels
