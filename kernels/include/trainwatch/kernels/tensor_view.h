// Views of a trainer's own buffers. The kernels never own, copy or allocate
// the data they read: a view is a pointer, an element type and a size, and
// the memory (host for the CPU entry points, device for the CUDA ones) must
// stay valid until the call, or on a GPU the launched work, has finished.

#ifndef TRAINWATCH_KERNELS_TENSOR_VIEW_H_
#define TRAINWATCH_KERNELS_TENSOR_VIEW_H_

#include <cstddef>
#include <cstdint>

namespace trainwatch::kernels {

// Element types of gradients and logits. The values are part of the C ABI
// (trainwatch/kernels/c_api.h): do not renumber.
enum class DType : int32_t {
  kFloat32 = 0,
  kBFloat16 = 1,
  kFloat16 = 2,
};

// Bytes per element; 0 for a value outside the enum.
size_t DTypeSize(DType dtype);
// "float32", "bfloat16", "float16"; "invalid" otherwise.
const char* DTypeName(DType dtype);
bool IsValidDType(DType dtype);

// A flat, contiguous tensor. `data` must be aligned to its element size and
// may be null only when numel == 0.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t numel = 0;
};

// A [rows x vocab] matrix of logits, row-major. Row r starts at element
// r * row_stride; row_stride == 0 means vocab (densely packed rows).
struct LogitsView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t row_stride = 0;

  int64_t stride() const { return row_stride == 0 ? vocab : row_stride; }
};

// Which CPU code path runs. kAuto picks the fastest one the processor
// supports. kPortable is plain C++ with the compiler's vector extensions
// (SSE2 on any x86-64, NEON on AArch64) and runs everywhere; kAvx2 needs
// AVX2, FMA and F16C. Pinning a path is for tests and benchmarks; asking for
// one the processor lacks is an error, not a silent fallback.
enum class CpuPath : int32_t {
  kAuto = 0,
  kPortable = 1,
  kAvx2 = 2,
};

// Whether this process can run `path` (kAuto and kPortable: always).
bool CpuPathSupported(CpuPath path);
// The path kAuto resolves to on this processor.
CpuPath BestCpuPath();
const char* CpuPathName(CpuPath path);

}  // namespace trainwatch::kernels

#endif  // TRAINWATCH_KERNELS_TENSOR_VIEW_H_
