// The CUDA runtime helpers every GPU plan uses (declared in cuda_common.cuh
// and trainwatch/kernels/cuda.h): device presence and the upload of a plan's
// tables.

#include <initializer_list>
#include <string>

#include "cuda_common.cuh"
#include "trainwatch/kernels/cuda.h"

namespace trainwatch::kernels {
namespace internal {

Status UploadAndWait(std::initializer_list<Upload> uploads) {
  cudaStream_t stream = nullptr;
  TRAINWATCH_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
      "upload stream");
  cudaError_t err = cudaSuccess;
  for (const Upload& u : uploads) {
    if (u.bytes == 0) continue;
    err = cudaMemcpyAsync(u.device, u.pinned_host, u.bytes,
                          cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) break;
  }
  // Waited for even after a failed enqueue: the stream is destroyed next.
  const cudaError_t sync = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  if (err != cudaSuccess) return CudaError(err, "upload");
  return CudaError(sync, "wait for the upload");
}

Status RequireDevice() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the non-sticky error
    return UnavailableError(std::string("no usable CUDA device: ") +
                            cudaGetErrorString(err));
  }
  if (n == 0) return UnavailableError("no CUDA device");
  return OkStatus();
}

Status CheckCreate(int64_t max_rows, const void* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  if (max_rows < 0) return InvalidArgumentError("negative max_rows");
  return RequireDevice();
}

}  // namespace internal

namespace {
// Compiled for the same architectures as every kernel of the library: its
// attributes exist exactly where they can run.
__global__ void ProbeKernel() {}
}  // namespace

Status CudaKernelsRunnable() {
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(internal::RequireDevice());
  cudaFuncAttributes attributes;
  const cudaError_t err = cudaFuncGetAttributes(&attributes, ProbeKernel);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return UnavailableError(
        std::string("the kernels were not built for this GPU's architecture: ") +
        cudaGetErrorString(err));
  }
  return OkStatus();
}

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace trainwatch::kernels
