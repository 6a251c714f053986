// The NCCL reducer: a single-rank communicator on a real device when there
// is one (tagged [gpu]: reported as skipped without CUDA or a device).

#include <catch2/catch.hpp>

#include "trainwatch/agent/agent.h"
#include "trainwatch/agent/nccl_reducer.h"

#ifdef TRAINWATCH_AGENT_HAVE_NCCL
#include <cuda_runtime.h>
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
  CHECK((*agent)->Step(in).decision == Decision::kHalt);
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
