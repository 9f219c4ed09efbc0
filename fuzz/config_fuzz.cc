// Fuzzes the config.json parser (parse_model_config in src/io/hf_config.h) on arbitrary JSON.
// Whatever it accepts must be a model the decoder can run without out-of-bounds indexing or
// division by zero: the checks below are the promises the model code relies on. The only
// exception allowed out is InputError.
#include <cmath>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "io/hf_config.h"
#include "util/error.h"

using namespace epmoe;

namespace {

void check_config(const ModelConfig& c) {
  FUZZ_REQUIRE(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0, "sizes are positive");
  FUZZ_REQUIRE(c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
               "kv heads divide the query heads");
  if (c.mla.enabled()) {
    // Latent attention: rope covers the qk_rope_head_dim slice only (pairs), so the nope part and
    // the whole head may be odd; every head reads the one latent row.
    const MlaConfig& m = c.mla;
    FUZZ_REQUIRE(m.kv_lora_rank > 0 && m.qk_nope_head_dim > 0 && m.v_head_dim > 0 && m.q_lora_rank >= 0,
                 "latent dims are positive");
    FUZZ_REQUIRE(m.qk_rope_head_dim > 0 && m.qk_rope_head_dim % 2 == 0, "the rope slice is even");
    FUZZ_REQUIRE(c.head_dim == m.qk_nope_head_dim + m.qk_rope_head_dim && c.rotary_dim == m.qk_rope_head_dim,
                 "head_dim is nope + rope, the rotary dim the rope slice");
    FUZZ_REQUIRE(c.num_kv_heads == c.num_heads, "every head reads the latent");
  } else {
    FUZZ_REQUIRE(c.head_dim > 0 && c.head_dim % 2 == 0, "head_dim is positive and even");
  }
  if (c.yarn.enabled) {
    FUZZ_REQUIRE(c.yarn.factor >= 1 && c.yarn.original_max_position_embeddings > 0, "yarn factor and context");
    FUZZ_REQUIRE(c.yarn.beta_fast > 0 && c.yarn.beta_slow > 0, "yarn rotation counts are positive");
    FUZZ_REQUIRE(std::isfinite(c.yarn.attention_factor) && c.yarn.attention_factor > 0, "yarn attention factor");
    FUZZ_REQUIRE(std::isfinite(c.softmax_scale()) && c.softmax_scale() > 0, "softmax scale");
  }
  FUZZ_REQUIRE(c.rotary_dim > 0 && c.rotary_dim % 2 == 0 && c.rotary_dim <= c.head_dim,
               "the rotary dimension is even and within head_dim");
  FUZZ_REQUIRE(std::isfinite(c.rope_theta) && c.rope_theta > 0, "rope theta is a positive number");
  FUZZ_REQUIRE(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps >= 0, "rms_norm_eps is finite");
  FUZZ_REQUIRE(c.max_position_embeddings > 0, "max_position_embeddings is positive");
  FUZZ_REQUIRE(c.sparse_layer.size() == size_t(c.num_layers), "one sparse flag per layer");
  FUZZ_REQUIRE(c.intermediate_size >= 0 && c.moe_intermediate_size >= 0 && c.shared_intermediate_size >= 0,
               "MLP sizes are not negative");
  const RoutingConfig& r = c.routing;
  if (c.num_sparse_layers() > 0) {
    FUZZ_REQUIRE(r.num_experts > 0 && r.top_k > 0 && r.top_k <= r.num_experts, "top-k within the experts");
    FUZZ_REQUIRE(c.moe_intermediate_size > 0, "experts have a size");
    FUZZ_REQUIRE(r.n_group > 0 && r.num_experts % r.n_group == 0, "groups divide the experts");
    FUZZ_REQUIRE(r.topk_group > 0 && r.topk_group <= r.n_group, "topk_group within the groups");
    FUZZ_REQUIRE(std::isfinite(r.routed_scaling_factor), "routed_scaling_factor is finite");
  }
  if (c.num_sparse_layers() < c.num_layers) FUZZ_REQUIRE(c.intermediate_size > 0, "dense layers have a size");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    check_config(parse_model_config(j, "fuzz/config.json"));
  } catch (const InputError&) {
  }
  return 0;
}
