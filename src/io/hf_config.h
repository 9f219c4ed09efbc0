// config.json of a Hugging Face MoE model, in the hub's v4 spelling or transformers v5's.
// One struct for every family: families differ only in data (ARCHITECTURE.md), so the parser
// turns family-specific keys into the same fields, and the model code never asks "which family".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace epmoe {

enum class Family { Qwen3Moe, Qwen2Moe, Glm4Moe, Mixtral, DeepseekV2, DeepseekV3, Glm4MoeLite };
std::string_view family_name(Family f);

// How router logits become top-k expert ids and weights (src/moe/routing.h implements them).
enum class RoutingKind {
  SoftmaxTopK,         // softmax over all experts, top-k, optional renormalisation
  SigmoidGroupLimited, // DeepSeek-V3 / GLM4-MoE: sigmoid, correction bias, group-limited top-k
  SoftmaxGroupLimited, // DeepSeek-V2: softmax, greedy or group-limited greedy (group score = max)
};

struct RoutingConfig {
  RoutingKind kind = RoutingKind::SoftmaxTopK;
  int num_experts = 0;
  int top_k = 0;
  bool norm_topk_prob = false;
  int n_group = 1;
  int topk_group = 1;
  float routed_scaling_factor = 1.0f;
  bool has_correction_bias = false;  // e_score_correction_bias present (sigmoid routing)
  bool group_limited = true;         // DeepSeek-V2 topk_method: group_limited_greedy (true) or greedy
};

// Multi-head latent attention (DeepSeek-V2/V3, GLM-4.7-Flash), enabled when kv_lora_rank > 0:
//   q      = q_proj(x), or q_b_proj(RMSNorm_qa(q_a_proj(x))) when q_lora_rank > 0; per head
//            [qk_nope_head_dim | qk_rope_head_dim]
//   kv_a   = kv_a_proj_with_mqa(x) = [latent (kv_lora_rank) | k_rope (qk_rope_head_dim, one head
//            shared by all)], latent normalised by kv_a_layernorm
//   kv_b_proj expands the latent into per-head [k_nope (qk_nope_head_dim) | v (v_head_dim)].
// The latent norms use eps 1e-6 whatever rms_norm_eps says: transformers 5.17 builds them with the
// module default (sglang and vLLM pass rms_norm_eps; with GLM-4.7-Flash's 1e-5 they differ).
struct MlaConfig {
  int q_lora_rank = 0;  // 0: q_proj
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = true;  // rope on pairs (2i, 2i+1), as DeepSeek's checkpoints expect
  float latent_norm_eps = 1e-6f;
  bool enabled() const { return kv_lora_rank > 0; }
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// YaRN rope scaling (rope_scaling / rope_parameters with type "yarn"), as transformers'
// _compute_yarn_parameters: inv_freq blended between interpolation and extrapolation over the
// correction range of beta_fast..beta_slow; cos/sin times attention_factor.
struct YarnConfig {
  bool enabled = false;
  double factor = 1.0;
  int original_max_position_embeddings = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;  // 0: absent
  double attention_factor = 1.0;              // the cos/sin multiplier, derived or given
  bool truncate = true;
};

// FP8 block-quantized checkpoints (quantization_config with quant_method "fp8"): every 2-D
// projection weight not in modules_to_not_convert is F8_E4M3 with X.weight_scale_inv, one scale
// per block of block x block elements.
struct QuantConfig {
  bool fp8 = false;
  int block = 128;
  std::vector<std::string> modules_to_not_convert;
};

struct ModelConfig {
  std::string source;  // path of config.json, for messages
  Family family = Family::Qwen3Moe;
  std::string model_type;
  std::string torch_dtype;  // "torch_dtype" (hub v4) or "dtype" (transformers v5); "" when absent
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;             // MLA: qk_nope_head_dim + qk_rope_head_dim (the query/key head)
  int rotary_dim = 0;           // head_dim * partial_rotary_factor, even; MLA: qk_rope_head_dim
  MlaConfig mla;                // disabled: standard (GQA) attention with q/k/v/o_proj
  YarnConfig yarn;
  float rope_theta = 10000.f;
  float rms_norm_eps = 1e-6f;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;
  bool qk_norm = false;

  int intermediate_size = 0;      // dense MLP layers
  int moe_intermediate_size = 0;  // one routed expert
  RoutingConfig routing;
  std::vector<bool> sparse_layer;  // per layer: MoE (true) or dense MLP (false)

  // Shared experts, computed on the token's home rank and added after the routed output.
  int shared_intermediate_size = 0;  // 0: none
  bool shared_expert_gated = false;  // Qwen2-MoE: scaled by sigmoid(shared_expert_gate(x))

  std::vector<int> eos_token_ids;
  int bos_token_id = -1;

  QuantConfig quant;
  int num_nextn_predict_layers = 0;  // multi-token-prediction layers in the checkpoint: not loaded

  // The attention's softmax scale: head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under
  // YaRN with mscale_all_dim set (DeepSeek's correction for the longer context).
  float softmax_scale() const;

  int num_sparse_layers() const;
};

// Parses DIR/config.json (and DIR/generation_config.json for eos ids when present).
// Throws InputError naming the file and the field on anything missing, mistyped or unsupported.
ModelConfig load_model_config(const std::string& model_dir);
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);

}  // namespace epmoe
