// The CUDA kernels against the fp64 reference: the CPU tests' data, copied to
// the device. Tagged [gpu]; without CUDA in the build or a device in the
// machine each case prints the skip marker and returns, and CTest reports it
// as skipped.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "check.h"
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

TW_TEST_CASE("gpu kernels") { TW_SKIP("built without CUDA"); }

#else

#define TW_REQUIRE_GPU()                                       \
  do {                                                         \
    if (CudaDeviceCount() == 0) TW_SKIP("no CUDA device");    \
  } while (0)

#define TW_CUDA_CHECK(call) TW_REQUIRE((call) == cudaSuccess)

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

TW_TEST_CASE("gpu grad stats of thousands of tiny tensors match the reference") {
  TW_REQUIRE_GPU();
  Rng rng(1);
  const auto hosts = testing::ManySmallTensors(rng, 3000, 0.05);
  const auto host_views = testing::Views(hosts);
  GradStatsOptions options;
  options.per_tensor = true;
  GradStats want;
  TW_REQUIRE(
      ReferenceGradStats(host_views.data(), host_views.size(), options, &want)
          .ok());
  DeviceTensors dev(hosts);
  std::unique_ptr<GradStatsGpuPlan> plan;
  TW_REQUIRE(GradStatsGpuPlan::Create(dev.views.data(), dev.views.size(), options,
                                   &plan)
              .ok());
  GradStats got, again;
  TW_REQUIRE(plan->Launch(nullptr).ok());
  TW_REQUIRE(plan->ReadbackAsync(nullptr).ok());
  TW_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  TW_REQUIRE(plan->Result(&got).ok());
  testing::CheckGradStats(got, want);
  TW_REQUIRE(plan->Launch(nullptr).ok());
  TW_REQUIRE(plan->ReadbackAsync(nullptr).ok());
  TW_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  TW_REQUIRE(plan->Result(&again).ok());
  TW_CHECK(testing::BitIdentical(got, again));
}

TW_TEST_CASE("gpu grad stats of a 16M-element tensor match the reference for every "
    "dtype") {
  TW_REQUIRE_GPU();
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    TW_INFO("dtype " << DTypeName(dtype));
    Rng rng(2 + static_cast<int>(dtype));
    HostTensor t(dtype, 16 * 1024 * 1024 + 5, 1);  // misaligned start
    testing::FillGrad(&t, rng, 1e-6);
    t.Set(12345, 1e30f);  // overflows fp32 squares (fp16: becomes inf)
    const TensorView hv = t.view();
    GradStats want;
    TW_REQUIRE(ReferenceGradStats(&hv, 1, GradStatsOptions(), &want).ok());
    DeviceBuffer buf(t.bytes() + 16);
    char* dst = static_cast<char*>(buf.get()) +
                reinterpret_cast<uintptr_t>(t.data()) % 16;
    TW_CUDA_CHECK(cudaMemcpy(dst, t.data(), t.bytes(), cudaMemcpyHostToDevice));
    const TensorView dv{dst, dtype, t.numel()};
    GradStats got, again;
    TW_REQUIRE(ComputeGradStatsGpu(&dv, 1, GradStatsOptions(), nullptr, &got).ok());
    testing::CheckGradStats(got, want);
    TW_REQUIRE(
        ComputeGradStatsGpu(&dv, 1, GradStatsOptions(), nullptr, &again).ok());
    TW_CHECK(testing::BitIdentical(got, again));
  }
}

