// The CUDA kernels against the fp64 reference: the CPU tests' data, copied to
// the device. Tagged [gpu]; without CUDA in the build or a device in the
// machine each case prints the skip marker and returns, and CTest reports it
// as skipped.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "test_data.h"
#include "trainwatch/kernels/reference.h"

#if defined(TRAINWATCH_KERNELS_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "trainwatch/kernels/cuda.h"
#endif

#ifndef TRAINWATCH_KERNELS_SKIP_MARKER
#define TRAINWATCH_KERNELS_SKIP_MARKER "TRAINWATCH_TEST_SKIPPED"
#endif

namespace trainwatch::kernels {
namespace {

using testing::HostTensor;
using testing::Rng;

#if !defined(TRAINWATCH_KERNELS_HAVE_CUDA)

TEST_CASE("gpu kernels", "[gpu]") {
  WARN(TRAINWATCH_KERNELS_SKIP_MARKER ": built without CUDA");
}

#else

#define TW_REQUIRE_GPU()                                       \
  do {                                                         \
    if (CudaDeviceCount() == 0) {                              \
      WARN(TRAINWATCH_KERNELS_SKIP_MARKER ": no CUDA device"); \
      return;                                                  \
    }                                                          \
  } while (0)

#define TW_CUDA_CHECK(call) REQUIRE((call) == cudaSuccess)

// A device copy of a host buffer, freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) TW_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  DeviceBuffer(const void* host, size_t bytes) : DeviceBuffer(bytes) {
    if (bytes > 0)
      TW_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// Copies every tensor to the device keeping its misalignment (byte offset
// within a 16-byte line), and returns device views.
struct DeviceTensors {
  explicit DeviceTensors(const std::vector<HostTensor>& hosts) {
    for (const auto& h : hosts) {
      const size_t shift = reinterpret_cast<uintptr_t>(h.data()) % 16;
      buffers.push_back(std::make_unique<DeviceBuffer>(h.bytes() + 16));
      char* dst = static_cast<char*>(buffers.back()->get()) + shift;
      if (h.bytes() > 0) {
        TW_CUDA_CHECK(
            cudaMemcpy(dst, h.data(), h.bytes(), cudaMemcpyHostToDevice));
      }
      views.push_back(
          TensorView{h.numel() == 0 ? nullptr : dst, h.dtype(), h.numel()});
    }
  }
  std::vector<std::unique_ptr<DeviceBuffer> > buffers;
  std::vector<TensorView> views;
};

TEST_CASE("gpu grad stats of thousands of tiny tensors match the reference",
          "[gpu]") {
  TW_REQUIRE_GPU();
  Rng rng(1);
  const auto hosts = testing::ManySmallTensors(rng, 3000, 0.05);
  const auto host_views = testing::Views(hosts);
  GradStatsOptions options;
  options.per_tensor = true;
  GradStats want;
  REQUIRE(
      ReferenceGradStats(host_views.data(), host_views.size(), options, &want)
          .ok());
  DeviceTensors dev(hosts);
  std::unique_ptr<GradStatsGpuPlan> plan;
  REQUIRE(GradStatsGpuPlan::Create(dev.views.data(), dev.views.size(), options,
                                   &plan)
              .ok());
  GradStats got, again;
  REQUIRE(plan->Launch(nullptr).ok());
  REQUIRE(plan->ReadbackAsync(nullptr).ok());
  TW_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  REQUIRE(plan->Result(&got).ok());
  testing::CheckGradStats(got, want);
  REQUIRE(plan->Launch(nullptr).ok());
  REQUIRE(plan->ReadbackAsync(nullptr).ok());
  TW_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  REQUIRE(plan->Result(&again).ok());
  CHECK(testing::BitIdentical(got, again));
}

TEST_CASE(
    "gpu grad stats of a 16M-element tensor match the reference for every "
    "dtype",
    "[gpu]") {
  TW_REQUIRE_GPU();
  const DType dtype =
      GENERATE(DType::kFloat32, DType::kBFloat16, DType::kFloat16);
  INFO("dtype " << DTypeName(dtype));
  Rng rng(2 + static_cast<int>(dtype));
  HostTensor t(dtype, 16 * 1024 * 1024 + 5, 1);  // misaligned start
  testing::FillGrad(&t, rng, 1e-6);
  t.Set(12345, 1e30f);  // overflows fp32 squares (fp16: becomes inf)
  const TensorView hv = t.view();
  GradStats want;
  REQUIRE(ReferenceGradStats(&hv, 1, GradStatsOptions(), &want).ok());
  DeviceBuffer buf(t.bytes() + 16);
  char* dst = static_cast<char*>(buf.get()) +
              reinterpret_cast<uintptr_t>(t.data()) % 16;
  TW_CUDA_CHECK(cudaMemcpy(dst, t.data(), t.bytes(), cudaMemcpyHostToDevice));
  const TensorView dv{dst, dtype, t.numel()};
  GradStats got, again;
  REQUIRE(ComputeGradStatsGpu(&dv, 1, GradStatsOptions(), nullptr, &got).ok());
  testing::CheckGradStats(got, want);
  REQUIRE(
      ComputeGradStatsGpu(&dv, 1, GradStatsOptions(), nullptr, &again).ok());
  CHECK(testing::BitIdentical(got, again));
}

TEST_CASE("gpu grad stats launch two kernels for a thousand tensors", "[gpu]") {
  TW_REQUIRE_GPU();
  Rng rng(3);
  std::vector<HostTensor> hosts;
  for (int i = 0; i < 1000; ++i) {
    hosts.emplace_back(DType::kBFloat16, 1 + rng.Below(5000));
    testing::FillGrad(&hosts.back(), rng, 0.0);
  }
  DeviceTensors dev(hosts);
  std::unique_ptr<GradStatsGpuPlan> plan;
  REQUIRE(GradStatsGpuPlan::Create(dev.views.data(), dev.views.size(),
                                   GradStatsOptions(), &plan)
              .ok());
  // Capturing into a graph both counts the kernels and proves Launch() never
  // synchronizes (a sync inside a capture is an error).
  cudaStream_t stream;
  TW_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  TW_CUDA_CHECK(
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  REQUIRE(plan->Launch(stream).ok());
  REQUIRE(plan->ReadbackAsync(stream).ok());
  cudaGraph_t graph;
  TW_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  size_t n = 0;
  TW_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  TW_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  int kernels = 0;
  for (auto node : nodes) {
    cudaGraphNodeType type;
    TW_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    kernels += type == cudaGraphNodeTypeKernel ? 1 : 0;
  }
  CHECK(kernels <= 2);
  cudaGraphExec_t exec;
  TW_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TW_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
  GradStats got, want;
  REQUIRE(plan->Result(&got).ok());
  const auto hv = testing::Views(hosts);
  REQUIRE(
      ReferenceGradStats(hv.data(), hv.size(), GradStatsOptions(), &want).ok());
  testing::CheckGradStats(got, want);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("gpu grad stats plan follows rebound buffers", "[gpu]") {
  TW_REQUIRE_GPU();
  Rng rng(4);
  std::vector<HostTensor> a, b;
  for (int i = 0; i < 20; ++i) {
    const int64_t n = rng.Below(100000);
    a.emplace_back(DType::kFloat32, n);
    b.emplace_back(DType::kFloat32, n);
    testing::FillGrad(&a.back(), rng, 0.001);
    testing::FillGrad(&b.back(), rng, 0.001);
  }
  DeviceTensors da(a), db(b);
  std::unique_ptr<GradStatsGpuPlan> plan;
  GradStatsOptions options;
  options.per_tensor = true;
  REQUIRE(
      GradStatsGpuPlan::Create(da.views.data(), da.views.size(), options, &plan)
          .ok());
  REQUIRE(plan->Rebind(db.views.data(), db.views.size(), nullptr).ok());
  REQUIRE(plan->Launch(nullptr).ok());
  REQUIRE(plan->ReadbackAsync(nullptr).ok());
  TW_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  GradStats got, want;
  REQUIRE(plan->Result(&got).ok());
  const auto hv = testing::Views(b);
  REQUIRE(ReferenceGradStats(hv.data(), hv.size(), options, &want).ok());
  testing::CheckGradStats(got, want);
  CHECK(plan->Rebind(db.views.data(), 3, nullptr).code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("gpu logit stats match the reference", "[gpu]") {
  TW_REQUIRE_GPU();
  const DType dtype =
      GENERATE(DType::kFloat32, DType::kBFloat16, DType::kFloat16);
  INFO("dtype " << DTypeName(dtype));
  const int64_t rows = 57, vocab = 32003, stride = 32011;
  HostTensor t(dtype, rows * stride);
  Rng rng(9);
  testing::FillLogits(&t, rows, vocab, stride, rng);
  std::vector<int32_t> labels(rows);
  std::vector<uint8_t> mask(rows, 1);
  for (int64_t r = 0; r < rows; ++r) {
    labels[r] = rng.Uniform() < 0.2 ? -100 : 0;
    if (rng.Uniform() < 0.1) mask[r] = 0;
  }
  labels[0] = labels[1] = labels[2] = 0;
  mask[0] = mask[1] = mask[2] = 1;
  t.Set(0 * stride + 100, std::nanf(""));
  t.Set(1 * stride + 7, std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < vocab; ++j)
    t.Set(2 * stride + j, -std::numeric_limits<float>::infinity());
  const LogitsView hv{t.data(), dtype, rows, vocab, stride};
  std::vector<float> want_rows(rows), got_rows(rows);
  LogitStatsOptions ho;
  ho.labels = labels.data();
  ho.row_mask = mask.data();
  ho.row_log_z = want_rows.data();
  LogitStats want;
  REQUIRE(ReferenceLogitStats(hv, ho, &want).ok());

  DeviceBuffer dlogits(t.data(), t.bytes());
  DeviceBuffer dlabels(labels.data(), labels.size() * sizeof(int32_t));
  DeviceBuffer dmask(mask.data(), mask.size());
  DeviceBuffer drows(rows * sizeof(float));
  LogitStatsOptions o;
  o.labels = static_cast<const int32_t*>(dlabels.get());
  o.row_mask = static_cast<const uint8_t*>(dmask.get());
  o.row_log_z = static_cast<float*>(drows.get());
  const LogitsView dv{dlogits.get(), dtype, rows, vocab, stride};
  LogitStats got, again;
  REQUIRE(ComputeLogitStatsGpu(dv, o, nullptr, &got).ok());
  TW_CUDA_CHECK(cudaMemcpy(got_rows.data(), drows.get(), rows * sizeof(float),
                           cudaMemcpyDeviceToHost));
  testing::CheckLogitStats(got, want, 1e-4);
  CHECK(testing::RowLogZMismatches(got_rows, want_rows, 1e-4) == 0);
  REQUIRE(ComputeLogitStatsGpu(dv, o, nullptr, &again).ok());
  CHECK(testing::SameDouble(got.sum_log_z, again.sum_log_z));
}

TEST_CASE("gpu cross entropy with z-loss matches the reference", "[gpu]") {
  TW_REQUIRE_GPU();
  const DType dtype = GENERATE(DType::kFloat32, DType::kBFloat16);
  INFO("dtype " << DTypeName(dtype));
  const int64_t rows = 33, vocab = 4099;
  HostTensor t(dtype, rows * vocab);
  Rng rng(12);
  testing::FillLogits(&t, rows, vocab, vocab, rng);
  std::vector<int32_t> labels(rows);
  for (int64_t r = 0; r < rows; ++r) {
    labels[r] =
        rng.Uniform() < 0.2 ? -100 : static_cast<int32_t>(rng.Below(vocab));
  }
  labels[5] = vocab + 3;  // invalid
  const LogitsView hv{t.data(), dtype, rows, vocab, 0};
  HostTensor want_grad(dtype, rows * vocab), got_grad(dtype, rows * vocab);
  CrossEntropyOptions ho;
  ho.labels = labels.data();
  ho.z_loss_alpha = 1e-4;
  ho.grad_scale = 1.0 / 16;
  ho.grad_logits = want_grad.mutable_data();
  CrossEntropyResult want;
  REQUIRE(ReferenceCrossEntropyZLoss(hv, ho, &want).ok());

  DeviceBuffer dlogits(t.data(), t.bytes());
  DeviceBuffer dlabels(labels.data(), labels.size() * sizeof(int32_t));
  DeviceBuffer dgrad(got_grad.bytes());
  CrossEntropyOptions o = ho;
  o.labels = static_cast<const int32_t*>(dlabels.get());
  o.grad_logits = dgrad.get();
  CrossEntropyResult got;
  REQUIRE(
      ComputeCrossEntropyZLossGpu(
          LogitsView{dlogits.get(), dtype, rows, vocab, 0}, o, nullptr, &got)
          .ok());
  TW_CUDA_CHECK(cudaMemcpy(got_grad.mutable_data(), dgrad.get(),
                           got_grad.bytes(), cudaMemcpyDeviceToHost));
  CHECK(got.rows_counted == want.rows_counted);
  CHECK(got.invalid_labels == 1);
  CHECK(std::isnan(got.loss_sum));
  CHECK(std::fabs(got.z_loss_sum - want.z_loss_sum) < 1e-6 * want.rows_counted);
  CHECK(std::fabs(got.log_z_sum - want.log_z_sum) < 1e-4 * want.rows_counted);
  // Gradients agree to the dtype's rounding (bf16: 2^-8 relative) plus the
  // approximate exp.
  const double rel = dtype == DType::kFloat32 ? 1e-4 : 1e-2;
  size_t bad = 0;
  for (int64_t k = 0; k < rows * vocab; ++k) {
    if (k / vocab == 5) continue;  // the invalid row is NaN on both sides
    const double g = testing::LoadAsDoubleForTest(got_grad, k);
    const double w = testing::LoadAsDoubleForTest(want_grad, k);
    bad += std::fabs(g - w) <= rel * std::fabs(w) + 1e-7 ? 0 : 1;
  }
  CHECK(bad == 0);

  // Without the invalid label the loss itself matches.
  labels[5] = 1;
  TW_CUDA_CHECK(cudaMemcpy(dlabels.get(), labels.data(),
                           labels.size() * sizeof(int32_t),
                           cudaMemcpyHostToDevice));
  ho.grad_logits = nullptr;
  o.grad_logits = nullptr;
  REQUIRE(ReferenceCrossEntropyZLoss(hv, ho, &want).ok());
  REQUIRE(
      ComputeCrossEntropyZLossGpu(
          LogitsView{dlogits.get(), dtype, rows, vocab, 0}, o, nullptr, &got)
          .ok());
  CHECK(std::fabs(got.loss_sum - want.loss_sum) < 1e-4 * want.rows_counted);
}

#endif  // TRAINWATCH_KERNELS_HAVE_CUDA

}  // namespace
}  // namespace trainwatch::kernels
