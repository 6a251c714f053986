// The NCCL reducer: a single-rank communicator on a real device when there
// is one (tagged [gpu]: reported as skipped without CUDA or a device).

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>

#include "trainwatch/agent/agent.h"
#include "trainwatch/agent/nccl_reducer.h"

#ifdef TRAINWATCH_AGENT_HAVE_NCCL
#include <cuda_runtime.h>
#endif
#if defined(TRAINWATCH_AGENT_HAVE_NCCL) && defined(TRAINWATCH_KERNELS_HAVE_CUDA)
#include <cstdint>
#include <vector>

#include "trainwatch/kernels/cuda.h"
#endif

namespace trainwatch::agent {
namespace {

bool HaveDevice() {
#ifdef TRAINWATCH_AGENT_HAVE_NCCL
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

TEST_CASE("nccl: a one-rank communicator reduces in place and drives the agent", "[gpu]") {
  if (!NcclAvailable() || !HaveDevice()) {
    WARN("TRAINWATCH_TEST_SKIPPED: no NCCL in this build or no CUDA device");
    CHECK(CreateNcclReducer(NcclId{}, 0, 1, 0, nullptr).status().code() !=
          absl::StatusCode::kOk);
    return;
  }
  auto id = NcclUniqueId();
  REQUIRE(id.ok());
  auto reducer = CreateNcclReducer(*id, 0, 1, 0, nullptr);
  REQUIRE(reducer.ok());
  double sums[3] = {1.5, 2.0, 3.0};
  double maxes[2] = {-1.0, 7.0};
  REQUIRE((*reducer)->AllReduce(absl::MakeSpan(sums), absl::MakeSpan(maxes)).ok());
  CHECK(sums[0] == 1.5);
  CHECK(maxes[1] == 7.0);
  auto agent = Agent::Create(AgentConfig(), *std::move(reducer));
  REQUIRE(agent.ok());
  StepInput in;
  in.step = 0;
  in.loss = 2.0;
  in.grad_sum_squares = 4.0;
  in.grad_nonfinite = 1;
  in.grad_elements = 10;
  const absl::StatusOr<Verdict> v = (*agent)->Step(in);
  REQUIRE(v.ok());
  CHECK(v->decision == Decision::kHalt);
}

TEST_CASE("nccl: a GPU grad stats result is reduced on the device before its one read-back",
          "[gpu]") {
#if defined(TRAINWATCH_AGENT_HAVE_NCCL) && defined(TRAINWATCH_KERNELS_HAVE_CUDA)
  if (!HaveDevice()) {
    WARN("TRAINWATCH_TEST_SKIPPED: no CUDA device");
    return;
  }
  namespace k = trainwatch::kernels;
  auto id = NcclUniqueId();
  REQUIRE(id.ok());
  cudaStream_t stream;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  auto reducer = CreateNcclReducer(*id, 0, 1, 0, stream);
  REQUIRE(reducer.ok());
  // Host spans of shrinking size reuse the staging buffers.
  double sums[5] = {1, 2, 3, 4, 5}, maxes[2] = {6, 7};
  REQUIRE((*reducer)->AllReduce(absl::MakeSpan(sums), absl::MakeSpan(maxes)).ok());
  REQUIRE((*reducer)->AllReduce(absl::MakeSpan(sums, 2), absl::MakeSpan(maxes, 1)).ok());
  CHECK(sums[1] == 2.0);
  CHECK(maxes[0] == 6.0);

  std::vector<float> host(10000, 0.5f);
  host[17] = -3.0f;
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, host.size() * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) ==
          cudaSuccess);
  const k::TensorView view{dev, k::DType::kFloat32, static_cast<int64_t>(host.size())};
  std::unique_ptr<k::GradStatsGpuPlan> plan;
  REQUIRE(k::GradStatsGpuPlan::Create(&view, 1, k::GradStatsOptions(), &plan).ok());
  REQUIRE(plan->Launch(stream).ok());
  auto* h = const_cast<k::GpuGradStatsHeader*>(plan->device_result());
  // nonfinite and numel are adjacent 64-bit counts.
  static_assert(offsetof(k::GpuGradStatsHeader, numel) ==
                    offsetof(k::GpuGradStatsHeader, nonfinite) + sizeof(uint64_t),
                "header layout");
  REQUIRE((*reducer)
              ->AllReduceDevice(&h->sum_squares, 1, reinterpret_cast<uint64_t*>(&h->nonfinite),
                                2, &h->max_abs, 1)
              .ok());
  REQUIRE(plan->ReadbackAsync(stream).ok());
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);  // the step's one sync
  k::GradStats got;
  REQUIRE(plan->Result(&got).ok());
  CHECK(got.numel == 10000);
  CHECK(got.nonfinite == 0);
  CHECK(got.max_abs == 3.0);
  CHECK(std::fabs(got.sum_squares - (9999 * 0.25 + 9.0)) < 1e-6);
  cudaFree(dev);
  cudaStreamDestroy(stream);
#else
  WARN("TRAINWATCH_TEST_SKIPPED: no NCCL or no CUDA kernels in this build");
  CHECK(SingleProcessReducer().AllReduceDevice(nullptr, 0, nullptr, 0, nullptr, 0).code() ==
        absl::StatusCode::kUnimplemented);
#endif
}

TEST_CASE("nccl: availability matches the build", "[agent][nccl]") {
#ifdef TRAINWATCH_AGENT_HAVE_NCCL
  CHECK(NcclAvailable());
#else
  CHECK_FALSE(NcclAvailable());
  CHECK(NcclUniqueId().status().code() == absl::StatusCode::kUnimplemented);
#endif
}

}  // namespace
}  // namespace trainwatch::agent