TW_TEST_CASE("gpu grad stats launch two kernels for a thousand tensors") {
  TW_REQUIRE_GPU();
  Rng rng(3);
  std::vector<HostTensor> hosts;
  for (int i = 0; i < 1000; ++i) {
    hosts.emplace_back(DType::kBFloat16, 1 + rng.Below(5000));
    testing::FillGrad(&hosts.back(), rng, 0.0);
  }
  DeviceTensors dev(hosts);
  std::unique_ptr<GradStatsGpuPlan> plan;
  TW_REQUIRE(GradStatsGpuPlan::Create(dev.views.data(), dev.views.size(),
                                   GradStatsOptions(), &plan)
              .ok());
  // Capturing into a graph both counts the kernels and proves Launch() never
  // synchronizes (a sync inside a capture is an error).
  cudaStream_t stream;
  TW_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  TW_CUDA_CHECK(
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  TW_REQUIRE(plan->Launch(stream).ok());
  TW_REQUIRE(plan->ReadbackAsync(stream).ok());
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
  TW_CHECK(kernels <= 2);
  cudaGraphExec_t exec;
  TW_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TW_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
  GradStats got, want;
  TW_REQUIRE(plan->Result(&got).ok());
  const auto hv = testing::Views(hosts);
  TW_REQUIRE(
      ReferenceGradStats(hv.data(), hv.size(), GradStatsOptions(), &want).ok());
  testing::CheckGradStats(got, want);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TW_TEST_CASE("gpu grad stats plan follows rebound buffers") {
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
  TW_REQUIRE(
      GradStatsGpuPlan::Create(da.views.data(), da.views.size(), options, &plan)
          .ok());
  TW_REQUIRE(plan->Rebind(db.views.data(), db.views.size(), nullptr).ok());
  TW_REQUIRE(plan->Launch(nullptr).ok());
  TW_REQUIRE(plan->ReadbackAsync(nullptr).ok());
  TW_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  GradStats got, want;
  TW_REQUIRE(plan->Result(&got).ok());
  const auto hv = testing::Views(b);
  TW_REQUIRE(ReferenceGradStats(hv.data(), hv.size(), options, &want).ok());
  testing::CheckGradStats(got, want);
  TW_CHECK(plan->Rebind(db.views.data(), 3, nullptr).code() ==
        StatusCode::kInvalidArgument);
}

TW_TEST_CASE("gpu logit stats match the reference") {
  TW_REQUIRE_GPU();
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    TW_INFO("dtype " << DTypeName(dtype));
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
    TW_REQUIRE(ReferenceLogitStats(hv, ho, &want).ok());

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
    TW_REQUIRE(ComputeLogitStatsGpu(dv, o, nullptr, &got).ok());
    TW_CUDA_CHECK(cudaMemcpy(got_rows.data(), drows.get(), rows * sizeof(float),
                             cudaMemcpyDeviceToHost));
    testing::CheckLogitStats(got, want, 1e-4);
    TW_CHECK(testing::RowLogZMismatches(got_rows, want_rows, 1e-4) == 0);
    TW_REQUIRE(ComputeLogitStatsGpu(dv, o, nullptr, &again).ok());
    TW_CHECK(testing::SameDouble(got.sum_log_z, again.sum_log_z));
  }
}

TW_TEST_CASE("gpu cross entropy with z-loss matches the reference") {
  TW_REQUIRE_GPU();
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    TW_INFO("dtype " << DTypeName(dtype));
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
    TW_REQUIRE(ReferenceCrossEntropyZLoss(hv, ho, &want).ok());

    DeviceBuffer dlogits(t.data(), t.bytes());
    DeviceBuffer dlabels(labels.data(), labels.size() * sizeof(int32_t));
    DeviceBuffer dgrad(got_grad.bytes());
    CrossEntropyOptions o = ho;
    o.labels = static_cast<const int32_t*>(dlabels.get());
    o.grad_logits = dgrad.get();
    CrossEntropyResult got;
    TW_REQUIRE(
        ComputeCrossEntropyZLossGpu(
            LogitsView{dlogits.get(), dtype, rows, vocab, 0}, o, nullptr, &got)
            .ok());
    TW_CUDA_CHECK(cudaMemcpy(got_grad.mutable_data(), dgrad.get(),
                             got_grad.bytes(), cudaMemcpyDeviceToHost));
    TW_CHECK(got.rows_counted == want.rows_counted);
    TW_CHECK(got.invalid_labels == 1);
    TW_CHECK(std::isnan(got.loss_sum));
    TW_CHECK(std::fabs(got.z_loss_sum - want.z_loss_sum) < 1e-6 * want.rows_counted);
    TW_CHECK(std::fabs(got.log_z_sum - want.log_z_sum) < 1e-4 * want.rows_counted);
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
    TW_CHECK(bad == 0);

    // Without the invalid label the loss itself matches.
    labels[5] = 1;
    TW_CUDA_CHECK(cudaMemcpy(dlabels.get(), labels.data(),
                             labels.size() * sizeof(int32_t),
                             cudaMemcpyHostToDevice));
    ho.grad_logits = nullptr;
    o.grad_logits = nullptr;
    TW_REQUIRE(ReferenceCrossEntropyZLoss(hv, ho, &want).ok());
    TW_REQUIRE(
        ComputeCrossEntropyZLossGpu(
            LogitsView{dlogits.get(), dtype, rows, vocab, 0}, o, nullptr, &got)
            .ok());
    TW_CHECK(std::fabs(got.loss_sum - want.loss_sum) < 1e-4 * want.rows_counted);
  }
}

