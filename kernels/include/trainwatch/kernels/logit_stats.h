// Logit statistics: log Z = logsumexp of each row of a [rows x vocab] logit
// matrix, by online softmax (a running max and a sum rescaled whenever the
// max grows), so each logit is read from memory once; then the sum and mean
// of log Z over the rows that count, and the largest logit.
//
// Rows can be left out by a label array (rows whose label equals
// ignore_index, e.g. padding at -100) and/or a byte mask (rows whose mask is
// 0); a left-out row is not read at all.
//
// Nonfinite logits follow the gradient statistics' convention: statistics are
// over finite values, nonfinite ones are counted. A row whose log Z is not
// finite (it holds a NaN or +inf, or every logit is -inf) is counted in
// nonfinite_rows and left out of sum_log_z; max_logit is over the finite
// logits of the rows that count.

#ifndef TRAINWATCH_KERNELS_LOGIT_STATS_H_
#define TRAINWATCH_KERNELS_LOGIT_STATS_H_

#include <cstdint>
#include <limits>

#include "trainwatch/kernels/status.h"
#include "trainwatch/kernels/tensor_view.h"

namespace trainwatch::kernels {

// Pointers live in the same memory as the logits (host for the CPU entry
// point, device for the CUDA one). All are optional.
struct LogitStatsOptions {
  // [rows]; a row with labels[r] == ignore_index is left out.
  const int32_t* labels = nullptr;
  int32_t ignore_index = -100;
  // [rows]; a row with row_mask[r] == 0 is left out.
  const uint8_t* row_mask = nullptr;
  // [rows] output: log Z of each row (NaN for a left-out row).
  float* row_log_z = nullptr;
  // CPU only.
  CpuPath cpu_path = CpuPath::kAuto;
};

struct LogitStats {
  double sum_log_z = 0.0;      // over counted rows with a finite log Z
  int64_t rows_counted = 0;    // rows not left out by labels / row_mask
  int64_t nonfinite_rows = 0;  // counted rows whose log Z is not finite
  // Max finite logit over counted rows; -inf when there is none.
  double max_logit = -std::numeric_limits<double>::infinity();

  // Mean log Z over counted rows with a finite log Z; NaN when none. Across
  // ranks, reduce sum_log_z and the row counts, not the means.
  double mean_log_z() const {
    const int64_t n = rows_counted - nonfinite_rows;
    return n > 0 ? sum_log_z / static_cast<double>(n)
                 : std::numeric_limits<double>::quiet_NaN();
  }
};

// Computes the statistics of host logits on the calling thread. Rows are
// reduced in fixed-size chunks in a fixed order: results are bit-identical
// from run to run. Supported dtypes: float32, bfloat16 (and float16).
// Errors: InvalidArgument for a bad view (null data, negative sizes,
// row_stride < vocab, unknown dtype), Unavailable for an unsupported
// cpu_path.
Status ComputeLogitStats(const LogitsView& logits,
                         const LogitStatsOptions& options, LogitStats* out);

// Checks the view (shared by the CPU and CUDA entry points).
Status ValidateLogitsView(const LogitsView& logits);

}  // namespace trainwatch::kernels

#endif  // TRAINWATCH_KERNELS_LOGIT_STATS_H_
