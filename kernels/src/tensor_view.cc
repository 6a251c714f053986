#include "trainwatch/kernels/tensor_view.h"

#include "cpu_kernels.h"

namespace trainwatch::kernels {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "invalid";
}

bool IsValidDType(DType dtype) { return DTypeSize(dtype) != 0; }

bool CpuPathSupported(CpuPath path) {
  switch (path) {
    case CpuPath::kAuto:
    case CpuPath::kPortable:
      return true;
    case CpuPath::kAvx2:
      return internal::CpuHasAvx2();
  }
  return false;
}

CpuPath BestCpuPath() {
  return internal::CpuHasAvx2() ? CpuPath::kAvx2 : CpuPath::kPortable;
}

const char* CpuPathName(CpuPath path) {
  switch (path) {
    case CpuPath::kAuto:
      return "auto";
    case CpuPath::kPortable:
      return "portable";
    case CpuPath::kAvx2:
      return "avx2";
  }
  return "invalid";
}

}  // namespace trainwatch::kernels
