// Attention of the decoder on the GPU, twin of the attention of model/model.cc (the CPU code is
// the reference): q/k norm + RoPE + KV-cache append per token, then causal GQA attention.
#pragma once

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

// The paged KV cache (model/kv_pool.h) as the kernels see it: one pool per K and V of
// [layer][block][row][kv_heads * head_dim] fp32, and this step's block tables concatenated.
// Position j of a token's sequence is row j % block_tokens of block tables[slot.table + j / block_tokens].
struct KvPages {
  float* k = nullptr;
  float* v = nullptr;
  const int32_t* tables = nullptr;
  int64_t blocks = 0;    // blocks per layer
  int block_tokens = 0;  // rows per block
};

// Per token of this forward: its position and where its sequence's block table starts.
struct TokenSlot {
  int pos;    // position of the token in its sequence
  int table;  // offset of the sequence's block table in KvPages::tables
};

// model.cc attention, the part per token: q/k RMSNorm over head_dim (when q_norm), RoPE (half
// split, first rotary_dim dims), q -> q_out, k and v written to the cache at the token's position
// (through its block table).
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
  KvPages kv;
  int layer = 0;
  float* q_out = nullptr;  // [T, Hq * D]
};
void qk_norm_rope_cache(const RopeArgs& a, cudaStream_t s);

// Copy on write (model/kv_pool.h): block src's K and V rows of every layer into block dst, queued
// on `s` (before the kernels of the step that writes dst).
void copy_kv_block(const KvPages& kv, int layers, int64_t kvd, int32_t src, int32_t dst, cudaStream_t s);

// Causal attention of each token over its sequence's cache up to and including itself (GQA),
// scores scaled by 1/sqrt(D), softmax in fp32; ctx [T, Hq * D] in the activation type. The keys
// are summed in position order whatever blocks hold them: the bits do not depend on the layout.
template <class TA>
void attention(const float* q, const TokenSlot* slots, const KvPages& kv, int layer, int64_t T, int Hq, int Hkv, int D,
               int max_ctx, TA* ctx, cudaStream_t s);

}  // namespace epmoe::cuda
