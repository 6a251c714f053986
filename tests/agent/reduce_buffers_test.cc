// The NCCL reducer's staging buffers (agent/src/reduce_buffers.h) on fake
// memory: the growth logic without a GPU.

#include "reduce_buffers.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <set>

namespace trainwatch::agent::internal {
namespace {

// malloc-backed memory that can be told to refuse the next allocation of
// either kind; it tracks what is live, to catch leaks and double frees.
class FakeMemory : public StagingMemory {
 public:
  absl::Status AllocDevice(size_t bytes, void** out) override {
    return Alloc(bytes, out, &fail_device);
  }
  void FreeDevice(void* p) override { Free(p); }
  absl::Status AllocHost(size_t bytes, void** out) override {
    return Alloc(bytes, out, &fail_host);
  }
  void FreeHost(void* p) override { Free(p); }

  bool fail_device = false;
  bool fail_host = false;
  std::set<void*> live;
  int bad_frees = 0;

 private:
  absl::Status Alloc(size_t bytes, void** out, bool* fail) {
    if (*fail) {
      *fail = false;
      *out = nullptr;
      return absl::ResourceExhaustedError("out of memory (fake)");
    }
    *out = std::malloc(bytes);
    live.insert(*out);
    return absl::OkStatus();
  }
  void Free(void* p) {
    if (live.erase(p) == 0) ++bad_frees;
    std::free(p);
  }
};

TEST_CASE("reduce buffers: a failed growth leaves no capacity without buffers",
          "[agent][nccl]") {
  FakeMemory memory;
  {
    ReduceBuffers b(&memory);
    REQUIRE(b.Reserve(5).ok());
    CHECK(b.capacity() == 5);
    CHECK(b.device() != nullptr);
    CHECK(b.host() != nullptr);
    // A smaller request reuses the buffers.
    double* const device = b.device();
    REQUIRE(b.Reserve(3).ok());
    CHECK(b.device() == device);

    for (const bool host_fails : {true, false}) {
      INFO((host_fails ? "pinned host allocation fails" : "device allocation fails"));
      memory.fail_host = host_fails;
      memory.fail_device = !host_fails;
      CHECK(b.Reserve(10).code() == absl::StatusCode::kResourceExhausted);
      // The old code kept capacity 5 with null buffers here, and the next
      // smaller call copied into nullptr.
      CHECK(b.capacity() == 0);
      CHECK(b.device() == nullptr);
      CHECK(b.host() == nullptr);
      CHECK(memory.live.empty());
      REQUIRE(b.Reserve(3).ok());
      CHECK(b.device() != nullptr);
      CHECK(b.host() != nullptr);
      CHECK(b.capacity() >= 3);
    }
  }
  CHECK(memory.live.empty());
  CHECK(memory.bad_frees == 0);
}

}  // namespace
}  // namespace trainwatch::agent::internal
