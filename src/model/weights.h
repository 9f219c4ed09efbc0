// The weights of a decoder, looked up in the checkpoint by their Hugging Face names. Big tensors
// stay views into the mmapped files; small vectors (norms, biases) are copied to fp32.
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "moe/experts.h"
#include "moe/moe_layer.h"

namespace epmoe {

struct AttentionWeights {
  TensorView q, k, v, o;
  std::vector<float> q_bias, k_bias, v_bias;  // empty when the family has none
  std::vector<float> q_norm, k_norm;          // [head_dim] or empty
};

struct LayerWeights {
  std::vector<float> input_norm, post_attention_norm;
  AttentionWeights attn;
  bool sparse = false;
  SwigluWeights dense;  // when !sparse
  MoeLayerWeights moe;  // when sparse
};

struct ModelWeights {
  TensorView embed;    // [V, H]
  TensorView lm_head;  // [V, H] (the embedding when tied)
  std::vector<float> final_norm;
  std::vector<LayerWeights> layers;
};

// Loads every non-expert weight, and the routed experts listed in `experts` (logical ids; the
// others are never touched, so their bytes are never read). Shapes are checked against the config.
ModelWeights load_weights(const ModelConfig& cfg, const Checkpoint& ckpt, const std::vector<int>& experts);

// --check-weights: reads every weight load_weights(cfg, ckpt, experts) would use (for fused
// expert tensors, only the slices of `experts`) and throws InputError naming the first tensor
// that holds a NaN or an Inf, its file and the element. Costs one pass over those bytes.
void check_weights_finite(const ModelConfig& cfg, const Checkpoint& ckpt, const std::vector<int>& experts);

}  // namespace epmoe
