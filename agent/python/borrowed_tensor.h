// A tensor borrowed through DLPack for the duration of one binding call,
// as the kernels read it (a data pointer, a dtype, an element count). Host
// memory by default; CUDA memory where the caller says it launches CUDA
// kernels on it (device_stats.cc). Private to the Python module.

#ifndef TRAINWATCH_AGENT_PYTHON_BORROWED_TENSOR_H_
#define TRAINWATCH_AGENT_PYTHON_BORROWED_TENSOR_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "dlpack_view.h"
#include "trainwatch/kernels/grad_stats.h"

namespace trainwatch::python {

namespace py = pybind11;

// What a call site reads: host tensors only (the CPU kernels), or host or
// CUDA ones (the CUDA kernels check the device themselves); the kernels'
// float dtypes (gradients, logits), int32 (labels) or float64 (a loss).
struct BorrowOptions {
  enum class Kind { kKernelFloat, kInt32, kFloat64 };
  bool allow_cuda = false;
  Kind kind = Kind::kKernelFloat;
};

// One tensor borrowed through DLPack for the duration of a call.
class Borrowed {
 public:
  explicit Borrowed(py::handle obj, BorrowOptions options = {}) {
    py::object capsule = py::reinterpret_borrow<py::object>(obj);
    if (py::hasattr(obj, "__dlpack__")) {
      // Gradients may be views; a contiguous copy is the framework's business.
      capsule = obj.attr("__dlpack__")();
    }
    if (!PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
      throw py::type_error(
          "expected a tensor with __dlpack__ (torch.Tensor, numpy.ndarray) or a DLPack capsule");
    }
    managed_ = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    // We own it now: the capsule must not free it again.
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");
    const DLTensor& t = managed_->dl_tensor;
    const bool cuda = t.device.device_type == kDLCUDA;
    if (t.device.device_type != kDLCPU && !(cuda && options.allow_cuda)) {
      Release();
      throw py::value_error(
          cuda ? "a CUDA tensor here: this call reads host tensors (CUDA tensors go through "
                 "trainwatch.torch's guard, which uses DeviceStats in a CUDA build)"
               : "tensor is neither on the host nor on a CUDA device");
    }
    cuda_ = cuda;
    device_id_ = t.device.device_id;
    numel_ = 1;
    for (int i = 0; i < t.ndim; ++i) numel_ *= t.shape[i];
    if (t.strides != nullptr && numel_ > 1) {
      int64_t expect = 1;
      for (int i = t.ndim - 1; i >= 0; --i) {
        if (t.shape[i] != 1 && t.strides[i] != expect) {
          Release();
          throw py::value_error("tensor is not contiguous: call .contiguous() first");
        }
        expect *= t.shape[i];
      }
    }
    if (t.dtype.lanes != 1) {
      Release();
      throw py::value_error("vector dtypes are not supported");
    }
    if (options.kind != BorrowOptions::Kind::kKernelFloat) {
      const bool int32 = options.kind == BorrowOptions::Kind::kInt32;
      if (t.dtype.code != (int32 ? kDLInt : kDLFloat) || t.dtype.bits != (int32 ? 32 : 64)) {
        Release();
        throw py::value_error(int32 ? "labels must be an int32 tensor"
                                    : "expected a float64 tensor");
      }
    } else if (t.dtype.code == kDLFloat && t.dtype.bits == 32) {
      dtype_ = kernels::DType::kFloat32;
    } else if (t.dtype.code == kDLFloat && t.dtype.bits == 16) {
      dtype_ = kernels::DType::kFloat16;
    } else if (t.dtype.code == kDLBfloat && t.dtype.bits == 16) {
      dtype_ = kernels::DType::kBFloat16;
    } else {
      Release();
      throw py::value_error("tensor dtype must be float32, bfloat16 or float16");
    }
  }
  ~Borrowed() { Release(); }
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  Borrowed(Borrowed&& o) noexcept
      : managed_(o.managed_),
        dtype_(o.dtype_),
        numel_(o.numel_),
        cuda_(o.cuda_),
        device_id_(o.device_id_) {
    o.managed_ = nullptr;
  }

  const void* data() const {
    return static_cast<const char*>(managed_->dl_tensor.data) + managed_->dl_tensor.byte_offset;
  }
  kernels::DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  int ndim() const { return managed_->dl_tensor.ndim; }
  int64_t dim(int i) const { return managed_->dl_tensor.shape[i]; }
  bool cuda() const { return cuda_; }
  int device_id() const { return device_id_; }

 private:
  void Release() {
    if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
    managed_ = nullptr;
  }
  DLManagedTensor* managed_ = nullptr;
  kernels::DType dtype_ = kernels::DType::kFloat32;
  int64_t numel_ = 0;
  bool cuda_ = false;
  int device_id_ = 0;
};

// Borrowed [..., vocab] logits as the kernels' [rows x vocab] view.
inline kernels::LogitsView LogitsViewOf(const Borrowed& t) {
  if (t.ndim() < 1) throw py::value_error("logits need a vocabulary dimension");
  kernels::LogitsView v;
  v.data = t.data();
  v.dtype = t.dtype();
  v.vocab = t.dim(t.ndim() - 1);
  v.rows = v.vocab > 0 ? t.numel() / v.vocab : 0;
  return v;
}

// Labels are one per row of the logits.
inline void CheckLabelCount(int64_t labels, int64_t rows) {
  if (labels != rows) {
    throw py::value_error("labels must have one entry per row of logits: " +
                          std::to_string(labels) + " labels, " + std::to_string(rows) + " rows");
  }
}

}  // namespace trainwatch::python

#endif  // TRAINWATCH_AGENT_PYTHON_BORROWED_TENSOR_H_
