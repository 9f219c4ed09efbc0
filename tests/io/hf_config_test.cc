// config.json parsing: v4 and v5 spellings, every family's keys, and clear refusals.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "common/golden.h"
#include "io/hf_config.h"
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
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(error_of(j).find("'rope_scaling' has rope type 'yarn'"), std::string::npos) << error_of(j);
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
