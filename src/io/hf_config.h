// config.json of a Hugging Face MoE model, in the hub's v4 spelling or transformers v5's.
// One struct for every family: families differ only in data (ARCHITECTURE.md), so the parser
// turns family-specific keys into the same fields, and the model code never asks "which family".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace epmoe {

enum class Family { Qwen3Moe, Qwen2Moe, Glm4Moe, Mixtral };
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

struct ModelConfig {
  std::string source;  // path of config.json, for messages
  Family family = Family::Qwen3Moe;
  std::string model_type;
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;           // head_dim * partial_rotary_factor, even
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

  int num_sparse_layers() const;
};

// Parses DIR/config.json (and DIR/generation_config.json for eos ids when present).
// Throws InputError naming the file and the field on anything missing, mistyped or unsupported.
ModelConfig load_model_config(const std::string& model_dir);
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);

}  // namespace epmoe
