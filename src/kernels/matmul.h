// y[T, N] = x[T, K] . W[N, K]^T (+ bias[N]) with fp32 activations and W in its stored dtype.
//
// Batch invariance (ARCHITECTURE.md): every y[t, n] is computed with one fixed reduction order
// over k -- 16 fp32 lanes accumulate k = 16c + l, then the lanes are summed in a fixed tree, then
// the tail -- whatever T is, whichever tile the row falls in, and whichever thread runs it. The
// code uses GCC vector extensions, compiled for AVX-512, AVX2 and baseline x86-64 and chosen at
// run time; lane-wise arithmetic without FMA contraction gives the same bits on all three.
#pragma once

#include <cstdint>

#include "tensor/view.h"

namespace epmoe {

void matmul(const float* x, int64_t T, const TensorView& W, float* y, const float* bias = nullptr);

// Plain scalar reference (double accumulation), for tests of the fast path.
void matmul_ref(const float* x, int64_t T, const TensorView& W, float* y, const float* bias = nullptr);

}  // namespace epmoe