// A stream of its own, destroyed with the object.
class NonBlockingStream {
 public:
  NonBlockingStream() {
    TW_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
  }
  ~NonBlockingStream() { cudaStreamDestroy(s_); }
  NonBlockingStream(const NonBlockingStream&) = delete;
  NonBlockingStream& operator=(const NonBlockingStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// Defect: Create uploaded its tables with plain cudaMemcpy from pageable
// memory, which may return before the copy has landed; a Launch on a
// cudaStreamNonBlocking stream is not ordered after it. Large tables and a
// launch right after Create, many times: each result must be right.
TW_TEST_CASE("gpu grad stats plan is complete when Create returns") {
  TW_REQUIRE_GPU();
  Rng rng(51);
  std::vector<HostTensor> hosts;
  for (int i = 0; i < 30000; ++i) {
    hosts.emplace_back(DType::kBFloat16, 1 + rng.Below(40), rng.Below(4));
    testing::FillGrad(&hosts.back(), rng, 0.001);
  }
  DeviceTensors dev(hosts);
  const auto hv = testing::Views(hosts);
  GradStatsOptions options;
  options.per_tensor = true;
  GradStats want;
  TW_REQUIRE(ReferenceGradStats(hv.data(), hv.size(), options, &want).ok());
  NonBlockingStream stream;
  int wrong = 0;
  for (int round = 0; round < 20; ++round) {
    std::unique_ptr<GradStatsGpuPlan> plan;
    TW_REQUIRE(GradStatsGpuPlan::Create(dev.views.data(), dev.views.size(),
                                        options, &plan)
                   .ok());
    TW_REQUIRE(plan->Launch(stream.get()).ok());
    TW_REQUIRE(plan->ReadbackAsync(stream.get()).ok());
    TW_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    GradStats got;
    TW_REQUIRE(plan->Result(&got).ok());
    wrong += testing::GradStatsMismatch(got, want).empty() ? 0 : 1;
  }
  TW_CHECK(wrong == 0);
}

// Defect: the first Rebind allocated pinned memory (cudaMallocHost), an
// implicit device-wide synchronization. Under a global-mode stream capture
// any such call is refused (and invalidates the capture), so a first Rebind
// that only enqueues work passes; one that allocates fails.
TW_TEST_CASE("gpu grad stats first Rebind neither allocates nor syncs") {
  TW_REQUIRE_GPU();
  Rng rng(52);
  std::vector<HostTensor> a, b;
  for (int i = 0; i < 50; ++i) {
    const int64_t n = rng.Below(70000);
    a.emplace_back(DType::kFloat32, n);
    b.emplace_back(DType::kFloat32, n);
    testing::FillGrad(&a.back(), rng, 0.0);
    testing::FillGrad(&b.back(), rng, 0.0);
  }
  DeviceTensors da(a), db(b);
  std::unique_ptr<GradStatsGpuPlan> plan;
  TW_REQUIRE(GradStatsGpuPlan::Create(da.views.data(), da.views.size(),
                                      GradStatsOptions(), &plan)
                 .ok());
  NonBlockingStream stream;
  TW_CUDA_CHECK(
      cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeGlobal));
  const Status rebind =
      plan->Rebind(db.views.data(), db.views.size(), stream.get());
  TW_INFO("Rebind: " << rebind.ToString());
  TW_CHECK(rebind.ok());
  TW_CHECK(plan->Launch(stream.get()).ok());
  TW_CHECK(plan->ReadbackAsync(stream.get()).ok());
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream.get(), &graph);
  TW_INFO("end of capture: " << cudaGetErrorString(end));
  TW_CHECK(end == cudaSuccess);
  cudaGetLastError();
  if (end != cudaSuccess || graph == nullptr) return;
  cudaGraphExec_t exec;
  TW_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  TW_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  GradStats got, want;
  TW_REQUIRE(plan->Result(&got).ok());
  const auto hv = testing::Views(b);
  TW_REQUIRE(
      ReferenceGradStats(hv.data(), hv.size(), GradStatsOptions(), &want).ok());
  testing::CheckGradStats(got, want);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// The GPU cross entropy of `t` ([rows x vocab], dense) against the fp64
// reference; the gradient written to a separate buffer or, with in_place,
// over the logits. Returns the row losses and leaves the gradient in *grad.
std::vector<float> GpuCrossEntropy(const HostTensor& t, int64_t rows,
                                   int64_t vocab,
                                   const std::vector<int32_t>& labels,
                                   bool in_place, HostTensor* grad,
                                   CrossEntropyResult* result) {
  DeviceBuffer dlogits(t.data(), t.bytes());
  DeviceBuffer dlabels(labels.data(), labels.size() * sizeof(int32_t));
  DeviceBuffer dgrad(in_place ? 0 : t.bytes());
  DeviceBuffer drow(rows * sizeof(float));
  CrossEntropyOptions o;
  o.labels = static_cast<const int32_t*>(dlabels.get());
  o.z_loss_alpha = 1e-4;
  o.grad_scale = 1.0 / 8;
  o.grad_logits = in_place ? dlogits.get() : dgrad.get();
  o.row_loss = static_cast<float*>(drow.get());
  const Status s = ComputeCrossEntropyZLossGpu(
      LogitsView{dlogits.get(), t.dtype(), rows, vocab, 0}, o, nullptr, result);
  TW_INFO("cross entropy: " << s.ToString());
  TW_REQUIRE(s.ok());
  TW_CUDA_CHECK(cudaMemcpy(grad->mutable_data(), o.grad_logits, t.bytes(),
                           cudaMemcpyDeviceToHost));
  std::vector<float> row_loss(rows);
  TW_CUDA_CHECK(cudaMemcpy(row_loss.data(), drow.get(), rows * sizeof(float),
                           cudaMemcpyDeviceToHost));
  return row_loss;
}

size_t GradMismatches(const HostTensor& got, const HostTensor& want,
                      double rel) {
  size_t bad = 0;
  for (int64_t k = 0; k < want.numel(); ++k) {
    const double g = testing::LoadAsDoubleForTest(got, k);
    const double w = testing::LoadAsDoubleForTest(want, k);
    bad += std::fabs(g - w) <= rel * std::fabs(w) + 1e-7 ? 0 : 1;
  }
  return bad;
}

// Defect: with grad_logits == logits, thread 0 read the label's logit after
// the last barrier while other threads overwrote the row. In place must
// give the same losses and gradient as out of place, bit for bit: on the
// one-block-per-row path (many rows) and the split path (few long rows),
// with vocab 50,257 in bf16, whose rows mostly start off the 16-byte grid
// (the vector path with a scalar head).
TW_TEST_CASE("gpu cross entropy in place matches out of place and the "
             "reference") {
  TW_REQUIRE_GPU();
  struct Shape {
    int64_t rows, vocab;
    DType dtype;
  };
  for (const Shape& sh : {Shape{2000, 4099, DType::kFloat32},
                          Shape{1500, 50257, DType::kBFloat16},
                          Shape{7, 50257, DType::kBFloat16},
                          Shape{3, 131072, DType::kFloat32},
                          Shape{5, 32003, DType::kFloat16}}) {
    TW_INFO(sh.rows << " x " << sh.vocab << " " << DTypeName(sh.dtype));
    Rng rng(60 + sh.rows);
    HostTensor t(sh.dtype, sh.rows * sh.vocab);
    testing::FillLogits(&t, sh.rows, sh.vocab, sh.vocab, rng);
    std::vector<int32_t> labels(sh.rows);
    for (auto& y : labels) {
      y = rng.Uniform() < 0.1 ? -100 : static_cast<int32_t>(rng.Below(sh.vocab));
    }
    labels[0] = static_cast<int32_t>(sh.vocab - 1);  // in the scalar tail
    HostTensor out_grad(sh.dtype, t.numel()), in_grad(sh.dtype, t.numel());
    CrossEntropyResult out_res, in_res;
    const auto out_rows =
        GpuCrossEntropy(t, sh.rows, sh.vocab, labels, false, &out_grad, &out_res);
    const auto in_rows =
        GpuCrossEntropy(t, sh.rows, sh.vocab, labels, true, &in_grad, &in_res);
    TW_CHECK(std::memcmp(out_rows.data(), in_rows.data(),
                         out_rows.size() * sizeof(float)) == 0);
    TW_CHECK(testing::SameDouble(out_res.loss_sum, in_res.loss_sum));
    TW_CHECK(std::memcmp(out_grad.data(), in_grad.data(), t.bytes()) == 0);

    HostTensor want_grad(sh.dtype, t.numel());
    CrossEntropyOptions ho;
    ho.labels = labels.data();
    ho.z_loss_alpha = 1e-4;
    ho.grad_scale = 1.0 / 8;
    ho.grad_logits = want_grad.mutable_data();
    CrossEntropyResult want;
    TW_REQUIRE(ReferenceCrossEntropyZLoss(
                   LogitsView{t.data(), sh.dtype, sh.rows, sh.vocab, 0}, ho,
                   &want)
                   .ok());
    TW_CHECK(out_res.rows_counted == want.rows_counted);
    TW_CHECK(std::fabs(out_res.loss_sum - want.loss_sum) <
             1e-4 * want.rows_counted);
    const double rel = sh.dtype == DType::kFloat32 ? 1e-4 : 1e-2;
    TW_CHECK(GradMismatches(out_grad, want_grad, rel) == 0);
  }
}

// Defect: the exponent fmaf(x, log2e, -(max * log2e)) overflowed for a max
// logit beyond ~2.36e38, and a finite row came out nonfinite.
TW_TEST_CASE("gpu logit stats and cross entropy of logits near FLT_MAX") {
  TW_REQUIRE_GPU();
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    TW_INFO("dtype " << DTypeName(dtype));
    for (const int64_t rows : {int64_t{3}, int64_t{1200}}) {  // split or not
      TW_INFO(rows << " rows");
      const int64_t vocab = 20000;
      HostTensor t(dtype, rows * vocab);
      Rng rng(70);
      for (int64_t k = 0; k < t.numel(); ++k) {
        t.Set(k, static_cast<float>(3.0e38 * (1.0 - 1e-3 * rng.Uniform())));
      }
      const LogitsView hv{t.data(), dtype, rows, vocab, 0};
      LogitStats want, got;
      TW_REQUIRE(ReferenceLogitStats(hv, LogitStatsOptions(), &want).ok());
      TW_REQUIRE(want.nonfinite_rows == 0);
      DeviceBuffer d(t.data(), t.bytes());
      TW_REQUIRE(ComputeLogitStatsGpu(LogitsView{d.get(), dtype, rows, vocab, 0},
                                      LogitStatsOptions(), nullptr, &got)
                     .ok());
      TW_CHECK(got.nonfinite_rows == 0);
      TW_CHECK(std::isfinite(got.sum_log_z));
      TW_CHECK(std::fabs(got.sum_log_z - want.sum_log_z) <=
               1e-6 * std::fabs(want.sum_log_z));
      std::vector<int32_t> labels(rows, 7);
      DeviceBuffer dlabels(labels.data(), labels.size() * sizeof(int32_t));
      CrossEntropyOptions o;
      o.labels = static_cast<const int32_t*>(dlabels.get());
      CrossEntropyResult ce;
      TW_REQUIRE(ComputeCrossEntropyZLossGpu(
                     LogitsView{d.get(), dtype, rows, vocab, 0}, o, nullptr, &ce)
                     .ok());
      TW_CHECK(std::isfinite(ce.log_z_sum));
    }
  }
}

