// Cross entropy with z-loss, forward and backward fused: for each row with
// label y, log Z = logsumexp(u), p_j = exp(u_j - log Z), and
//   loss = (log Z - u_y) + alpha * (log Z)^2
//   dloss/du_j = p_j - [j == y] + 2 * alpha * log Z * p_j.
// The z-loss term (PaLM, alpha = 1e-4) keeps log Z near 0; computing it in
// the same pass as the cross entropy means it costs no extra read of the
// logits.
//
// A plain fp64 reference runs on the CPU (trainwatch/kernels/reference.h);
// the fused kernel runs on a GPU (trainwatch/kernels/cuda.h).

#ifndef TRAINWATCH_KERNELS_CROSS_ENTROPY_H_
#define TRAINWATCH_KERNELS_CROSS_ENTROPY_H_

#include <cstdint>
#include <limits>

#include "trainwatch/kernels/status.h"
#include "trainwatch/kernels/tensor_view.h"

namespace trainwatch::kernels {

// Pointers live in the logits' memory space.
struct CrossEntropyOptions {
  // [rows], required. A row with labels[r] == ignore_index has no loss and a
  // zero gradient; any other label outside [0, vocab) is counted in
  // CrossEntropyResult::invalid_labels and its row gets a NaN loss.
  const int32_t* labels = nullptr;
  int32_t ignore_index = -100;
  double z_loss_alpha = 0.0;
  // Optional output: grad_scale * d(sum of row losses)/d(logits), same dtype
  // as the logits, [rows x vocab] with its own row stride (0: vocab). Pass
  // grad_scale = 1 / rows_counted for a mean loss. It may be the logits
  // themselves (in place: grad_logits == logits.data and the same row
  // stride); any other overlap with the logits is rejected.
  void* grad_logits = nullptr;
  int64_t grad_row_stride = 0;
  double grad_scale = 1.0;
  // Optional output: [rows] loss of each row (0 for an ignored row).
  float* row_loss = nullptr;
};

struct CrossEntropyResult {
  double loss_sum = 0.0;    // cross entropy + z-loss over counted rows
  double z_loss_sum = 0.0;  // the z-loss part of loss_sum
  double log_z_sum = 0.0;   // sum of log Z over counted rows
  int64_t rows_counted = 0;
  int64_t invalid_labels = 0;

  double mean_loss() const {
    return rows_counted > 0 ? loss_sum / static_cast<double>(rows_counted)
                            : std::numeric_limits<double>::quiet_NaN();
  }
};

// What every cross-entropy entry point requires of its arguments, beyond a
// valid LogitsView: labels present, a gradient row stride of at least vocab,
// grad_logits aligned to its element size and either disjoint from the
// logits or exactly the logits (in place). InvalidArgument otherwise. Reads
// no memory: works on device pointers too.
Status ValidateCrossEntropyArgs(const LogitsView& logits,
                                const CrossEntropyOptions& options);

}  // namespace trainwatch::kernels

#endif  // TRAINWATCH_KERNELS_CROSS_ENTROPY_H_
