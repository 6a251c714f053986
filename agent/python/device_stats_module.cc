// `_trainwatch_device`: DeviceStats alone, as a module of its own, for
// bench/gpu_check.sh on a GPU machine without the agent's dependencies
// (gRPC, Abseil). Built by kernels/CMakeLists.txt when standalone with
// TRAINWATCH_KERNELS_BUILD_PYTHON_CHECK; the product's module is
// bindings.cc, which registers the same class.

#include <pybind11/pybind11.h>

#include "device_stats.h"

PYBIND11_MODULE(_trainwatch_device, m) {
  m.doc() = "trainwatch DeviceStats (the CUDA statistics path), standalone";
  trainwatch::python::RegisterDeviceStats(m);
}
