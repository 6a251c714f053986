#include "trainwatch/kernels/cross_entropy.h"

#include <cstdint>
#include <string>

namespace trainwatch::kernels {

Status ValidateCrossEntropyArgs(const LogitsView& logits,
                                const CrossEntropyOptions& options) {
  if (options.labels == nullptr) {
    return InvalidArgumentError("cross entropy needs labels");
  }
  if (options.grad_row_stride != 0 && options.grad_row_stride < logits.vocab) {
    return InvalidArgumentError("grad_row_stride < vocab");
  }
  if (options.grad_logits == nullptr || logits.rows == 0 || logits.vocab == 0) {
    return OkStatus();
  }
  const uintptr_t esize = DTypeSize(logits.dtype);
  if (esize == 0) return InvalidArgumentError("invalid logits dtype");
  const uintptr_t grad = reinterpret_cast<uintptr_t>(options.grad_logits);
  if (grad % esize != 0) {
    return InvalidArgumentError("grad_logits not aligned to its element size");
  }
  // The byte ranges spanned by the two matrices, first row to last element.
  const auto span_end = [&](uintptr_t begin, int64_t stride) {
    return begin + static_cast<uintptr_t>(logits.rows - 1) *
                       static_cast<uintptr_t>(stride) * esize +
           static_cast<uintptr_t>(logits.vocab) * esize;
  };
  const int64_t in_stride = logits.stride();
  const int64_t grad_stride =
      options.grad_row_stride == 0 ? logits.vocab : options.grad_row_stride;
  const uintptr_t in = reinterpret_cast<uintptr_t>(logits.data);
  const bool overlap =
      grad < span_end(in, in_stride) && in < span_end(grad, grad_stride);
  if (overlap && !(grad == in && grad_stride == in_stride)) {
    return InvalidArgumentError(
        "grad_logits overlaps the logits without being them: for an in-place "
        "gradient pass grad_logits == logits.data with the same row stride (" +
        std::to_string(in_stride) + "), else disjoint memory");
  }
  return OkStatus();
}

}  // namespace trainwatch::kernels
