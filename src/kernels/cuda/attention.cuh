// The kernels of the decoder's attention on the GPU (GpuModel, model/cuda/, calls them), twins of the
// attention of model/model.cc (the CPU code is the reference): q/k norm + RoPE + KV-cache append per
// token, then causal GQA attention; and multi-head latent attention (Model::mla_attention, the
// absorbed form over a latent cache). Pure kernels over the views below: no model state.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/x_fragments.cuh"

namespace epmoe::cuda {

// The paged KV cache (model/kv_pool.h) as the kernels see it: one pool per K and V of
// [layer][block][row][kv_heads * head_dim] values, fp32 or bf16 (--kv-cache-dtype: written rounded
// to nearest even, read back into fp32; every sum over them is the same fp32 chain either way),
// and this step's block tables concatenated.
// Latent attention keeps one pool, k, of [layer][block][row][kv_lora_rank + qk_rope_head_dim]
// (the cache row [latent | k_rope] of a token, shared by every head); v is unused.
// Position j of a token's sequence is row j % block_tokens of block tables[slot.table + j / block_tokens].
struct KvPages {
  void* k = nullptr;  // float or bf16 values (`bf16`)
  void* v = nullptr;
  const int32_t* tables = nullptr;
  int64_t blocks = 0;    // blocks per layer
  int block_tokens = 0;  // rows per block
  bool bf16 = false;     // values stored as bf16, else fp32
  size_t value_bytes() const { return bf16 ? 2 : 4; }
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
  float attention_factor = 1.0f;    // cos/sin multiplier (YaRN; 1 otherwise)
  const TokenSlot* slots = nullptr;
  KvPages kv;
  int layer = 0;
  float* q_out = nullptr;  // [T, Hq * D]
};
void qk_norm_rope_cache(const RopeArgs& a, cudaStream_t s);

// Copy on write (model/kv_pool.h): block src's K rows (k_width values each) and V rows (v_width;
// 0: no V pool) of every layer into block dst, queued on `s` (before the kernels of the step that
// writes dst).
void copy_kv_block(const KvPages& kv, int layers, int64_t k_width, int64_t v_width, int32_t src, int32_t dst,
                   cudaStream_t s);

// Causal attention of each (token, q head) over its sequence's cache up to and including itself:
// scores q . k_j * scale over Dk dims, softmax in fp32, ctx = sum_j p_j v_j over Dv dims. Query
// head h of token t is at q[t * q_tok + h * q_head]; kv head h / (Hq / Hkv) of position j at
// kv.k[row(j) * k_stride + hk * Dk] and kv.v[row(j) * v_stride + hk * Dv]; ctx of (t, h) goes to
// ctx[t * o_tok + h * o_head]. GQA: Dk = Dv = head_dim, K and V pools. Latent attention: Hkv = 1,
// kv.v = kv.k, Dk = the whole cache row [latent | k_rope], Dv = the latent. The keys are summed in
// position order whatever blocks hold them: the bits do not depend on the layout.
enum class AttnKernel {
  Auto,
  Reference,  // attention_kernel: one block per (token, q head), rows read straight from the pool
  Tiled,      // attention_tiled_kernel: K/V tiles shared by the q heads of a kv head and a chunk's tokens
  Decode,     // attention_decode_kernel: one block per (token, q head), K/V tiles streamed ahead
};

struct AttnArgs {
  const float* q = nullptr;
  const TokenSlot* slots = nullptr;
  KvPages kv;
  int layer = 0;
  int64_t T = 0;
  int Hq = 0, Hkv = 0, Dk = 0, Dv = 0;
  int64_t k_stride = 0, v_stride = 0;
  int64_t q_tok = 0, q_head = 0, o_tok = 0, o_head = 0;
  float scale = 1.0f;  // ModelConfig::softmax_scale()
  int max_ctx = 1;     // the longest context of the step (shared memory for the scores)
  // The most tokens of one sequence in the step (a prefill chunk's length; 1 in decode): above 1
  // the tiled kernel gives a block several query tokens, which share its staged K/V rows.
  int max_run = 1;
  // Which kernel: Auto picks (the decode kernel for a few sequences of one token each, the tiled
  // one elsewhere it applies, the reference kernel otherwise); the tests force each. Every kernel
  // gives every query row the same bits.
  AttnKernel kernel = AttnKernel::Auto;
  // The decode kernel requests the K/V tiles of earlier positions before its PDL wait
  // (set for every call unless EPMOE_ATTN_EARLY_TILES=0: run 23, H100, 48 layers, one sequence
  // 6.10 -> 6.02 ms a token, 8 sequences 13.24 -> 13.15).
  bool early_tiles = false;
  // The o projection's x fragments (x_fragments.cuh: split_gemv_x_fragments of the o weight), for
  // the decode kernel to write the fp32 output rows into as well, saving the projection its
  // x-split launch (EPMOE_NORM_SPLITS); ignored by the other kernels and where the output rows are
  // not [T][Hq * Dv] contiguous.
  XFragments o_frag;
  // q/k norm + RoPE + KV-cache write of this step's tokens (rope.qkv set): attention() runs
  // qk_norm_rope_cache(rope) first and reads q from rope.q_out -- or, where the decode kernel runs
  // and rope_separate is false, that kernel does the same arithmetic for its own token itself (one
  // launch fewer; the same bits in the cache and the output; rope.q_out is then not written). q,
  // q_tok and q_head are ignored. GQA only (the rope's heads, D and KV pages those of these args).
  RopeArgs rope;
  bool rope_separate = false;  // the rope kernel first wherever (the model under EPMOE_ATTN_ROPE=0; tests)
};
// Whether a decode step of T tokens over Hq q heads gives the decode kernel at most one block per
// SM: there a block's latency is the kernel's, so it takes its 8-warp shape and the model has it do
// its own token's rope (run 30); beyond, the blocks queue for the SMs.
bool decode_blocks_one_per_sm(int64_t T, int Hq);
// Returns whether the output was also written as a.o_frag (the caller's projection then takes it
// as given); false where a.o_frag is empty or the kernel run does not write it.
template <class TA>
bool attention(const AttnArgs& a, TA* ctx, cudaStream_t s);
// Raises the attention kernel's shared-memory limit for Dk dims and max_ctx positions (what
// attention() does on its first call of a longer context; a graph capture calls it beforehand).
void attention_prepare(int Dk, int max_ctx);

// ---------------------------------------------------------------------------------------------
// Multi-head latent attention (model.cc Model::mla_attention, io/hf_config.h MlaConfig).

// Per token, from a = [q part (q_width) | latent (C) | k_rope (dr)] (rows lda apart, the output of
// the fused q_a / kv_a projection): the q LoRA rows RMS-normalised (q_lora > 0: q_a_norm, into
// qa_out [T, q_lora]), and the cache row [RMSNorm(latent) * kv_a_norm | rope(k_rope)] written at
// the token's position. Norms with eps (MlaConfig::latent_norm_eps); rope on dr dims, pairs
// (2i, 2i + 1) when interleaved else halves, cos/sin times attention_factor.
struct MlaLatentArgs {
  const float* a = nullptr;
  int64_t lda = 0, T = 0;
  int q_lora = 0, q_width = 0, C = 0, dr = 0;
  const float* q_a_norm = nullptr;  // [q_lora]
  float* qa_out = nullptr;          // [T, q_lora]
  const float* kv_a_norm = nullptr; // [C]
  float eps = 1e-6f;
  const float* inv_freq = nullptr;  // [dr / 2]
  float attention_factor = 1.0f;
  bool interleaved = true;
  const TokenSlot* slots = nullptr;
  KvPages kv;
  int layer = 0;
};
void mla_latent_cache(const MlaLatentArgs& a, cudaStream_t s);

// Per (token, head) of the queries q [T, Hq, dn + dr] (rows ldq apart): q_nope copied head-major
// into q_nope [Hq][T][dn] (the input of the per-head W_UK^T products), the rotated q_rope into
// columns C .. C + dr of q_cat [T][Hq][C + dr] (the absorbed query; W_UK^T q_nope fills 0 .. C).
struct MlaQueryArgs {
  const float* q = nullptr;
  int64_t ldq = 0, T = 0;
  int Hq = 0, dn = 0, dr = 0, C = 0;
  const float* inv_freq = nullptr;
  float attention_factor = 1.0f;
  bool interleaved = true;
  const TokenSlot* slots = nullptr;
  float* q_nope = nullptr;
  float* q_cat = nullptr;
};
void mla_queries(const MlaQueryArgs& a, cudaStream_t s);

// out[h * T + t] = t * Hq + h: row (h, t) of a head-major [Hq][T] layout in the token-major
// [T][Hq] one (the scatter rows of the per-head GEMMs).
void head_major_rows(int64_t T, int Hq, int32_t* out, cudaStream_t s);

}  // namespace epmoe::cuda
