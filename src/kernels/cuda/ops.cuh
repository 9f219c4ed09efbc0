// The row-wise ops of the decoder on the GPU, twins of kernels/ops.cc (the CPU code is the
// reference): RMSNorm, the embedding gather, the residual add, activation conversion; and the
// pseudo-random fill of synthesized weights.
#pragma once

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

// kernels/ops.cc rmsnorm: out = w * (x / sqrt(mean(x^2) + eps)); writes fp32 and/or act copies.
// rows (optional): output row t normalises input row rows[t].
template <class TA>
void rmsnorm(const float* x, const float* w, float eps, int64_t T, int H, const int32_t* rows, float* out_f32,
             TA* out_act, cudaStream_t s);

// Embedding rows: out[t] = float(table[ids[t]]).
template <class TW>
void embed(const int32_t* ids, const TW* table, int64_t T, int H, float* out, cudaStream_t s);

// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s);
// Conversion of activations.
template <class TO>
void convert(const float* in, TO* out, int64_t n, cudaStream_t s);

// Deterministic pseudo-random fill (benchmarks and synthesized models): uniform in [-scale, scale).
template <class T>
void fill_random(T* p, int64_t n, uint64_t seed, float scale, cudaStream_t s);

}  // namespace epmoe::cuda
