#include "io/model_presets.h"

namespace epmoe {

std::optional<nlohmann::json> model_preset(const std::string& name) {
  if (name == "qwen3-30b-a3b")
    return nlohmann::json::parse(R"({
      "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": false,
      "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "decoder_sparse_step": 1,
      "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
      "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
      "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": true,
      "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
      "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
      "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
      "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
      "use_sliding_window": false, "vocab_size": 151936})");
  if (name == "qwen3-235b-a22b") {  // the same architecture, larger (its hub config differs only here)
    nlohmann::json j = *model_preset("qwen3-30b-a3b");
    j["hidden_size"] = 4096;
    j["intermediate_size"] = 12288;
    j["moe_intermediate_size"] = 1536;
    j["num_attention_heads"] = 64;
    j["num_hidden_layers"] = 94;
    j["max_window_layers"] = 94;
    return j;
  }
  if (name == "qwen3-30b-a3b-fp8") {  // Qwen/Qwen3-30B-A3B-FP8: the same model, fp8 projections, bf16 scales
    nlohmann::json j = *model_preset("qwen3-30b-a3b");
    nlohmann::json keep = nlohmann::json::array({"lm_head"});
    for (int l = 0; l < j["num_hidden_layers"].get<int>(); l++) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      keep.push_back(p + "input_layernorm");
      keep.push_back(p + "mlp.gate");
      keep.push_back(p + "post_attention_layernorm");
    }
    j["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                {"weight_block_size", {128, 128}}, {"modules_to_not_convert", keep}};
    return j;
  }
  if (name == "deepseek-v2-lite")  // deepseek-ai/DeepSeek-V2-Lite
    return nlohmann::json::parse(R"({
      "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "attention_bias": false,
      "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001,
      "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
      "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
      "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
      "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6,
      "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": null,
      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
      "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                       "original_max_position_embeddings": 4096, "type": "yarn"},
      "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
      "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
      "use_cache": true, "v_head_dim": 128, "vocab_size": 102400})");
  if (name == "deepseek-v3")  // deepseek-ai/DeepSeek-V3 (shipped as FP8 with fp32 block scales)
    return nlohmann::json::parse(R"({
      "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": false,
      "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
      "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
      "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
      "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
      "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
      "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                              "weight_block_size": [128, 128]},
      "rms_norm_eps": 1e-06,
      "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                       "original_max_position_embeddings": 4096, "type": "yarn"},
      "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false,
      "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": true,
      "v_head_dim": 128, "vocab_size": 129280})");
  if (name == "glm-4.7-flash")  // zai-org/GLM-4.7-Flash
    return nlohmann::json::parse(R"({
      "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite", "attention_bias": false,
      "attention_dropout": 0.0, "pad_token_id": 154820, "eos_token_id": [154820, 154827, 154829],
      "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
      "intermediate_size": 10240, "kv_lora_rank": 512, "max_position_embeddings": 202752,
      "moe_intermediate_size": 1536, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 1,
      "norm_topk_prob": true, "num_attention_heads": 20, "num_experts_per_tok": 4, "num_hidden_layers": 47,
      "num_key_value_heads": 20, "num_nextn_predict_layers": 1, "partial_rotary_factor": 1.0,
      "q_lora_rank": 768, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
      "rope_scaling": null, "rope_theta": 1000000, "routed_scaling_factor": 1.8, "tie_word_embeddings": false,
      "topk_group": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": true,
      "v_head_dim": 256, "vocab_size": 154880})");
  return std::nullopt;
}

}  // namespace epmoe
