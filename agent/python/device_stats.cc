// DeviceStats (device_stats.h): kernels/' CUDA statistics for trainwatch.torch.
//
// Per optimizer step: add_logits() once per micro-batch enqueues LogitStatsGpu
// on the trainer's stream (no copy, no wait), finish() enqueues
// GradStatsGpuPlan on the same stream, gathers every result (and the loss)
// into one device buffer, copies that to the host once and waits for it.
// Every call of a step must name the same stream (torch's current one): the
// gather relies on stream order, not on events.

#include "device_stats.h"

#include <pybind11/stl.h>

#include <cstdint>

#if TRAINWATCH_KERNELS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "borrowed_tensor.h"
#include "trainwatch/kernels/cuda.h"
#endif

namespace trainwatch::python {

namespace py = pybind11;

#if TRAINWATCH_KERNELS_HAVE_CUDA
namespace {

// A bad argument is a ValueError; a CUDA failure or a missing device a
// RuntimeError.
void ThrowIfError(const kernels::Status& s) {
  if (s.ok()) return;
  if (s.code() == kernels::StatusCode::kInvalidArgument) throw py::value_error(s.ToString());
  throw std::runtime_error(s.ToString());
}

void ThrowIfCudaError(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("DeviceStats: ") + what + ": " + cudaGetErrorString(e));
  }
}

struct CudaFree {
  void operator()(char* p) const { cudaFree(p); }
};
struct CudaFreeHost {
  void operator()(char* p) const { cudaFreeHost(p); }
};

