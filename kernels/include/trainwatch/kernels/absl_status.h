// Conversion to absl::Status for the layers that use Abseil (the agent). Only
// this header needs Abseil; the kernels library itself does not, and nothing
// in it includes this file.

#ifndef TRAINWATCH_KERNELS_ABSL_STATUS_H_
#define TRAINWATCH_KERNELS_ABSL_STATUS_H_

#include "absl/status/status.h"
#include "trainwatch/kernels/status.h"

namespace trainwatch::kernels {

// The codes share their numbers, so the conversion keeps the code as is.
inline absl::Status ToAbslStatus(const Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.code())),
                      s.message());
}

}  // namespace trainwatch::kernels

#endif  // TRAINWATCH_KERNELS_ABSL_STATUS_H_
