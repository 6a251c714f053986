// ComputeLogitStats on the host: validation, row masking, path selection,
// and the portable scalar row kernel.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "cpu_kernels.h"
#include "trainwatch/kernels/logit_stats.h"

namespace trainwatch::kernels {
namespace internal {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The same chunking as the AVX2 kernel, with one fp32 accumulator per chunk.
template <DType D>
RowLse PortableRowLseImpl(const void* row, int64_t vocab) {
  RowLse st;
  st.max = -kInf;
  for (int64_t start = 0; start < vocab; start += kLogitChunkElems) {
    const int64_t end = std::min(vocab, start + kLogitChunkElems);
    float chunk_max = -kInf;
    for (int64_t i = start; i < end; ++i) {
      const float x = ElemTraits<D>::Value(row, i);
      if (std::isnan(x)) {
        ++st.nan;
      } else if (x == kInf) {
        ++st.posinf;
      } else if (x != -kInf) {
        chunk_max = std::max(chunk_max, x);
      }
    }
    if (chunk_max == -kInf) continue;
    if (chunk_max > st.max) {
      st.sum *= std::exp(static_cast<double>(st.max) - chunk_max);
      st.max = chunk_max;
    }
    float chunk_sum = 0.0f;
    for (int64_t i = start; i < end; ++i) {
      const float x = ElemTraits<D>::Value(row, i);
      if (std::isfinite(x)) chunk_sum += std::exp(x - st.max);
    }
    st.sum += chunk_sum;
  }
  return st;
}

}  // namespace

RowLseFn PortableRowLse(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &PortableRowLseImpl<DType::kFloat32>;
    case DType::kBFloat16:
      return &PortableRowLseImpl<DType::kBFloat16>;
    case DType::kFloat16:
      return &PortableRowLseImpl<DType::kFloat16>;
  }
  return nullptr;
}

}  // namespace internal

Status ValidateLogitsView(const LogitsView& logits) {
  if (!IsValidDType(logits.dtype)) {
    return InvalidArgumentError("logits: unknown dtype " +
                                std::to_string(static_cast<int>(logits.dtype)));
  }
  if (logits.rows < 0 || logits.vocab < 0 || logits.row_stride < 0) {
    return InvalidArgumentError("logits: negative rows, vocab or row_stride");
  }
  if (logits.row_stride != 0 && logits.row_stride < logits.vocab) {
    return InvalidArgumentError("logits: row_stride " +
                                std::to_string(logits.row_stride) +
                                " < vocab " + std::to_string(logits.vocab));
  }
  if (logits.rows > 0 && logits.vocab > 0 && logits.data == nullptr) {
    return InvalidArgumentError("logits: null data");
  }
  if (reinterpret_cast<uintptr_t>(logits.data) % DTypeSize(logits.dtype) != 0) {
    return InvalidArgumentError("logits: data not aligned to its element size");
  }
  return OkStatus();
}

Status ComputeLogitStats(const LogitsView& logits,
                         const LogitStatsOptions& options, LogitStats* out) {
  if (out == nullptr) return InvalidArgumentError("out is null");
  TRAINWATCH_KERNELS_RETURN_IF_ERROR(ValidateLogitsView(logits));
  CpuPath path = options.cpu_path;
  if (!CpuPathSupported(path)) {
    return UnavailableError(std::string("CPU path ") + CpuPathName(path) +
                            " is not supported by this processor or build");
  }
  if (path == CpuPath::kAuto) path = BestCpuPath();
  const internal::RowLseFn fn = path == CpuPath::kAvx2
                                    ? internal::Avx2RowLse(logits.dtype)
                                    : internal::PortableRowLse(logits.dtype);

  *out = LogitStats();
  float max_logit = -internal::kInf;
  const size_t esize = DTypeSize(logits.dtype);
  const char* base = static_cast<const char*>(logits.data);
  for (int64_t r = 0; r < logits.rows; ++r) {
    const bool counted =
        (options.labels == nullptr ||
         options.labels[r] != options.ignore_index) &&
        (options.row_mask == nullptr || options.row_mask[r] != 0);
    if (!counted) {
      if (options.row_log_z != nullptr) {
        options.row_log_z[r] = std::numeric_limits<float>::quiet_NaN();
      }
      continue;
    }
    ++out->rows_counted;
    const internal::RowLse st = fn(
        base + static_cast<size_t>(r) * logits.stride() * esize, logits.vocab);
    double log_z;
    if (st.nan > 0) {
      log_z = std::numeric_limits<double>::quiet_NaN();
    } else if (st.posinf > 0) {
      log_z = std::numeric_limits<double>::infinity();
    } else if (st.max == -internal::kInf) {
      log_z = -std::numeric_limits<double>::infinity();
    } else {
      log_z = static_cast<double>(st.max) + std::log(st.sum);
    }
    max_logit = std::max(max_logit, st.max);
    if (std::isfinite(log_z)) {
      out->sum_log_z += log_z;
    } else {
      ++out->nonfinite_rows;
    }
    if (options.row_log_z != nullptr) {
      options.row_log_z[r] = static_cast<float>(log_z);
    }
  }
  out->max_logit = max_logit;
  return OkStatus();
}

}  // namespace trainwatch::kernels
