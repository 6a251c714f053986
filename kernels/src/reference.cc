// The fp64 reference implementations: deliberately the most direct code
// that follows the definitions in the headers.

#include "trainwatch/kernels/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "trainwatch/kernels/half.h"

namespace trainwatch::kernels {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool RowCounted(const int32_t* labels, int32_t ignore_index,
                const uint8_t* row_mask, int64_t r) {
  if (labels != nullptr && labels[r] == ignore_index) return false;
  if (row_mask != nullptr && row_mask[r] == 0) return false;
  return true;
}

// log Z of one row: max over finite logits plus log sum exp(u - max); NaN if
// the row holds a NaN, +inf if it holds +inf, -inf if no logit is finite.
double RowLogZ(const LogitsView& logits, int64_t r, double* row_max) {
  const int64_t base = r * logits.stride();
  double m = -kInf;
  bool nan = false, pinf = false;
  for (int64_t j = 0; j < logits.vocab; ++j) {
    const double x = LoadAsDouble(logits.data, logits.dtype, base + j);
    if (std::isnan(x)) {
      nan = true;
    } else if (x == kInf) {
      pinf = true;
    } else if (std::isfinite(x)) {
      m = std::max(m, x);
    }
  }
  *row_max = m;
  if (nan) return kNaN;
  if (pinf) return kInf;
  if (m == -kInf) return -kInf;
  double s = 0.0;
  for (int64_t j = 0; j < logits.vocab; ++j) {
    const double x = LoadAsDouble(logits.data, logits.dtype, base + j);
    if (std::isfinite(x)) s += std::exp(x - m);
  }
  return m + std::log(s);
}

}  // namespace

double LoadAsDouble(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(data)[i];
    case DType::kBFloat16:
      return BFloat16BitsToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kFloat16:
      return HalfBitsToFloat(static_cast<const uint16_t*>(data)[i]);
  }
  return kNaN;
}

Status ReferenceGradStats(const TensorView* tensors, size_t count,
                          const GradStatsOptions& options, GradStats* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateTensorViews(tensors, count));
  *out = GradStats();
  if (options.per_tensor) {
    out->tensor_sum_squares.assign(count, 0.0);
    out->tensor_nonfinite.assign(count, 0);
    out->tensor_max_abs.assign(count, 0.0);
  }
  for (size_t t = 0; t < count; ++t) {
    double sum = 0.0, max_abs = 0.0;
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < tensors[t].numel; ++i) {
      const double x = LoadAsDouble(tensors[t].data, tensors[t].dtype, i);
      if (!std::isfinite(x)) {
        ++nonfinite;
        continue;
      }
      sum += x * x;
      max_abs = std::max(max_abs, std::fabs(x));
    }
    out->sum_squares += sum;
    out->nonfinite += nonfinite;
    out->numel += tensors[t].numel;
    out->max_abs = std::max(out->max_abs, max_abs);
    if (options.per_tensor) {
      out->tensor_sum_squares[t] = sum;
      out->tensor_nonfinite[t] = nonfinite;
      out->tensor_max_abs[t] = max_abs;
    }
  }
  return OkStatus();
}

Status ReferenceLogitStats(const LogitsView& logits,
                           const LogitStatsOptions& options, LogitStats* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateLogitsView(logits));
  *out = LogitStats();
  for (int64_t r = 0; r < logits.rows; ++r) {
    if (!RowCounted(options.labels, options.ignore_index, options.row_mask,
                    r)) {
      if (options.row_log_z != nullptr) {
        options.row_log_z[r] = static_cast<float>(kNaN);
      }
      continue;
    }
    ++out->rows_counted;
    double row_max;
    const double log_z = RowLogZ(logits, r, &row_max);
    out->max_logit = std::max(out->max_logit, row_max);
    if (std::isfinite(log_z)) {
      out->sum_log_z += log_z;
    } else {
      ++out->nonfinite_rows;
    }
    if (options.row_log_z != nullptr) {
      options.row_log_z[r] = static_cast<float>(log_z);
    }
  }
  return OkStatus();
}

Status ReferenceCrossEntropyZLoss(const LogitsView& logits,
                                  const CrossEntropyOptions& options,
                                  CrossEntropyResult* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateCrossEntropyArgs(logits, options));
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateLogitsView(logits));
  *out = CrossEntropyResult();
  const int64_t gstride =
      options.grad_row_stride == 0 ? logits.vocab : options.grad_row_stride;
  const double alpha = options.z_loss_alpha;
  for (int64_t r = 0; r < logits.rows; ++r) {
    const int32_t y = options.labels[r];
    const bool ignored = y == options.ignore_index;
    const bool valid = !ignored && y >= 0 && y < logits.vocab;
    double loss = 0.0;
    double log_z = 0.0;
    if (!ignored) {
      ++out->rows_counted;
      if (!valid) ++out->invalid_labels;
      double row_max;
      log_z = RowLogZ(logits, r, &row_max);
      const double z = alpha * log_z * log_z;
      loss = valid ? log_z -
                         LoadAsDouble(logits.data, logits.dtype,
                                      r * logits.stride() + y) +
                         z
                   : kNaN;
      out->loss_sum += loss;
      out->z_loss_sum += z;
      out->log_z_sum += log_z;
    }
    if (options.row_loss != nullptr) {
      options.row_loss[r] = static_cast<float>(loss);
    }
    if (options.grad_logits == nullptr) continue;
    for (int64_t j = 0; j < logits.vocab; ++j) {
      double g = 0.0;
      if (!ignored) {
        const double x =
            LoadAsDouble(logits.data, logits.dtype, r * logits.stride() + j);
        const double p = std::exp(x - log_z);
        g = valid ? (p - (j == y ? 1.0 : 0.0) + 2.0 * alpha * log_z * p) *
                        options.grad_scale
                  : kNaN;
      }
      const int64_t k = r * gstride + j;
      switch (logits.dtype) {
        case DType::kFloat32:
          static_cast<float*>(options.grad_logits)[k] = static_cast<float>(g);
          break;
        case DType::kBFloat16:
          static_cast<uint16_t*>(options.grad_logits)[k] =
              FloatToBFloat16Bits(static_cast<float>(g));
          break;
        case DType::kFloat16:
          static_cast<uint16_t*>(options.grad_logits)[k] =
              FloatToHalfBits(static_cast<float>(g));
          break;
      }
    }
  }
  return OkStatus();
}

}  // namespace trainwatch::kernels
