// The decoder on the CPU: embedding -> layers (RMSNorm, attention with KV cache, RMSNorm, dense MLP
// or the MoE layer) -> final norm -> lm_head. One code path for every family; families differ in
// data (config flags and weights), never in branches on the family. It implements LanguageModel
// (model/language_model.h), the interface the engine drives on every device; this is also the
// readable reference the GPU model (model/cuda/) is held against.
#pragma once

#include <cstdint>
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

namespace epmoe {

// A sequence's KV cache on the CPU: per layer, [len, kv_heads * head_dim] keys and values.
struct CpuKvCache final : KvCache {
  std::vector<std::vector<float>> k, v;
};

class Model final : public LanguageModel {
 public:
  // Loads the non-expert weights and the experts `placement` gives to `rank`. `compute`: the
  // activation precision of its matmuls (the engine passes --compute; by default the kernels'
  // current mode), installed for every pass.
  Model(const ModelConfig& cfg, const Checkpoint& ckpt, const Placement& placement, int rank,
        ComputeMode compute = compute_mode());

  const ModelConfig& config() const override { return cfg_; }
  Device device() const override { return Device::Cpu; }
  const Placement& placement() const { return placement_; }
  const ModelWeights& weights() const { return w_; }

  Sequence new_sequence(uint64_t id) const override;

  // LanguageModel::forward; check_numerics stops at the first layer that produces NaN/Inf.
  std::vector<std::vector<float>> forward(const std::vector<Sequence*>& seqs,
                                          const std::vector<std::vector<int32_t>>& tokens,
                                          A2ABackend& backend, bool all_logits,
                                          const ForwardOptions& opt = {}) override;

  void mlp_block(int layer, const float* x, int64_t T, const uint64_t* gids, A2ABackend& backend, float* y) override;

 private:
  void attention(int layer, const std::vector<Sequence*>& seqs, const std::vector<int64_t>& offsets,
                 const float* x, int64_t T, float* out) const;

  ModelConfig cfg_;
  Placement placement_;
  int rank_;
  ComputeMode compute_;
  ModelWeights w_;
  Rope rope_;
};

}  // namespace epmoe