cudaStream_t StreamOf(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// CUDA tensors on the current device: the kernels launch there, and a
// pointer into another device's memory would be read from the wrong GPU.
Borrowed BorrowCuda(py::handle obj, const char* what, BorrowOptions::Kind kind) {
  BorrowOptions o;
  o.allow_cuda = true;
  o.kind = kind;
  Borrowed t(obj, o);
  if (!t.cuda()) {
    throw py::value_error(std::string("DeviceStats reads CUDA tensors; the ") + what +
                          " is on the host");
  }
  int current = 0;
  ThrowIfCudaError(cudaGetDevice(&current), "current device");
  if (t.device_id() != current) {
    throw py::value_error(std::string("the ") + what + " is on cuda:" +
                          std::to_string(t.device_id()) + " but the current device is cuda:" +
                          std::to_string(current) + " (torch.cuda.set_device)");
  }
  return t;
}

class DeviceStats {
 public:
  // The runtime's own reason when the kernels cannot run here (no device, a
  // driver older than this build's CUDA runtime, a GPU the build has no code
  // for), for the guard's fallback warning.
  DeviceStats() {
    const kernels::Status runnable = kernels::CudaKernelsRunnable();
    if (!runnable.ok()) {
      throw std::runtime_error("DeviceStats: no usable CUDA device (" + runnable.message() + ")");
    }
  }

  // One micro-batch's logits [..., vocab] and optional int32 labels, one
  // per row. Enqueued on `stream` and returns at once: the tensors may be
  // freed when this returns, because torch's caching allocator hands their
  // memory only to work on the same stream, which runs after these kernels.
  void AddLogits(py::handle logits, py::handle labels, int32_t ignore_index, uintptr_t stream) {
    Borrowed t = BorrowCuda(logits, "logits", BorrowOptions::Kind::kKernelFloat);
    const kernels::LogitsView v = LogitsViewOf(t);
    kernels::LogitStatsOptions o;
    o.ignore_index = ignore_index;
    std::optional<Borrowed> lab;
    if (!labels.is_none()) {
      lab.emplace(BorrowCuda(labels, "labels", BorrowOptions::Kind::kInt32));
      CheckLabelCount(lab->numel(), v.rows);
      o.labels = static_cast<const int32_t*>(lab->data());
    }
    if (v.rows == 0) return;  // no rows: nothing to count
    ThrowIfError(kernels::ValidateLogitsView(v));
    if (pending_ == slots_.size()) slots_.emplace_back();
    Slot& slot = slots_[pending_];
    if (slot.ws == nullptr || slot.max_rows < v.rows) {
      // Allocates (and synchronizes): the first steps only, while the
      // micro-batch count and row counts reach their steady state.
      slot.ws.reset();
      ThrowIfError(kernels::LogitStatsGpu::Create(v.rows, &slot.ws));
      slot.max_rows = v.rows;
    }
    ThrowIfError(slot.ws->Launch(v, o, StreamOf(stream)));
    ++pending_;
  }

  // The step's numbers: grad stats of `grads` (CUDA tensors; per tensor too
  // when per_tensor), the log Z sums of every add_logits() since the last
  // finish(), and `loss` (a float64 CUDA tensor of one element, or None).
  py::dict Finish(py::iterable grads, uintptr_t stream, bool per_tensor, py::object loss) {
    const cudaStream_t s = StreamOf(stream);
    // The micro-batches are this step's whatever happens below.
    const size_t pending = pending_;
    pending_ = 0;
    std::vector<Borrowed> held;
    std::vector<kernels::TensorView> views;
    for (py::handle g : grads) {
      held.push_back(BorrowCuda(g, "gradient", BorrowOptions::Kind::kKernelFloat));
      views.push_back({held.back().data(), held.back().dtype(), held.back().numel()});
    }
    std::optional<Borrowed> loss_t;
    if (!loss.is_none()) {
      loss_t.emplace(BorrowCuda(loss, "loss", BorrowOptions::Kind::kFloat64));
      if (loss_t->numel() != 1) throw py::value_error("loss must have one element");
    }
    if (!views.empty()) {
      ThrowIfError(PreparePlan(views, per_tensor, s));
      ThrowIfError(plan_->Launch(s));
    }
    const size_t grad_bytes = views.empty() ? 0 : plan_->result_bytes();
    const size_t logit_bytes = kernels::LogitStatsGpu::result_bytes();
    const size_t total = grad_bytes + pending * logit_bytes + (loss_t ? sizeof(double) : 0);
    kernels::GradStats gs;
    kernels::LogitStats lz;
    double loss_value = 0;
    if (total > 0) {
      Reserve(total);
      // Every result into one device buffer (device-to-device, enqueued)...
      size_t off = 0;
      auto gather = [&](const void* src, size_t n) {
        ThrowIfCudaError(
            cudaMemcpyAsync(staging_.get() + off, src, n, cudaMemcpyDeviceToDevice, s),
            "gather results");
        off += n;
      };
      if (grad_bytes > 0) gather(plan_->device_result(), grad_bytes);
      for (size_t i = 0; i < pending; ++i) gather(slots_[i].ws->device_result(), logit_bytes);
      if (loss_t) gather(loss_t->data(), sizeof(double));
      // ...and the step's one device-to-host copy, and its one wait. The
      // verdict must be on the host before optimizer.step(): the guard
      // decides there, in Python, whether the update runs (skip) or the
      // trainer stops (halt), and the agent sends the record from the
      // host. A sync-free variant would apply the skip on the device (a
      // found_inf-style step factor) instead; not built yet.
      ThrowIfCudaError(cudaMemcpyAsync(host_.get(), staging_.get(), total,
                                       cudaMemcpyDeviceToHost, s),
                       "copy results to the host");
      ++host_copies_;
      cudaError_t e;
      {
        py::gil_scoped_release release;  // other Python threads run meanwhile
        e = cudaStreamSynchronize(s);
      }
      ThrowIfCudaError(e, "synchronize the stream");
      off = 0;
      if (grad_bytes > 0) ThrowIfError(plan_->ResultFrom(host_.get(), &gs));
      off += grad_bytes;
      for (size_t i = 0; i < pending; ++i, off += logit_bytes) {
        kernels::LogitStats one;
        ThrowIfError(kernels::LogitStatsGpu::ResultFrom(host_.get() + off, &one));
        lz.sum_log_z += one.sum_log_z;
        lz.rows_counted += one.rows_counted;
        lz.nonfinite_rows += one.nonfinite_rows;
      }
      if (loss_t) std::memcpy(&loss_value, host_.get() + off, sizeof loss_value);
    }
    py::dict d;
    d["sum_squares"] = gs.sum_squares;
    d["nonfinite"] = gs.nonfinite;
    d["elements"] = gs.numel;
    d["max_abs"] = gs.max_abs;
    d["tensor_sum_squares"] = gs.tensor_sum_squares;
    d["tensor_nonfinite"] = gs.tensor_nonfinite;
    d["tensor_elements"] = TensorElements(views, per_tensor);
    d["log_z_sum"] = lz.sum_log_z;
    d["log_z_rows"] = lz.rows_counted;
    d["log_z_nonfinite_rows"] = lz.nonfinite_rows;
    d["loss"] = loss_t ? py::object(py::float_(loss_value)) : py::object(py::none());
    return d;
  }

  // Forgets the micro-batches since the last finish() (an abandoned step,
  // e.g. before a rollback); their kernels have run or will, unread.
  void Discard() { pending_ = 0; }

  size_t pending_logits() const { return pending_; }
  int64_t host_copies() const { return host_copies_; }

 private:
  struct Slot {
    std::unique_ptr<kernels::LogitStatsGpu> ws;
    int64_t max_rows = 0;
  };

  static std::vector<int64_t> TensorElements(const std::vector<kernels::TensorView>& views,
                                             bool per_tensor) {
    std::vector<int64_t> n;
    if (per_tensor) {
      for (const auto& v : views) n.push_back(v.numel);
    }
    return n;
  }

  // The plan for these gradients: kept while their count, dtypes and sizes
  // stay (every step of a run), repointed when only their addresses moved,
  // rebuilt (synchronous) otherwise.
  kernels::Status PreparePlan(const std::vector<kernels::TensorView>& views, bool per_tensor,
                              cudaStream_t s) {
    bool same_shapes = plan_ != nullptr && per_tensor == plan_per_tensor_ &&
                       views.size() == bound_.size();
    bool same_pointers = same_shapes;
    for (size_t i = 0; same_shapes && i < views.size(); ++i) {
      same_shapes = views[i].dtype == bound_[i].dtype && views[i].numel == bound_[i].numel;
      same_pointers = same_pointers && views[i].data == bound_[i].data;
    }
    if (same_shapes && same_pointers) return kernels::OkStatus();
    if (same_shapes) {
      TRAINWATCH_KERNELS_RETURN_IF_ERROR(plan_->Rebind(views.data(), views.size(), s));
    } else {
      plan_.reset();
      kernels::GradStatsOptions o;
      o.per_tensor = per_tensor;
      TRAINWATCH_KERNELS_RETURN_IF_ERROR(
          kernels::GradStatsGpuPlan::Create(views.data(), views.size(), o, &plan_));
      plan_per_tensor_ = per_tensor;
    }
    bound_ = views;
    return kernels::OkStatus();
  }

  // Device and pinned host buffers of at least `bytes`. Growing allocates,
  // which synchronizes the device: the first step only, in a steady run.
  void Reserve(size_t bytes) {
    if (bytes <= capacity_) return;
    staging_.reset();
    host_.reset();
    capacity_ = 0;
    char* d = nullptr;
    ThrowIfCudaError(cudaMalloc(reinterpret_cast<void**>(&d), bytes), "allocate the staging");
    staging_.reset(d);
    char* h = nullptr;
    ThrowIfCudaError(cudaMallocHost(reinterpret_cast<void**>(&h), bytes),
                     "allocate the pinned copy");
    host_.reset(h);
    capacity_ = bytes;
  }

  std::unique_ptr<kernels::GradStatsGpuPlan> plan_;
  bool plan_per_tensor_ = false;
  std::vector<kernels::TensorView> bound_;  // what plan_ reads
  std::vector<Slot> slots_;                 // one per micro-batch, reused
  size_t pending_ = 0;                      // slots launched since finish()
  std::unique_ptr<char, CudaFree> staging_;
  std::unique_ptr<char, CudaFreeHost> host_;
  size_t capacity_ = 0;
  int64_t host_copies_ = 0;
};

}  // namespace
#endif  // TRAINWATCH_KERNELS_HAVE_CUDA

