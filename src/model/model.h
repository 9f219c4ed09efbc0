// The decoder on the CPU: embedding -> layers (RMSNorm, attention with KV cache, RMSNorm, dense MLP
// or the MoE layer) -> final norm -> lm_head. One code path for every family; families differ in
// data (config flags and weights), never in branches on the family. It implements LanguageModel
// (model/language_model.h), the interface the engine drives on every device; this is also the
// readable reference the GPU model (model/cuda/) is held against.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ep/backend.h"
#include "ep/placement.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/language_model.h"
#include "model/weights.h"
#include "util/reserved_memory.h"
#include "util/scratch.h"

namespace epmoe {

class Model final : public LanguageModel {
 public:
  // Loads the non-expert weights and the experts `placement` gives to `rank`. `compute`: the
  // activation precision of its matmuls (the engine passes --compute), passed to every product
  // of every pass. `kv`: the KV pool (kv_pool_tokens). `lm_head`: the checkpoint's head, or int8
  // rows quantized at load (model/weights.h).
  Model(const ModelConfig& cfg, const Checkpoint& ckpt, const Placement& placement, int rank, ComputeMode compute,
        const KvOptions& kv = {}, LmHeadForm lm_head = LmHeadForm::Checkpoint);

  const ModelConfig& config() const override { return cfg_; }
  Device device() const override { return Device::Cpu; }
  const Placement& placement() const { return placement_; }
  const ModelWeights& weights() const { return w_; }

  KvPool& kv_pool() override { return *pool_; }

  // LanguageModel::step (logits, argmax; the host draws); check_numerics stops at the first layer
  // that produces NaN/Inf.
  StepResult step(const StepBatch& batch, A2ABackend& backend) override;

  void mlp_block(int layer, const float* x, int64_t T, const uint64_t* gids, A2ABackend& backend, float* y) override;

 private:
  // The CPU's phases of the decoder's one layer loop (model/decoder.h), defined in model.cc.
  struct StepOps;
  // mlp_block with routing replay: MoE layer number `moe` (0.. in layer order) of the step.
  void mlp(int layer, int moe, const float* x, int64_t T, const uint64_t* gids, A2ABackend& backend, float* y,
           const ForwardOptions& opt);
  void attention(int layer, const std::vector<Sequence*>& seqs, const std::vector<int64_t>& offsets,
                 const float* x, int64_t T, float* out) const;
  // Multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash), in the absorbed form for every
  // token: the cache holds [latent | k_rope] per token, not per head.
  void mla_attention(int layer, const std::vector<Sequence*>& seqs, const std::vector<int64_t>& offsets,
                     const float* x, int64_t T, float* out) const;

  ModelConfig cfg_;
  Placement placement_;
  int rank_;
  ComputeMode compute_;
  ModelWeights w_;
  Rope rope_;
  // MLA: W_UK^T of each layer, [heads][kv_lora_rank][qk_nope_head_dim] fp32 (the key half of
  // kv_b_proj, transposed once so that absorbing q_nope into the latent space is a matmul).
  std::vector<std::vector<float>> uk_t_;
  // The paged KV cache: K and V of block b, layer l, row r at ((l * blocks + b) * B + r) * width,
  // k_width_ / v_width_ floats per row (heads * head_dim each; MLA: kv_lora_rank +
  // qk_rope_head_dim in K and nothing in V). Reserved once, untouched until used (the pages come
  // when a block is first written).
  std::unique_ptr<KvPool> pool_;
  ReservedMemory k_mem_, v_mem_;
  float* k_ = nullptr;
  float* v_ = nullptr;
  int64_t k_width_ = 0, v_width_ = 0;
  float* kv_row(float* base, int64_t width, int layer, int32_t block, int64_t row) const;
  // Step buffers (util/scratch.h), reused from step to step: the residual stream, the normed
  // input, a stage's output, the tokens' global ids; attention's q, k, v and context. A model runs
  // one step at a time.
  struct StepBuffers {
    Scratch<float> x, hn, tmp, q, k, v, ctx;
    Scratch<uint64_t> gids;
  };
  mutable StepBuffers buf_;
};

}  // namespace epmoe
