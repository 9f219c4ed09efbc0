// The decoder's data flow, written once for every device: what a step's tokens are, and the order
// of a step's phases over the layers. Each device supplies the phases (`Model` on the CPU,
// `GpuModel<T>` on the GPU, model/cuda/gpu_model.cu); neither repeats the loop, the checks of the
// tokens or the choice of the logit rows. tests/layering_test.sh fails a second layer loop.
//
//   x = embed(ids)
//   for every layer l:   hn = RMSNorm(x) . input_layernorm[l]
//                        x += o_proj(attention(q/k/v(hn), KV cache))    (the cache appended)
//                        hn = RMSNorm(x) . post_attention_layernorm[l]
//                        x += MoE(hn) (moe/moe_block.h) or the dense SwiGLU(hn)
//   logits[r] = lm_head(RMSNorm(x[r]) . norm)    for the rows r the step wants
//
// How a device computes a phase (fused epilogues, a residual add deferred into the next norm, a
// CUDA graph around the whole step) is its own business; the order and the data are not.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "io/hf_config.h"
#include "model/language_model.h"

namespace epmoe {

// One forward step's tokens, checked and laid out as every device reads them: the step's rows are
// the sequences' new tokens, sequence after sequence.
struct DecoderStep {
  std::vector<int64_t> offsets;    // [S + 1]: sequence s's new tokens are rows offsets[s] .. offsets[s + 1) - 1
  std::vector<int32_t> ids;        // [T] token ids
  std::vector<int64_t> positions;  // [T] absolute positions (the sequence's length before the step + i)
  std::vector<uint64_t> gids;      // [T] token_gid(sequence id, position): the replica choice's input
  int64_t max_context = 1;         // the longest context a row attends over (its position + 1), at least 1
  // The rows whose logits are wanted, sequence after sequence (each sequence's LogitRows: none, its
  // last new row, or all its new rows); and per sequence where its rows start in logit_rows and how
  // many (0 for none or a sequence without new tokens).
  std::vector<int32_t> logit_rows;
  std::vector<std::pair<int64_t, int64_t>> logit_span;
  int64_t T() const { return offsets.back(); }
  int64_t rows_wanted() const { return int64_t(logit_rows.size()); }
};

// The step for `tokens[s]` appended to `seqs[s]`, with `wanted[s]`'s logit rows: InputError for
// an id outside the vocabulary or a position at or beyond max_position_embeddings (naming the
// sequence); nothing is changed.
DecoderStep plan_decoder_step(const ModelConfig& cfg, const std::vector<Sequence*>& seqs,
                              const std::vector<std::vector<int32_t>>& tokens, const std::vector<LogitRows>& wanted);

// The layers of a step, in the order above. Ops (one struct per device; templates, not virtual
// calls, because the GPU's phases only enqueue kernels and a graph captures them):
//   void attention_norm(int l);    hn = RMSNorm(x) . input_layernorm[l]
//   void attention(int l);         x += attention block of layer l on hn (KV cache written)
//   void mlp_norm(int l);          hn = RMSNorm(x) . post_attention_layernorm[l]
//   void moe(int l, int moe);      x += the MoE block on hn; `moe` = its index among the MoE layers
//   void dense_mlp(int l);         x += SwiGLU(hn) of a dense layer
//   void layer_done(int l);        after the layer (the CPU's --check-numerics)
template <class Ops>
void run_decoder_layers(const ModelConfig& cfg, Ops& ops) {
  for (int l = 0, moe = 0; l < cfg.num_layers; l++) {
    ops.attention_norm(l);
    ops.attention(l);
    ops.mlp_norm(l);
    if (cfg.sparse_layer[size_t(l)]) ops.moe(l, moe++);
    else ops.dense_mlp(l);
    ops.layer_done(l);
  }
}

}  // namespace epmoe
