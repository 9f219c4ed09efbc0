// Internal to src/kernels: what the AVX2 twins of the AVX-512 kernels share (matmul_avx2.cc,
// attention_avx2.cc). An AVX-512 accumulator's 16 lanes live in two 8-lane registers, lanes 0-7
// (lo) and 8-15 (hi); only call these where cpu_features().avx2 and .fma hold.
#pragma once

#include <immintrin.h>

#ifndef EPMOE_AVX2
#define EPMOE_AVX2 __attribute__((target("avx2,fma")))
#define EPMOE_AVX2_LAMBDA __attribute__((always_inline, target("avx2,fma")))
#endif

namespace epmoe {

// matmul_avx512.cc's reduce16 tree on the two halves: lo + hi is its first step (l + l+8), then
// + l+4, + l+2, + l+1 -- the same adds in the same order.
EPMOE_AVX2 inline float reduce16_avx2(__m256 lo, __m256 hi) {
  const __m256 a = _mm256_add_ps(lo, hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  const __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

}  // namespace epmoe
