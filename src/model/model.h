// The decoder: embedding -> layers (RMSNorm, attention with KV cache, RMSNorm, dense MLP or the
// MoE layer) -> final norm -> lm_head. One code path for every family; families differ in data
// (config flags and weights), never in branches on the family.
//
// A forward pass takes new tokens of several sequences at once (data-parallel attention: the
// sequences this rank serves). Attention runs per sequence; the MoE layer sees all of the rank's
// tokens together, and runs even when the rank has none (T = 0), because the other ranks need it
// at the same layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ep/backend.h"
#include "ep/placement.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "kernels/ops.h"
#include "model/weights.h"

namespace epmoe {

struct Sequence {
  uint64_t id = 0;                          // index in the user's input: feeds token_gid
  int64_t len = 0;                          // tokens already in the KV cache
  std::vector<std::vector<float>> k, v;     // per layer: [len, kv_heads * head_dim]
};

// What to check while running (all off by default).
struct ForwardOptions {
  bool check_numerics = false;  // stop at the first layer that produces NaN/Inf, naming it
};

class Model {
 public:
  // Loads the non-expert weights and the experts `placement` gives to `rank`.
  Model(const ModelConfig& cfg, const Checkpoint& ckpt, const Placement& placement, int rank);

  const ModelConfig& config() const { return cfg_; }
  const Placement& placement() const { return placement_; }
  const ModelWeights& weights() const { return w_; }

  Sequence new_sequence(uint64_t id) const;

  // Appends tokens[i] to seqs[i] for every i and returns logits: for each sequence, all positions
  // [n_i, V] when all_logits, else only the last [1, V] (empty when n_i = 0).
  std::vector<std::vector<float>> forward(const std::vector<Sequence*>& seqs,
                                          const std::vector<std::vector<int32_t>>& tokens,
                                          A2ABackend& backend, bool all_logits,
                                          const ForwardOptions& opt = {});

  // The MoE (or dense MLP) block of layer l alone: x [T, H] -> y [T, H]. For tests against the
  // goldens' per-layer input/output.
  void mlp_block(int layer, const float* x, int64_t T, const uint64_t* gids, A2ABackend& backend, float* y) const;

 private:
  void attention(int layer, const std::vector<Sequence*>& seqs, const std::vector<int64_t>& offsets,
                 const float* x, int64_t T, float* out) const;

  ModelConfig cfg_;
  Placement placement_;
  ModelWeights w_;
  Rope rope_;
};

// Index of the largest logit (ties to the lower id): greedy decoding.
int32_t argmax(const float* logits, int64_t n);

}  // namespace epmoe
