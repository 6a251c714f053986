// The Python module's CUDA path: gradient statistics and log Z of CUDA
// tensors by kernels/' one-pass kernels (GradStatsGpuPlan, LogitStatsGpu),
// launched on the trainer's stream, with one device-to-host copy per
// optimizer step. trainwatch.torch's Guard uses it for CUDA tensors of the
// kernels' dtypes when the module was built with CUDA (built_with_cuda), and torch
// operations otherwise.
//
// Depends on pybind11, DLPack (dlpack_view.h) and trainwatch::kernels only,
// not on the agent, so that bench/gpu_check.sh can build it as a module of
// its own (device_stats_module.cc) on a GPU machine that lacks gRPC/Abseil.

#ifndef TRAINWATCH_AGENT_PYTHON_DEVICE_STATS_H_
#define TRAINWATCH_AGENT_PYTHON_DEVICE_STATS_H_

#include <pybind11/pybind11.h>

namespace trainwatch::python {

// Adds `built_with_cuda` (bool: whether this build has the CUDA kernels), the
// lazily read `has_cuda` (bool: built with them, and a CUDA device can run
// them here) and, in a CUDA build, the class `DeviceStats` to `m`.
void RegisterDeviceStats(pybind11::module_& m);

}  // namespace trainwatch::python

#endif  // TRAINWATCH_AGENT_PYTHON_DEVICE_STATS_H_