// Few long rows are split across blocks; the merged (max, sum) pairs must
// give the same statistics as the reference, NaN and +inf rows included.
TW_TEST_CASE("gpu logit stats of a few long rows split across blocks") {
  TW_REQUIRE_GPU();
  for (const DType dtype :
       {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    TW_INFO("dtype " << DTypeName(dtype));
    const int64_t rows = 6, vocab = 262147, stride = 262151;
    HostTensor t(dtype, rows * stride);
    Rng rng(80);
    testing::FillLogits(&t, rows, vocab, stride, rng);
    t.Set(1 * stride + 200000, std::nanf(""));
    t.Set(2 * stride + 5, std::numeric_limits<float>::infinity());
    std::vector<float> want_rows(rows), got_rows(rows);
    LogitStatsOptions ho;
    ho.row_log_z = want_rows.data();
    LogitStats want, got;
    TW_REQUIRE(ReferenceLogitStats(LogitsView{t.data(), dtype, rows, vocab,
                                              stride},
                                   ho, &want)
                   .ok());
    DeviceBuffer d(t.data(), t.bytes());
    DeviceBuffer drows(rows * sizeof(float));
    LogitStatsOptions o;
    o.row_log_z = static_cast<float*>(drows.get());
    TW_REQUIRE(ComputeLogitStatsGpu(
                   LogitsView{d.get(), dtype, rows, vocab, stride}, o, nullptr,
                   &got)
                   .ok());
    TW_CUDA_CHECK(cudaMemcpy(got_rows.data(), drows.get(),
                             rows * sizeof(float), cudaMemcpyDeviceToHost));
    testing::CheckLogitStats(got, want, 1e-4);
    TW_CHECK(testing::RowLogZMismatches(got_rows, want_rows, 1e-4) == 0);
  }
}

// The Python binding's DeviceStats copies device_result() of several plans
// into one buffer and reads it with ResultFrom(): the same numbers as
// ReadbackAsync() + Result().
TW_TEST_CASE("gpu results read from a caller's copy of the device result") {
  TW_REQUIRE_GPU();
  Rng rng(21);
  const auto hosts = testing::ManySmallTensors(rng, 200, 0.1);
  DeviceTensors dev(hosts);
  GradStatsOptions options;
  options.per_tensor = true;
  std::unique_ptr<GradStatsGpuPlan> plan;
  TW_REQUIRE(GradStatsGpuPlan::Create(dev.views.data(), dev.views.size(), options, &plan)
                 .ok());
  TW_CHECK(plan->result_bytes() == sizeof(GpuGradStatsHeader) + hosts.size() * 24);
  const int64_t rows = 9, vocab = 1001;
  HostTensor t(DType::kBFloat16, rows * vocab);
  testing::FillLogits(&t, rows, vocab, vocab, rng);
  DeviceBuffer dlogits(t.data(), t.bytes());
  std::unique_ptr<LogitStatsGpu> ws;
  TW_REQUIRE(LogitStatsGpu::Create(rows, &ws).ok());
  TW_REQUIRE(plan->Launch(nullptr).ok());
  TW_REQUIRE(ws->Launch(LogitsView{dlogits.get(), DType::kBFloat16, rows, vocab, 0},
                        LogitStatsOptions{}, nullptr)
                 .ok());
  TW_REQUIRE(plan->ReadbackAsync(nullptr).ok());
  TW_REQUIRE(ws->ReadbackAsync(nullptr).ok());
  const size_t gbytes = plan->result_bytes(), lbytes = LogitStatsGpu::result_bytes();
  std::vector<char> copy(gbytes + lbytes);
  TW_CUDA_CHECK(cudaMemcpy(copy.data(), plan->device_result(), gbytes, cudaMemcpyDeviceToHost));
  TW_CUDA_CHECK(cudaMemcpy(copy.data() + gbytes, ws->device_result(), lbytes,
                           cudaMemcpyDeviceToHost));
  GradStats want, got;
  TW_REQUIRE(plan->Result(&want).ok());
  TW_REQUIRE(plan->ResultFrom(copy.data(), &got).ok());
  TW_CHECK(testing::BitIdentical(got, want));
  LogitStats lwant, lgot;
  TW_REQUIRE(ws->Result(&lwant).ok());
  TW_REQUIRE(LogitStatsGpu::ResultFrom(copy.data() + gbytes, &lgot).ok());
  TW_CHECK(testing::SameDouble(lgot.sum_log_z, lwant.sum_log_z));
  TW_CHECK(lgot.rows_counted == rows);
  TW_CHECK(lgot.nonfinite_rows == lwant.nonfinite_rows);
  TW_CHECK(testing::SameDouble(lgot.max_logit, lwant.max_logit));
}

#endif  // TRAINWATCH_KERNELS_HAVE_CUDA

}  // namespace
}  // namespace trainwatch::kernels
