// Internal to src/kernels: the micro-kernel interface shared by the matmul drivers.
//
// A micro-kernel computes an mr x nr tile of dot products: out[i * nr + j] = x_i . w_j over K,
// for mr <= kMaxMR activation rows and nr <= kMaxNR weight rows, given as row pointers. Its
// per-element arithmetic must not depend on mr, nr or which rows come along (batch invariance).
//
// K blocks: a call covers the vector steps of [k0, k1) only (k0, k1 multiples of kKAlign, or
// k1 = K). With k0 > 0 the lane accumulators start from acc ([mr][nr][16] floats, as the previous
// block left them), else from zero; with k1 < K they are stored back to acc and out is untouched;
// with k1 = K the lanes are reduced, the scalar tail added and out written. The lanes thus see the
// same k sequence as in one call over [0, K): the bits do not depend on the blocking.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace epmoe {

inline constexpr int kMaxMR = 4;  // activation rows per tile
inline constexpr int kMaxNR = 4;  // weight rows per tile: 4 x 4 fp32 accumulators + 4 weights + 1 x fit in 32 zmm
inline constexpr int64_t kKAlign = 32;  // K block boundaries are multiples of this (the bf16 step)

using MicroFn = void (*)(int mr, int nr, const void* const* x, const void* const* w, int64_t K, int64_t k0, int64_t k1,
                         float* acc, float* out);

struct Micro {
  MicroFn fn = nullptr;
  bool x_bf16 = false;  // the kernel wants activations rounded to bf16 (row pointers to uint16_t)
  bool k_blocks = false;  // honours [k0, k1) and acc; otherwise it must be called with k0 = 0, k1 = K
  const char* name = "";
};

// Per weight dtype; nullptr when the path does not handle that dtype.
Micro generic_micro(DType w);
Micro avx512_micro(DType w);       // only call when cpu_features().avx512
Micro avx512_bf16_micro(DType w);  // only call when cpu_features().avx512_bf16

}  // namespace epmoe
