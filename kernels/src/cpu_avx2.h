// Private: what the AVX2 kernel files (cpu_avx2.cc, cpu_avx2_logits.cc)
// share. TW_AVX2 is the per-function target attribute: the files compile
// with the baseline flags, and the code runs only after CpuHasAvx2().

#ifndef TRAINWATCH_KERNELS_SRC_CPU_AVX2_H_
#define TRAINWATCH_KERNELS_SRC_CPU_AVX2_H_

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#define TRAINWATCH_KERNELS_X86 1
#include <immintrin.h>

#define TW_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace trainwatch::kernels::internal {

// The sum of the eight int32 lanes (the per-lane counters of a pass).
TW_AVX2 inline int64_t SumI32(__m256i v) {
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
  int64_t s = 0;
  for (int32_t x : lanes) s += x;
  return s;
}

}  // namespace trainwatch::kernels::internal

#endif  // x86

#endif  // TRAINWATCH_KERNELS_SRC_CPU_AVX2_H_
