// Private: helpers shared by the CUDA kernels — error conversion, element
// classification on stored bits, and deterministic warp / block reductions
// (a fixed butterfly per warp, then warp results in index order).

#ifndef TRAINWATCH_KERNELS_SRC_CUDA_COMMON_CUH_
#define TRAINWATCH_KERNELS_SRC_CUDA_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "trainwatch/kernels/status.h"
#include "trainwatch/kernels/tensor_view.h"

namespace trainwatch::kernels::internal {

inline Status CudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return OkStatus();
  std::string msg = std::string(what) + ": " + cudaGetErrorString(err);
  if (err == cudaErrorMemoryAllocation) return ResourceExhaustedError(msg);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return UnavailableError(msg);
  }
  return InternalError(msg);
}

#define TRAINWATCH_CUDA_RETURN_IF_ERROR(call, what)                     \
  do {                                                                  \
    cudaError_t tw_err_ = (call);                                       \
    if (tw_err_ != cudaSuccess)                                         \
      return ::trainwatch::kernels::internal::CudaError(tw_err_, what); \
  } while (0)

// Fails with Unavailable when no device is usable.
Status RequireDevice();

// What every Create(max_rows, out) checks first: its arguments, then the
// device.
Status CheckCreate(int64_t max_rows, const void* out);

// One host-to-device copy out of pinned memory.
struct Upload {
  void* device;
  const void* pinned_host;
  size_t bytes;
};
// Enqueues the copies on a private non-blocking stream and waits for it, so
// that when it returns OK the data is in device memory and visible to work
// launched afterwards on any stream.
Status UploadAndWait(std::initializer_list<Upload> uploads);

// Device memory freed on destruction.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  ~DeviceArray() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  Status Allocate(size_t n, const char* what) {
    n_ = n;
    if (n == 0) return OkStatus();
    return CudaError(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)),
                     what);
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// Pinned host memory freed on destruction.
template <typename T>
class PinnedArray {
 public:
  PinnedArray() = default;
  ~PinnedArray() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  Status Allocate(size_t n, const char* what) {
    n_ = n;
    if (n == 0) return OkStatus();
    return CudaError(
        cudaMallocHost(reinterpret_cast<void**>(&ptr_), n * sizeof(T)), what);
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

#if defined(__CUDACC__)

constexpr int kDTypeF32 = static_cast<int>(DType::kFloat32);
constexpr int kDTypeBf16 = static_cast<int>(DType::kBFloat16);
constexpr int kDTypeF16 = static_cast<int>(DType::kFloat16);

// Calls launch(std::integral_constant<int, D>{}) with the kernels' template
// dtype for `dtype`: the one place a host-side launch maps the runtime dtype
// to the compile-time one.
template <typename Launch>
void ForDType(DType dtype, Launch&& launch) {
  switch (dtype) {
    case DType::kFloat32:
      launch(std::integral_constant<int, kDTypeF32>{});
      break;
    case DType::kBFloat16:
      launch(std::integral_constant<int, kDTypeBf16>{});
      break;
    case DType::kFloat16:
      launch(std::integral_constant<int, kDTypeF16>{});
      break;
  }
}

__device__ __forceinline__ float HalfBitsToFloatDevice(uint32_t h) {
  float f;
  asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.f32.f16 %0, t; }"
      : "=f"(f)
      : "r"(h));
  return f;
}

// The magnitude of a stored element as fp32 and whether it is finite.
template <int D>
__device__ __forceinline__ float AbsFinite(uint32_t bits, bool* finite) {
  if constexpr (D == kDTypeF32) {
    const uint32_t a = bits & 0x7fffffffu;
    *finite = a < 0x7f800000u;
    return __uint_as_float(a);
  } else if constexpr (D == kDTypeBf16) {
    const uint32_t a = bits & 0x7fffu;
    *finite = a < 0x7f80u;
    return __uint_as_float(a << 16);
  } else {
    const uint32_t a = bits & 0x7fffu;
    *finite = a < 0x7c00u;
    return HalfBitsToFloatDevice(a);
  }
}

// The value of a stored element as fp32.
template <int D>
__device__ __forceinline__ float ToFloat(uint32_t bits) {
  if constexpr (D == kDTypeF32) {
    return __uint_as_float(bits);
  } else if constexpr (D == kDTypeBf16) {
    return __uint_as_float(bits << 16);
  } else {
    return HalfBitsToFloatDevice(bits);
  }
}

template <int D>
__device__ __forceinline__ uint32_t LoadBits(const void* p, int64_t i) {
  if constexpr (D == kDTypeF32) {
    return __ldg(static_cast<const unsigned int*>(p) + i);
  } else {
    return __ldg(static_cast<const unsigned short*>(p) + i);
  }
}

// 2^x, approximate (about 2 ulp); 2^-inf = 0.
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ double WarpSum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ unsigned long long WarpSum(unsigned long long v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Block-wide reductions for a block of kThreads threads (a multiple of 32).
// Every thread must call; the result is valid in every thread. `scratch`
// holds one value per warp; the trailing __syncthreads lets it be reused.
template <int kThreads, typename T, typename WarpOp, typename Combine>
__device__ __forceinline__ T BlockReduce(T v, T identity, T* scratch,
                                         WarpOp warp_op, Combine combine) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_op(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = identity;
  for (int w = 0; w < kWarps; ++w) r = combine(r, scratch[w]);
  __syncthreads();
  return r;
}

#endif  // __CUDACC__

}  // namespace trainwatch::kernels::internal

#endif  // TRAINWATCH_KERNELS_SRC_CUDA_COMMON_CUH_
