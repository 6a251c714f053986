// The cross entropy + z-loss reference: its gradient against central finite
// differences of its own loss, and its loss against the closed form.

#include "trainwatch/kernels/cross_entropy.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "test_data.h"
#include "trainwatch/kernels/reference.h"

namespace trainwatch::kernels {
namespace {

double TotalLoss(const std::vector<float>& logits, int64_t rows, int64_t vocab,
                 const std::vector<int32_t>& labels, double alpha) {
  CrossEntropyOptions o;
  o.labels = labels.data();
  o.z_loss_alpha = alpha;
  CrossEntropyResult r;
  const LogitsView v{logits.data(), DType::kFloat32, rows, vocab, 0};
  REQUIRE(ReferenceCrossEntropyZLoss(v, o, &r).ok());
  return r.loss_sum;
}

TEST_CASE("cross entropy z-loss gradient matches finite differences",
          "[xent]") {
  const int64_t rows = 3, vocab = 7;
  const double alpha = GENERATE(0.0, 1e-4, 0.5);
  INFO("alpha " << alpha);
  std::vector<float> logits(rows * vocab);
  testing::Rng rng(5);
  for (auto& x : logits) x = static_cast<float>(3.0 * rng.Normalish() + 2.0);
  const std::vector<int32_t> labels = {2, -100, 6};
  std::vector<float> grad(rows * vocab, -1.0f);
  CrossEntropyOptions o;
  o.labels = labels.data();
  o.z_loss_alpha = alpha;
  o.grad_logits = grad.data();
  CrossEntropyResult r;
  REQUIRE(ReferenceCrossEntropyZLoss(
              LogitsView{logits.data(), DType::kFloat32, rows, vocab, 0}, o, &r)
              .ok());
  CHECK(r.rows_counted == 2);
  for (int64_t k = 0; k < rows * vocab; ++k) {
    std::vector<float> up = logits, down = logits;
    const float h = 1e-2f;
    up[k] += h;
    down[k] -= h;
    const double fd = (TotalLoss(up, rows, vocab, labels, alpha) -
                       TotalLoss(down, rows, vocab, labels, alpha)) /
                      (static_cast<double>(up[k]) - down[k]);
    INFO("element " << k);
    CHECK(std::fabs(grad[k] - fd) < 2e-4);
  }
  for (int64_t j = 0; j < vocab; ++j) CHECK(grad[vocab + j] == 0.0f);
}

TEST_CASE("cross entropy z-loss forward matches the closed form", "[xent]") {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  const std::vector<int32_t> labels = {0};
  const double log_z = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  CrossEntropyOptions o;
  o.labels = labels.data();
  o.z_loss_alpha = 1e-4;
  float row_loss = 0;
  o.row_loss = &row_loss;
  CrossEntropyResult r;
  REQUIRE(ReferenceCrossEntropyZLoss(
              LogitsView{logits.data(), DType::kFloat32, 1, 3, 0}, o, &r)
              .ok());
  CHECK(std::fabs(r.loss_sum - (log_z - 1.0 + 1e-4 * log_z * log_z)) < 1e-12);
  CHECK(std::fabs(r.z_loss_sum - 1e-4 * log_z * log_z) < 1e-15);
  CHECK(std::fabs(r.log_z_sum - log_z) < 1e-12);
  CHECK(std::fabs(row_loss - r.loss_sum) < 1e-6);
  CHECK(std::fabs(r.mean_loss() - r.loss_sum) < 1e-15);

  const std::vector<int32_t> bad = {3};
  o.labels = bad.data();
  REQUIRE(ReferenceCrossEntropyZLoss(
              LogitsView{logits.data(), DType::kFloat32, 1, 3, 0}, o, &r)
              .ok());
  CHECK(r.invalid_labels == 1);
  CHECK(std::isnan(r.loss_sum));
  o.labels = nullptr;
  CHECK(ReferenceCrossEntropyZLoss(
            LogitsView{logits.data(), DType::kFloat32, 1, 3, 0}, o, &r)
            .code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trainwatch::kernels

namespace trainwatch::kernels {
namespace {

TEST_CASE("cross entropy accepts an in-place gradient and rejects partial "
          "overlap",
          "[cross_entropy]") {
  std::vector<float> buf(8 * 100 + 64);
  std::vector<int32_t> labels(8, 1);
  const LogitsView logits{buf.data(), DType::kFloat32, 8, 90, 100};
  CrossEntropyOptions o;
  o.labels = labels.data();
  // Exactly in place: same pointer, same row stride.
  o.grad_logits = buf.data();
  o.grad_row_stride = 100;
  CHECK(ValidateCrossEntropyArgs(logits, o).ok());
  // Disjoint.
  o.grad_row_stride = 0;
  std::vector<float> other(8 * 90);
  o.grad_logits = other.data();
  CHECK(ValidateCrossEntropyArgs(logits, o).ok());
  // Shifted by an element, the same pointer with another stride, the last
  // row sharing the first's memory: each would race on a GPU.
  for (const auto& [ptr, stride] :
       {std::pair<float*, int64_t>{buf.data() + 1, 100},
        std::pair<float*, int64_t>{buf.data(), 90},
        std::pair<float*, int64_t>{buf.data() + 7 * 100 + 89, 0}}) {
    o.grad_logits = ptr;
    o.grad_row_stride = stride;
    const Status s = ValidateCrossEntropyArgs(logits, o);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("overlaps") != std::string::npos);
    CrossEntropyResult r;
    CHECK(ReferenceCrossEntropyZLoss(logits, o, &r).code() ==
          StatusCode::kInvalidArgument);
  }
}

TEST_CASE("cross entropy reference in place matches out of place",
          "[cross_entropy]") {
  const int64_t rows = 6, vocab = 301;
  testing::Rng rng(77);
  testing::HostTensor t(DType::kFloat32, rows * vocab);
  testing::FillLogits(&t, rows, vocab, vocab, rng);
  std::vector<int32_t> labels = {0, 5, 300, -100, 17, 42};
  testing::HostTensor out(DType::kFloat32, rows * vocab);
  CrossEntropyOptions o;
  o.labels = labels.data();
  o.z_loss_alpha = 1e-4;
  o.grad_logits = out.mutable_data();
  CrossEntropyResult want, got;
  const LogitsView v{t.data(), DType::kFloat32, rows, vocab, 0};
  REQUIRE(ReferenceCrossEntropyZLoss(v, o, &want).ok());
  o.grad_logits = t.mutable_data();
  REQUIRE(ReferenceCrossEntropyZLoss(v, o, &got).ok());
  CHECK(got.loss_sum == want.loss_sum);
  CHECK(std::memcmp(t.data(), out.data(), out.bytes()) == 0);
}

}  // namespace
}  // namespace trainwatch::kernels
