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
  return std::nullopt;
}

}  // namespace epmoe
