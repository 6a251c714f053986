// Reading a tensor through DLPack without linking any framework: the
// producer's __dlpack__() hands over a capsule holding a DLManagedTensor; we
// read its data pointer, type and shape for the duration of one call and
// give it back through its deleter. The struct layouts below are DLPack's
// stable ABI (version 0.x, as torch 1.13 and numpy 1.24 produce).

#ifndef TRAINWATCH_AGENT_PYTHON_DLPACK_VIEW_H_
#define TRAINWATCH_AGENT_PYTHON_DLPACK_VIEW_H_

#include <cstdint>

namespace trainwatch::python {

struct DLDevice {
  int32_t device_type;  // 1: CPU, 2: CUDA, 3: CUDA host
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means compact row-major
  uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;
constexpr uint8_t kDLInt = 0;
constexpr uint8_t kDLFloat = 2;
constexpr uint8_t kDLBfloat = 4;

}  // namespace trainwatch::python

#endif  // TRAINWATCH_AGENT_PYTHON_DLPACK_VIEW_H_
