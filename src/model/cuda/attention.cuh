// Attention of the decoder on the GPU, twin of the attention of model/model.cc (the CPU code is
// the reference): q/k norm + RoPE + KV-cache append per token, then causal GQA attention.
#pragma once

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

// Per token of this forward: where its K/V rows go and its position.
struct TokenSlot {
  float* k;  // cache of layer 0 at row 0; layer l at + l * cap * kvd
  float* v;
  int pos;   // position of the token in its sequence
  int cap;   // cache rows per layer
  int first; // index of the sequence's first token in this forward (for nothing but checks)
};

// model.cc attention, the part per token: q/k RMSNorm over head_dim (when q_norm), RoPE (half
// split, first rotary_dim dims), q -> q_out, k and v appended to the cache at the token's position.
// qkv: [T, (Hq + 2 Hkv) * D] fp32 (bias already added).
struct RopeArgs {
  const float* qkv = nullptr;
  int64_t T = 0;
  int Hq = 0, Hkv = 0, D = 0, rotary_dim = 0;
  const float* q_norm = nullptr;  // [D] or nullptr
  const float* k_norm = nullptr;
  float eps = 0;
  const float* inv_freq = nullptr;  // [rotary_dim / 2]
  const TokenSlot* slots = nullptr;
  int layer = 0;
  float* q_out = nullptr;  // [T, Hq * D]
};
void qk_norm_rope_cache(const RopeArgs& a, cudaStream_t s);

// Causal attention of each token over its sequence's cache up to and including itself (GQA),
// scores scaled by 1/sqrt(D), softmax in fp32; ctx [T, Hq * D] in the activation type.
template <class TA>
void attention(const float* q, const TokenSlot* slots, int layer, int64_t T, int Hq, int Hkv, int D, int max_ctx,
               TA* ctx, cudaStream_t s);

}  // namespace epmoe::cuda
