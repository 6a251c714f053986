// Private: the NCCL reducer's staging memory — a device buffer and a pinned
// host buffer of the same capacity, grown on demand — behind a small
// allocation interface so that the growth logic is tested without a GPU.
//
// Invariant: capacity() > 0 exactly when both buffers are allocated and hold
// capacity() doubles. A growth that fails releases both and leaves
// capacity() == 0, so no later, smaller request can find a capacity without
// buffers behind it. Not thread-safe.

#ifndef TRAINWATCH_AGENT_SRC_REDUCE_BUFFERS_H_
#define TRAINWATCH_AGENT_SRC_REDUCE_BUFFERS_H_

#include <cstddef>

#include "absl/status/status.h"

namespace trainwatch::agent::internal {

// The allocation calls (cudaMalloc / cudaMallocHost and their frees).
class StagingMemory {
 public:
  virtual ~StagingMemory() = default;
  virtual absl::Status AllocDevice(size_t bytes, void** out) = 0;
  virtual void FreeDevice(void* p) = 0;
  virtual absl::Status AllocHost(size_t bytes, void** out) = 0;
  virtual void FreeHost(void* p) = 0;
};

class ReduceBuffers {
 public:
  // `memory` must outlive the buffers.
  explicit ReduceBuffers(StagingMemory* memory) : memory_(memory) {}
  ~ReduceBuffers() { Release(); }
  ReduceBuffers(const ReduceBuffers&) = delete;
  ReduceBuffers& operator=(const ReduceBuffers&) = delete;

  // On OK, device() and host() hold at least n doubles (n == 0: OK, maybe
  // no buffers). Allocates only when n exceeds the capacity.
  absl::Status Reserve(size_t n) {
    if (n <= capacity_) return absl::OkStatus();
    Release();
    void* d = nullptr;
    if (absl::Status s = memory_->AllocDevice(n * sizeof(double), &d); !s.ok()) return s;
    void* h = nullptr;
    if (absl::Status s = memory_->AllocHost(n * sizeof(double), &h); !s.ok()) {
      memory_->FreeDevice(d);
      return s;
    }
    device_ = static_cast<double*>(d);
    host_ = static_cast<double*>(h);
    capacity_ = n;
    return absl::OkStatus();
  }

  double* device() const { return device_; }
  double* host() const { return host_; }
  size_t capacity() const { return capacity_; }

 private:
  void Release() {
    if (device_ != nullptr) memory_->FreeDevice(device_);
    if (host_ != nullptr) memory_->FreeHost(host_);
    device_ = nullptr;
    host_ = nullptr;
    capacity_ = 0;
  }

  StagingMemory* memory_;
  double* device_ = nullptr;
  double* host_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace trainwatch::agent::internal

#endif  // TRAINWATCH_AGENT_SRC_REDUCE_BUFFERS_H_
