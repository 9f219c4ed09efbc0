// config.json parsing: v4 and v5 spellings, every family's keys, and clear refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/golden.h"
#include "io/hf_config.h"
#include "io/model_presets.h"
#include "util/error.h"

namespace epmoe {
namespace {

using nlohmann::json;

json qwen3_base() {
  return json::parse(R"({
    "model_type": "qwen3_moe", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
    "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 128})");
}

std::string error_of(const json& j) {
  try {
    parse_model_config(j, "cfg.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfig, FixturesV4AndV5AgreeOnTheirCommonFields) {
  ModelConfig v4 = load_model_config(test::fixture("qwen3moe-tiny"));
  ModelConfig v5 = load_model_config(test::fixture("qwen3moe-tiny-v5"));
  EXPECT_EQ(v4.routing.num_experts, 8);
  EXPECT_EQ(v5.routing.num_experts, 8);  // v5: num_local_experts
  EXPECT_EQ(v5.rope_theta, 10000.0f);    // v5: rope_parameters.rope_theta
  EXPECT_EQ(v4.head_dim, 16);
  EXPECT_EQ(v4.num_layers, 3);
  EXPECT_EQ(v5.num_layers, 2);
  EXPECT_TRUE(v4.routing.norm_topk_prob);
  EXPECT_TRUE(v4.qk_norm);
  EXPECT_EQ(v4.eos_token_ids, std::vector<int>{2});
}

TEST(HfConfig, HeadDimFromConfigWinsOverHiddenOverHeads) {
  json j = qwen3_base();
  j["head_dim"] = 128;  // as Qwen3-30B-A3B: hidden / heads would be 8 here
  EXPECT_EQ(parse_model_config(j, "c").head_dim, 128);
  j.erase("head_dim");
  EXPECT_EQ(parse_model_config(j, "c").head_dim, 8);
}

TEST(HfConfig, SparseLayersFromStepAndMlpOnlyLayers) {
  ModelConfig c = load_model_config(test::fixture("qwen3moe-tiny-mixed-bf16"));  // step 2, mlp_only [3]
  EXPECT_EQ(c.sparse_layer, (std::vector<bool>{false, true, false, false}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.routing.norm_topk_prob);
  json j = qwen3_base();
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = {0, 2};
  EXPECT_EQ(parse_model_config(j, "c").sparse_layer, (std::vector<bool>{false, true, false, true}));
}

TEST(HfConfig, FamiliesMapToRoutingAndSharedExperts) {
  ModelConfig glm = load_model_config(test::fixture("glm4moe-tiny"));
  EXPECT_EQ(glm.routing.kind, RoutingKind::SigmoidGroupLimited);
  EXPECT_EQ(glm.routing.n_group, 2);
  EXPECT_EQ(glm.routing.topk_group, 1);
  EXPECT_FLOAT_EQ(glm.routing.routed_scaling_factor, 2.5f);
  EXPECT_EQ(glm.rotary_dim, 8);
  EXPECT_EQ(glm.sparse_layer, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(glm.shared_intermediate_size, 24);
  EXPECT_TRUE(glm.qkv_bias);
  EXPECT_TRUE(glm.qk_norm);
  ModelConfig q2 = load_model_config(test::fixture("qwen2moe-tiny"));
  EXPECT_EQ(q2.shared_intermediate_size, 40);
  EXPECT_TRUE(q2.shared_expert_gated);
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.qk_norm);
  ModelConfig mx = load_model_config(test::fixture("mixtral-tiny"));
  EXPECT_EQ(mx.routing.num_experts, 8);
  EXPECT_TRUE(mx.routing.norm_topk_prob);
  EXPECT_EQ(mx.moe_intermediate_size, 24);
  EXPECT_EQ(mx.head_dim, 16);
}

TEST(HfConfig, RefusesWhatItCannotRunWithTheFieldNamed) {
  json j = qwen3_base();
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  EXPECT_NE(error_of(j).find("'rope_scaling' has rope type 'longrope'; supported: default, yarn"), std::string::npos)
      << error_of(j);
  j = qwen3_base();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};  // YaRN needs the original context length
  EXPECT_NE(error_of(j).find("'rope_scaling.original_max_position_embeddings' must be a positive integer"),
            std::string::npos)
      << error_of(j);
  j = qwen3_base();
  j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 1e6}};
  EXPECT_NE(error_of(j).find("rope_parameters"), std::string::npos);
  j = qwen3_base();
  j.erase("hidden_size");
  EXPECT_NE(error_of(j).find("cfg.json: field 'hidden_size' is missing"), std::string::npos) << error_of(j);
  j = qwen3_base();
  j["num_attention_heads"] = "four";
  EXPECT_NE(error_of(j).find("'num_attention_heads' must be an integer"), std::string::npos) << error_of(j);
  j = qwen3_base();
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("must divide num_attention_heads"), std::string::npos) << error_of(j);
  j = qwen3_base();
  j["model_type"] = "llama";
  EXPECT_NE(error_of(j).find("'model_type' is 'llama'"), std::string::npos) << error_of(j);
  j = qwen3_base();
  j["num_experts_per_tok"] = 9;
  EXPECT_NE(error_of(j).find("exceeds the number of experts"), std::string::npos) << error_of(j);
  EXPECT_NE(error_of(json::array()).find("not a JSON object"), std::string::npos);
}

// What the config fuzzer (fuzz/config_fuzz.cc) checks of every accepted config, here on the
// values that once got through.
TEST(HfConfig, RotaryFactorInsideRopeParametersIsRangeChecked) {
  json j = qwen3_base();
  j["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 5.5}};  // rotary dim > head_dim
  EXPECT_NE(error_of(j).find("field 'rope_parameters.partial_rotary_factor' must be in (0, 1]"), std::string::npos)
      << error_of(j);
  j["rope_parameters"]["partial_rotary_factor"] = -1e300;  // int(head_dim * p) would be undefined
  EXPECT_NE(error_of(j).find("must be in (0, 1]"), std::string::npos);
  j["rope_parameters"]["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(parse_model_config(j, "c").rotary_dim, 4);
}

TEST(HfConfig, NumbersMustFitTheirFloatOrIntField) {
  json j = qwen3_base();
  j["rms_norm_eps"] = 1e300;  // Inf as a float
  EXPECT_NE(error_of(j).find("field 'rms_norm_eps'"), std::string::npos) << error_of(j);
  j = qwen3_base();
  j["rope_theta"] = 1e300;
  EXPECT_NE(error_of(j).find("field 'rope_theta' must be a positive number"), std::string::npos) << error_of(j);
  j = qwen3_base();
  j["eos_token_id"] = {2, 4294967298};  // would wrap to token 2
  EXPECT_NE(error_of(j).find("field 'eos_token_id' must be a list of integers"), std::string::npos) << error_of(j);
  json g = json::parse(std::ifstream(test::fixture("glm4moe-tiny") + "/config.json"));
  g["n_shared_experts"] = 1 << 30;  // times moe_intermediate_size overflows an int
  EXPECT_NE(error_of(g).find("field 'n_shared_experts'"), std::string::npos) << error_of(g);
}

}  // namespace
}  // namespace epmoe

namespace epmoe {
namespace {

// The new families' configs: MLA dims, YaRN, routers, dense/MoE layer patterns, FP8.
TEST(HfConfig, DeepSeekFamiliesParseTheirLatentAttentionRoutersAndLayers) {
  ModelConfig v2l = load_model_config(test::fixture("deepseek-v2-lite-tiny"));
  EXPECT_EQ(v2l.family, Family::DeepseekV2);
  EXPECT_TRUE(v2l.mla.enabled());
  EXPECT_EQ(v2l.mla.q_lora_rank, 0);
  EXPECT_EQ(v2l.head_dim, 24);  // nope 16 + rope 8
  EXPECT_EQ(v2l.rotary_dim, 8);
  EXPECT_EQ(v2l.routing.kind, RoutingKind::SoftmaxGroupLimited);
  EXPECT_FALSE(v2l.routing.group_limited);  // topk_method greedy
  EXPECT_EQ(v2l.shared_intermediate_size, 2 * 24);
  EXPECT_EQ(v2l.sparse_layer, (std::vector<bool>{false, true, true}));
  EXPECT_FALSE(v2l.yarn.enabled);
  EXPECT_EQ(v2l.softmax_scale(), 1.0f / std::sqrt(24.0f));

  ModelConfig v2 = load_model_config(test::fixture("deepseek-v2-tiny"));
  EXPECT_TRUE(v2.routing.group_limited);
  EXPECT_EQ(v2.mla.q_lora_rank, 48);
  ASSERT_TRUE(v2.yarn.enabled);
  EXPECT_EQ(v2.yarn.factor, 40.0);
  EXPECT_EQ(v2.yarn.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(v2.yarn.attention_factor, 1.0);  // mscale == mscale_all_dim
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_EQ(v2.softmax_scale(), float(1.0 / std::sqrt(24.0) * m * m));

  ModelConfig v3 = load_model_config(test::fixture("deepseek-v3-tiny"));
  EXPECT_EQ(v3.routing.kind, RoutingKind::SigmoidGroupLimited);
  EXPECT_TRUE(v3.routing.has_correction_bias);
  EXPECT_EQ(v3.routing.routed_scaling_factor, 2.5f);
  EXPECT_EQ(v3.mla.v_head_dim, 16);

  ModelConfig glm = load_model_config(test::fixture("glm4moe-lite-tiny"));
  EXPECT_EQ(glm.family, Family::Glm4MoeLite);
  EXPECT_EQ(glm.mla.latent_norm_eps, 1e-6f);  // transformers' module default, not rms_norm_eps (1e-5)
  EXPECT_EQ(glm.rms_norm_eps, 1e-5f);
  EXPECT_EQ(glm.eos_token_ids, (std::vector<int>{2, 5}));

  // mlp_layer_types wins over first_k_dense_replace; moe_layer_freq thins the MoE layers.
  json j = json::parse(std::ifstream(test::fixture("deepseek-v3-tiny") + "/config.json"));
  j["mlp_layer_types"] = {"sparse", "dense", "sparse"};
  EXPECT_EQ(parse_model_config(j, "c").sparse_layer, (std::vector<bool>{true, false, true}));
  j.erase("mlp_layer_types");
  j["num_hidden_layers"] = 5;
  j["moe_layer_freq"] = 2;
  EXPECT_EQ(parse_model_config(j, "c").sparse_layer, (std::vector<bool>{false, false, true, false, true}));
}

TEST(HfConfig, YarnAndLatentDimsThatWouldComputeGarbageAreRefused) {
  json base = json::parse(std::ifstream(test::fixture("deepseek-v3-tiny") + "/config.json"));
  json j = base;
  j["rope_scaling"]["beta_fast"] = 0;  // the correction range divides by it
  EXPECT_NE(error_of(j).find("'rope_scaling.beta_fast' must be positive"), std::string::npos) << error_of(j);
  j = base;
  j["rope_scaling"]["mscale_all_dim"] = -5.0;  // 0.1 * -5 * ln(40) + 1 < 0
  EXPECT_NE(error_of(j).find("'rope_scaling.mscale_all_dim' gives a non-positive softmax correction"), std::string::npos)
      << error_of(j);
  j = base;
  j["kv_lora_rank"] = 1 << 29;  // sums with the rope dim must not overflow
  EXPECT_NE(error_of(j).find("'kv_lora_rank' must be at most 65536"), std::string::npos) << error_of(j);
}

TEST(HfConfig, YarnWithoutMscalesUsesTheDefaultAttentionFactor) {
  json j = json::parse(std::ifstream(test::fixture("deepseek-v3-tiny") + "/config.json"));
  j["rope_scaling"].erase("mscale");
  j["rope_scaling"].erase("mscale_all_dim");
  ModelConfig c = parse_model_config(j, "c");
  EXPECT_DOUBLE_EQ(c.yarn.attention_factor, 0.1 * std::log(40.0) + 1.0);
  EXPECT_EQ(c.softmax_scale(), 1.0f / std::sqrt(24.0f));  // no mscale_all_dim: no softmax correction
}

TEST(HfConfig, Fp8QuantizationConfigIsParsedAndOtherMethodsRefused) {
  ModelConfig q = load_model_config(test::fixture("qwen3moe-fp8-tiny"));
  EXPECT_TRUE(q.quant.fp8);
  EXPECT_EQ(q.quant.block, 128);
  EXPECT_EQ(q.quant.modules_to_not_convert.size(), 9u);
  json j = json::parse(std::ifstream(test::fixture("qwen3moe-fp8-tiny") + "/config.json"));
  for (const char* method : {"awq", "gptq", "compressed-tensors", "mxfp4", "bitsandbytes"}) {
    j["quantization_config"]["quant_method"] = method;
    EXPECT_NE(error_of(j).find("'quantization_config.quant_method' is '" + std::string(method) + "'"), std::string::npos)
        << error_of(j);
  }
  j["quantization_config"]["quant_method"] = "fp8";
  j["quantization_config"]["fmt"] = "e5m2";
  EXPECT_NE(error_of(j).find("'quantization_config.fmt'"), std::string::npos) << error_of(j);
}

TEST(HfConfig, EveryPresetParses) {
  for (const char* name : {"qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-30b-a3b-fp8", "deepseek-v2-lite", "deepseek-v3",
                           "glm-4.7-flash"}) {
    SCOPED_TRACE(name);
    auto j = model_preset(name);
    ASSERT_TRUE(j.has_value());
    ModelConfig c = parse_model_config(*j, name);
    EXPECT_GT(c.num_sparse_layers(), 0);
  }
  ModelConfig v3 = parse_model_config(*model_preset("deepseek-v3"), "deepseek-v3");
  EXPECT_EQ(v3.mla.kv_lora_rank + v3.mla.qk_rope_head_dim, 576);
  EXPECT_EQ(v3.num_sparse_layers(), 58);  // first_k_dense_replace 3 of 61
  EXPECT_TRUE(v3.quant.fp8);
  EXPECT_EQ(v3.num_nextn_predict_layers, 1);
}

}  // namespace
}  // namespace epmoe
