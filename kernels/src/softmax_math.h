// Private: the exponent of the online softmax, shared by the CUDA kernels
// (logsumexp_cuda.cuh, cross_entropy_cuda.cu) and the host tests, which
// check the formula on values the GPU would otherwise be needed for.

#ifndef TRAINWATCH_KERNELS_SRC_SOFTMAX_MATH_H_
#define TRAINWATCH_KERNELS_SRC_SOFTMAX_MATH_H_

#if defined(__CUDACC__)
#define TRAINWATCH_SOFTMAX_HD __host__ __device__ __forceinline__
#else
#define TRAINWATCH_SOFTMAX_HD inline
#endif

namespace trainwatch::kernels::internal {

constexpr float kLog2e = 1.4426950408889634f;

// The argument of exp2 for exp(x - m), m the running max (or log Z): x - m
// first, then the scale. Never fmaf(x, log2e, -(m * log2e)): for |m| beyond
// FLT_MAX / log2e (~2.36e38) m * log2e overflows to inf, every term becomes
// exp2(-inf) = 0, and a finite row comes out with log Z = -inf. x - m itself
// only overflows when the difference is below -FLT_MAX, where -inf gives
// the right 0.
TRAINWATCH_SOFTMAX_HD float SoftmaxExp2Arg(float x, float m) {
  return (x - m) * kLog2e;
}

}  // namespace trainwatch::kernels::internal

#endif  // TRAINWATCH_KERNELS_SRC_SOFTMAX_MATH_H_
