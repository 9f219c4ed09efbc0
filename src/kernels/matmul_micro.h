// Internal to src/kernels: the micro-kernel interface shared by the matmul drivers.
//
// A micro-kernel computes an mr x nr tile of dot products: out[i * nr + j] = x_i . w_j over K,
// for mr <= kMaxMR activation rows and nr <= kMaxNR weight rows, given as row pointers. Its
// per-element arithmetic must not depend on mr, nr or which rows come along (batch invariance).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace epmoe {

inline constexpr int kMaxMR = 4;  // activation rows per tile
inline constexpr int kMaxNR = 4;  // weight rows per tile: 4 x 4 fp32 accumulators + 4 weights + 1 x fit in 32 zmm

using MicroFn = void (*)(int mr, int nr, const void* const* x, const void* const* w, int64_t K, float* out);

struct Micro {
  MicroFn fn = nullptr;
  bool x_bf16 = false;  // the kernel wants activations rounded to bf16 (row pointers to uint16_t)
  const char* name = "";
};

// Per weight dtype; nullptr when the path does not handle that dtype.
Micro generic_micro(DType w);
Micro avx512_micro(DType w);       // only call when cpu_features().avx512
Micro avx512_bf16_micro(DType w);  // only call when cpu_features().avx512_bf16

}  // namespace epmoe
