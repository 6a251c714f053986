#include "trainwatch/agent/nccl_reducer.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "reduce_buffers.h"

#ifdef TRAINWATCH_AGENT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace trainwatch::agent {

#ifdef TRAINWATCH_AGENT_HAVE_NCCL

namespace {

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

absl::Status Nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

class CudaStagingMemory : public internal::StagingMemory {
 public:
  absl::Status AllocDevice(size_t bytes, void** out) override {
    return Cuda(cudaMalloc(out, bytes), "cudaMalloc");
  }
  void FreeDevice(void* p) override { cudaFree(p); }
  // Pinned, so that the copies are truly asynchronous on the stream.
  absl::Status AllocHost(size_t bytes, void** out) override {
    return Cuda(cudaMallocHost(out, bytes), "cudaMallocHost");
  }
  void FreeHost(void* p) override { cudaFreeHost(p); }
};

class NcclReducer : public Reducer {
 public:
  NcclReducer(ncclComm_t comm, bool owned, cudaStream_t stream, int rank, int world)
      : comm_(comm), owned_(owned), stream_(stream), rank_(rank), world_(world) {}
  ~NcclReducer() override {
    if (owned_) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  absl::Status AllReduce(absl::Span<double> sums, absl::Span<double> maxes) override {
    const size_t n = sums.size() + maxes.size();
    if (n == 0) return absl::OkStatus();
    if (absl::Status s = buffers_.Reserve(n); !s.ok()) return s;
    double* host = buffers_.host();
    double* device = buffers_.device();
    std::memcpy(host, sums.data(), sums.size() * sizeof(double));
    std::memcpy(host + sums.size(), maxes.data(), maxes.size() * sizeof(double));
    absl::Status s = Cuda(
        cudaMemcpyAsync(device, host, n * sizeof(double), cudaMemcpyHostToDevice, stream_),
        "copy to device");
    if (s.ok()) s = AllReduceDevice(device, sums.size(), nullptr, 0, device + sums.size(),
                                    maxes.size());
    if (s.ok()) {
      s = Cuda(cudaMemcpyAsync(host, device, n * sizeof(double), cudaMemcpyDeviceToHost,
                               stream_),
               "copy to host");
    }
    // The verdict is needed before optimizer.step(): this is the one sync.
    if (s.ok()) s = Cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (!s.ok()) return s;
    std::memcpy(sums.data(), host, sums.size() * sizeof(double));
    std::memcpy(maxes.data(), host + sums.size(), maxes.size() * sizeof(double));
    return absl::OkStatus();
  }

  absl::Status AllReduceDevice(double* sums, size_t n_sums, uint64_t* counts, size_t n_counts,
                               double* maxes, size_t n_maxes) override {
    if (absl::Status s = Nccl(ncclGroupStart(), "ncclGroupStart"); !s.ok()) return s;
    absl::Status s;
    if (n_sums > 0) {
      s = Nccl(ncclAllReduce(sums, sums, n_sums, ncclDouble, ncclSum, comm_, stream_),
               "ncclAllReduce(sum)");
    }
    if (s.ok() && n_counts > 0) {
      s = Nccl(ncclAllReduce(counts, counts, n_counts, ncclUint64, ncclSum, comm_, stream_),
               "ncclAllReduce(count)");
    }
    if (s.ok() && n_maxes > 0) {
      s = Nccl(ncclAllReduce(maxes, maxes, n_maxes, ncclDouble, ncclMax, comm_, stream_),
               "ncclAllReduce(max)");
    }
    const absl::Status end = Nccl(ncclGroupEnd(), "ncclGroupEnd");
    return s.ok() ? end : s;
  }

 private:
  ncclComm_t comm_;
  bool owned_;
  cudaStream_t stream_;
  int rank_, world_;
  CudaStagingMemory memory_;
  internal::ReduceBuffers buffers_{&memory_};
};

}  // namespace

bool NcclAvailable() { return true; }

absl::StatusOr<NcclId> NcclUniqueId() {
  static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NCCL id size changed");
  ncclUniqueId id;
  if (absl::Status s = Nccl(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) return s;
  NcclId out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

absl::StatusOr<std::unique_ptr<Reducer>> CreateNcclReducer(const NcclId& id, int rank,
                                                           int world_size, int device,
                                                           void* stream) {
  if (absl::Status s = Cuda(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof nid);
  ncclComm_t comm;
  if (absl::Status s = Nccl(ncclCommInitRank(&comm, world_size, nid, rank), "ncclCommInitRank");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<Reducer>(std::make_unique<NcclReducer>(
      comm, /*owned=*/true, static_cast<cudaStream_t>(stream), rank, world_size));
}

absl::StatusOr<std::unique_ptr<Reducer>> BorrowNcclReducer(void* communicator, void* stream) {
  if (communicator == nullptr) return absl::InvalidArgumentError("null NCCL communicator");
  ncclComm_t comm = static_cast<ncclComm_t>(communicator);
  int rank = 0, world = 0;
  if (absl::Status s = Nccl(ncclCommUserRank(comm, &rank), "ncclCommUserRank"); !s.ok()) return s;
  if (absl::Status s = Nccl(ncclCommCount(comm, &world), "ncclCommCount"); !s.ok()) return s;
  return std::unique_ptr<Reducer>(std::make_unique<NcclReducer>(
      comm, /*owned=*/false, static_cast<cudaStream_t>(stream), rank, world));
}

#else  // no NCCL in this build

bool NcclAvailable() { return false; }

absl::StatusOr<NcclId> NcclUniqueId() {
  return absl::UnimplementedError("this build has no NCCL (needs CUDA and nccl.h at build time)");
}

absl::StatusOr<std::unique_ptr<Reducer>> CreateNcclReducer(const NcclId&, int, int, int, void*) {
  return absl::UnimplementedError("this build has no NCCL (needs CUDA and nccl.h at build time)");
}

absl::StatusOr<std::unique_ptr<Reducer>> BorrowNcclReducer(void*, void*) {
  return absl::UnimplementedError("this build has no NCCL (needs CUDA and nccl.h at build time)");
}

#endif

}  // namespace trainwatch::agent