namespace {

// Whether a CUDA device can run the kernels here, asked once: a CUDA build
// on a machine with nvcc and no GPU, with a driver older than the build's
// runtime, or with a GPU older than the architectures it was built for, has
// none.
bool CudaUsable() {
#if TRAINWATCH_KERNELS_HAVE_CUDA
  static const bool usable = kernels::CudaKernelsRunnable().ok();
  return usable;
#else
  return false;
#endif
}

}  // namespace

void RegisterDeviceStats(py::module_& m) {
  // `has_cuda` is read on first use (a module __getattr__, PEP 562), not at
  // import: asking for devices starts the CUDA driver, which an import (twctl
  // runs through this module too) must not do.
  m.def("__getattr__", [](const std::string& name) -> py::object {
    if (name == "has_cuda") return py::bool_(CudaUsable());
    throw py::attribute_error("module 'trainwatch._trainwatch' has no attribute '" + name + "'");
  });
  m.def("__dir__", [m]() {
    py::list names = py::list(m.attr("__dict__").attr("keys")());
    names.append("has_cuda");
    return names;
  });
#if TRAINWATCH_KERNELS_HAVE_CUDA
  m.attr("built_with_cuda") = true;
  py::class_<DeviceStats>(m, "DeviceStats",
                          "Grad stats and log Z of CUDA tensors by the fused kernels, on the "
                          "caller's stream, with one device-to-host copy per finish(). Not "
                          "thread-safe: one per training loop.")
      .def(py::init<>())
      .def("add_logits", &DeviceStats::AddLogits, py::arg("logits"),
           py::arg("labels") = py::none(), py::arg("ignore_index") = -100,
           py::arg("stream") = 0,
           "Enqueues log Z of [..., vocab] CUDA logits (labels: int32, one per row, or None); "
           "no copy, no wait.")
      .def("finish", &DeviceStats::Finish, py::arg("grads"), py::arg("stream") = 0,
           py::arg("per_tensor") = false, py::arg("loss") = py::none(),
           "Grad stats of CUDA `grads`, the log Z sums since the last finish() and `loss` "
           "(float64, one element), in one copy to the host; a dict.")
      .def("discard", &DeviceStats::Discard,
           "Forgets the add_logits() since the last finish() (an abandoned step).")
      .def_property_readonly("pending_logits", &DeviceStats::pending_logits)
      .def_property_readonly("host_copies", &DeviceStats::host_copies);
#else
  m.attr("built_with_cuda") = false;
#endif
}

}  // namespace trainwatch::python
