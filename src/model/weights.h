// The weights of a decoder, looked up in the checkpoint by their Hugging Face names. Big tensors
// stay views into the mmapped files; small vectors (norms, biases) are copied to fp32.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "moe/experts.h"
#include "moe/moe_layer.h"
#include "tensor/quantize.h"

namespace epmoe {

// Multi-head latent attention (io/hf_config.h MlaConfig). Empty views when not used.
struct MlaWeights {
  TensorView q;                    // q_proj [heads * qk_head_dim, H] (no q LoRA)
  TensorView q_a;                  // q_a_proj [q_lora_rank, H]
  std::vector<float> q_a_norm;     // q_a_layernorm [q_lora_rank]
  TensorView q_b;                  // q_b_proj [heads * qk_head_dim, q_lora_rank]
  TensorView kv_a;                 // kv_a_proj_with_mqa [kv_lora_rank + qk_rope_head_dim, H]
  std::vector<float> kv_a_norm;    // kv_a_layernorm [kv_lora_rank]
  TensorView kv_b;                 // kv_b_proj [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
};

struct AttentionWeights {
  TensorView q, k, v, o;           // standard attention (o: both kinds)
  MlaWeights mla;
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

// What the lm_head is read as (--lm-head): the checkpoint's tensor (exact, the default), or int8
// rows quantized at load (tensor/quantize.h; half the bytes a decode step reads of a bf16 head,
// logits no longer the checkpoint's).
enum class LmHeadForm { Checkpoint, Int8 };
LmHeadForm parse_lm_head_form(const std::string& s);  // "checkpoint" | "int8"; InputError otherwise

struct ModelWeights {
  TensorView embed;    // [V, H]
  TensorView lm_head;  // [V, H] (the embedding when tied; a view of lm_head_int8 under LmHeadForm::Int8)
  std::shared_ptr<const QuantizedMatrix> lm_head_int8;  // owns the quantized head's bytes, or null
  std::vector<float> final_norm;
  std::vector<LayerWeights> layers;
};

// Loads every non-expert weight, and the routed experts listed in `experts` (logical ids; the
// others are never touched, so their bytes are never read). Shapes are checked against the config.
ModelWeights load_weights(const ModelConfig& cfg, const Checkpoint& ckpt, const std::vector<int>& experts,
                          LmHeadForm lm_head = LmHeadForm::Checkpoint);

// --check-weights: reads every weight load_weights(cfg, ckpt, experts) would use (for fused
// expert tensors, only the slices of `experts`) and throws InputError naming the first tensor
// that holds a NaN or an Inf, its file and the element. Costs one pass over those bytes.
void check_weights_finite(const ModelConfig& cfg, const Checkpoint& ckpt, const std::vector<int>& experts);

}  // namespace epmoe
