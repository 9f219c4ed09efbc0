// Causal grouped-query attention over a paged fp32 KV cache, for the new tokens of a step (prefill
// chunks and decode steps alike), all sequences of the step in one call.
//
// Per (token, query head) -- a "row" -- with kv head h / (heads / kv_heads), over the positions
// j = 0 .. len - 1 of its sequence (len = the token's position + 1):
//   s_j = (q . k_j) * scale   q . k_j: the fp32 matmul micro-kernel's dot product (matmul.h: lanes
//                             over k, a fixed tree, the tail), one multiply by scale
//   p   = softmax(s)          max-subtracted; e_j = exp(s_j - max) (AVX-512: a vector exp of ~1 ulp,
//                             the same function on every lane and tail; generic: std::exp), their
//                             sum (AVX-512: 16 lanes over j = 16c + l, the fixed tree; generic: in
//                             order), p_j = e_j * (1 / sum)
//   o   = sum_j p_j v_j       ascending j from zero (AVX-512: one FMA per term; generic: multiply,
//                             then add)
// Nothing in a row's arithmetic depends on the other rows, the tiling, the thread count, the cache's
// block size or which sequences share the call: a row's bits are the same in a prefill of any
// chunking as in token-by-token decode (batch invariance, ARCHITECTURE.md). AVX2 + FMA CPUs run
// the AVX-512 arithmetic on 8-lane registers (attention_avx2.cc): the same bits. The generic path is the
// arithmetic of the plain loop (causal_attention_ref's float form: vec.h dot, ops.h softmax, axpy).
//
// Speed comes from the layout of the work, not from changing that arithmetic: the rows of a kv
// head's query group and of a few consecutive tokens form one tile, so every K and V row read from
// the cache serves the whole tile (scores by 4 x 4 micro-tiles, the context by up to 4 rows per V
// row); tiles are spread over the threads, longest contexts first.
#pragma once

#include <cstdint>
#include <vector>

namespace epmoe {

// The K (or V) rows of one sequence in one layer: position j's row starts at
// blocks[j / block_tokens] + (j % block_tokens) * row_stride; the kv head's D floats follow at
// + kv_head * head_dim.
struct KvRows {
  const float* const* blocks = nullptr;
  int64_t block_tokens = 1;
  int64_t row_stride = 0;
  const float* row(int64_t j) const { return blocks[j / block_tokens] + (j % block_tokens) * row_stride; }
};

struct AttentionDims {
  int heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
};

// One sequence's part of a step: its new tokens are rows t0 .. t0 + n - 1 of q and ctx, at
// positions base .. base + n - 1; the cache already holds their K and V.
struct AttentionSeq {
  int64_t t0 = 0, n = 0, base = 0;
  KvRows k, v;
};

// q, ctx: [T, heads * head_dim] (q rotated). ctx rows of every sequence's tokens are written.
void causal_attention(const AttentionDims& d, const std::vector<AttentionSeq>& seqs, const float* q, float* ctx);

// The plain definition in double precision (dot, softmax, weighted sum per row), for tests.
void causal_attention_ref(const AttentionDims& d, const std::vector<AttentionSeq>& seqs, const float* q, float* ctx);

}  // namespace epmoe
