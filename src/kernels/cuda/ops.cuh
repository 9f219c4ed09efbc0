// The row-wise ops of the decoder on the GPU, twins of kernels/ops.cc (the CPU code is the
// reference): RMSNorm, the embedding gather, the residual add, activation conversion; and the
// pseudo-random fill of synthesized weights.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/x_fragments.cuh"

namespace epmoe::cuda {

// kernels/ops.cc rmsnorm: out = w * (x / sqrt(mean(x^2) + eps)); writes fp32 and/or act copies.
// rows (optional): output row t normalises input row rows[t]. xo (optional, no rows): the output
// also as split_gemv's x fragments of the next projection (x_fragments.cuh; H % 64 == 0).
template <class TA>
void rmsnorm(const float* x, const float* w, float eps, int64_t T, int H, const int32_t* rows, float* out_f32,
             TA* out_act, cudaStream_t s, const XFragments& xo = {});

// On unless EPMOE_NORM_SPLITS=0: in a decode step the input norm writes the q/k/v projection's x
// fragments and decode attention the o projection's (two launches fewer a layer, the same bits).
bool norm_splits();

// A MoE layer's output as the decoder adds it into the residual (moe/cuda/experts.cuh moe_output):
// routed (+ sigmoid(gate_logit[t]) * shared, or + shared without a gate). One definition for
// moe_output and residual_rmsnorm: the same bits either way.
struct MoeResidual {
  const float* routed = nullptr;      // [T, H]
  const float* shared = nullptr;      // [T, H] or nullptr
  const float* gate_logit = nullptr;  // [T] or nullptr
};
__device__ inline float moe_residual_value(const MoeResidual& m, int64_t i, int H) {
  float v = m.routed[i];
  if (m.shared) {
    const float g = m.gate_logit ? 1.0f / (1.0f + expf(-m.gate_logit[i / H])) : 1.0f;
    v += g * m.shared[i];
  }
  return v;
}

// x[t] += the MoE output of row t (moe_output's arithmetic), then rmsnorm of x[t] (rmsnorm's):
// the end of one layer and the input norm of the next in one launch.
template <class TA>
void residual_rmsnorm(float* x, const MoeResidual& m, const float* w, float eps, int64_t T, int H, float* out_f32,
                      TA* out_act, cudaStream_t s, const XFragments& xo = {});

// Both of the above (m.routed null: rmsnorm) on the chosen kernel whatever EPMOE_RMSNORM_REGS says:
// the loop kernel (rows re-read from memory) or, for H <= 4096, the row-in-registers kernel, which
// must give the loop kernel's bits (tests only).
template <class TA>
void rmsnorm_on_kernel(bool registers, float* x, const MoeResidual& m, const float* w, float eps, int64_t T, int H,
                       const int32_t* rows, float* out_f32, TA* out_act, cudaStream_t s,
                       const XFragments& xo = {});

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
