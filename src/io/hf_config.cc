#include "io/hf_config.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "io/json_util.h"
#include "util/error.h"

namespace epmoe {

using nlohmann::json;

std::string_view family_name(Family f) {
  switch (f) {
    case Family::Qwen3Moe: return "qwen3_moe";
    case Family::Qwen2Moe: return "qwen2_moe";
    case Family::Glm4Moe: return "glm4_moe";
    case Family::Mixtral: return "mixtral";
    case Family::DeepseekV2: return "deepseek_v2";
    case Family::DeepseekV3: return "deepseek_v3";
    case Family::Glm4MoeLite: return "glm4_moe_lite";
  }
  return "?";
}

int ModelConfig::num_sparse_layers() const {
  return int(std::count(sparse_layer.begin(), sparse_layer.end(), true));
}

namespace {
// DeepSeek's yarn_get_mscale: 0.1 * m * ln(f) + 1 for f > 1.
double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }
}  // namespace

float ModelConfig::softmax_scale() const {
  if (yarn.enabled && yarn.mscale_all_dim != 0.0) {
    const double m = yarn_mscale(yarn.factor, yarn.mscale_all_dim);
    return float(1.0 / std::sqrt(double(head_dim)) * m * m);  // in double, as transformers' Python does
  }
  return 1.0f / std::sqrt(float(head_dim));  // what every family has always used (CPU and GPU alike)
}

namespace {

// Typed field access with messages that name the file and the field.
struct Fields {
  const json& j;
  const std::string& src;

  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    throw InputError(src + ": field '" + key + "' " + what);
  }
  bool has(const std::string& k) const { return j.contains(k) && !j[k].is_null(); }
  int64_t integer(const std::string& k) const {
    if (!has(k)) bad(k, "is missing");
    if (!j[k].is_number_integer()) bad(k, "must be an integer, got " + j[k].dump());
    return j[k].get<int64_t>();
  }
  int positive(const std::string& k) const {
    int64_t v = integer(k);
    if (v <= 0 || v > (1 << 30)) bad(k, "must be a positive integer, got " + std::to_string(v));
    return int(v);
  }
  int positive_or(const std::string& k, int dflt) const { return has(k) ? positive(k) : dflt; }
  int non_negative_or(const std::string& k, int dflt) const {
    if (!has(k)) return dflt;
    int64_t v = integer(k);
    if (v < 0 || v > (1 << 30)) bad(k, "must be a non-negative integer, got " + std::to_string(v));
    return int(v);
  }
  double number(const std::string& k) const {
    if (!has(k)) bad(k, "is missing");
    if (!j[k].is_number()) bad(k, "must be a number, got " + j[k].dump());
    return j[k].get<double>();
  }
  double number_or(const std::string& k, double dflt) const { return has(k) ? number(k) : dflt; }
  bool boolean_or(const std::string& k, bool dflt) const {
    if (!has(k)) return dflt;
    if (!j[k].is_boolean()) bad(k, "must be true or false, got " + j[k].dump());
    return j[k].get<bool>();
  }
  std::vector<int> int_list_or_empty(const std::string& k) const {
    std::vector<int> out;
    if (!has(k)) return out;
    // Range-checked: an id of 2^32 + 2 must not wrap around to token 2.
    auto one = [&](const json& v) {
      if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
        bad(k, "must be a list of integers, got " + j[k].dump());
      out.push_back(int(v.get<int64_t>()));
    };
    if (j[k].is_array()) {
      for (auto& v : j[k]) one(v);
    } else {
      one(j[k]);
    }
    return out;
  }
};

// head_dim * partial_rotary_factor, which must be in (0, 1]: the rotation covers part of the head,
// never more (found by fuzz/config_fuzz.cc: 5.5 inside rope_parameters made the rotary dimension
// exceed head_dim, and rope then wrote past the head).
void set_rotary_dim(const Fields& f, const std::string& key, double p, ModelConfig& c) {
  if (!(p > 0 && p <= 1)) f.bad(key, "must be in (0, 1], got " + std::to_string(p));
  c.rotary_dim = int(c.head_dim * p);
}

// Rope parameters: v4 `rope_theta` + `rope_scaling`, v5 `rope_parameters`. The default rope and
// YaRN are implemented; any other scaling is refused, since treating it as the default would give
// wrong logits past the original context.
void parse_rope(const Fields& f, ModelConfig& c) {
  c.rope_theta = float(f.number_or("rope_theta", 10000.0));
  auto check_type = [&](const std::string& key, const json& obj) {
    if (obj.is_null()) return;
    if (!obj.is_object()) f.bad(key, "must be an object or null");
    std::string type = "default";
    if (obj.contains("rope_type")) type = obj["rope_type"].is_string() ? obj["rope_type"].get<std::string>() : "?";
    else if (obj.contains("type")) type = obj["type"].is_string() ? obj["type"].get<std::string>() : "?";
    Fields r{obj, f.src};
    auto num = [&](const std::string& k, double dflt) {
      if (!r.has(k)) return dflt;
      if (!obj[k].is_number()) f.bad(key + "." + k, "must be a number, got " + obj[k].dump());
      const double v = obj[k].get<double>();
      if (!std::isfinite(v)) f.bad(key + "." + k, "must be finite");
      return v;
    };
    if (type == "yarn") {
      YarnConfig& y = c.yarn;
      y.enabled = true;
      y.factor = num("factor", 1.0);
      if (!(y.factor >= 1.0)) f.bad(key + ".factor", "must be >= 1 for yarn");
      const int64_t orig = r.has("original_max_position_embeddings") ? r.integer("original_max_position_embeddings") : 0;
      if (orig <= 0 || orig > (1 << 30))
        f.bad(key + ".original_max_position_embeddings", "must be a positive integer for yarn");
      y.original_max_position_embeddings = int(orig);
      y.beta_fast = num("beta_fast", 32.0);
      y.beta_slow = num("beta_slow", 1.0);
      // Rotation counts: the correction range divides by them (0 would make every frequency NaN).
      if (!(y.beta_fast > 0)) f.bad(key + ".beta_fast", "must be positive");
      if (!(y.beta_slow > 0)) f.bad(key + ".beta_slow", "must be positive");
      y.mscale = num("mscale", 0.0);
      y.mscale_all_dim = num("mscale_all_dim", 0.0);
      y.truncate = r.boolean_or("truncate", true);
      if (y.mscale_all_dim != 0.0 && !(yarn_mscale(y.factor, y.mscale_all_dim) > 0))
        f.bad(key + ".mscale_all_dim", "gives a non-positive softmax correction (0.1 * m * ln(factor) + 1 <= 0)");
      // transformers: the given attention_factor, else mscale(f, mscale) / mscale(f, mscale_all_dim)
      // when both are set, else mscale(f, 1).
      if (r.has("attention_factor")) y.attention_factor = num("attention_factor", 1.0);
      else if (y.mscale != 0.0 && y.mscale_all_dim != 0.0)
        y.attention_factor = yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim);
      else y.attention_factor = yarn_mscale(y.factor, 1.0);
      if (!(y.attention_factor > 0) || !std::isfinite(y.attention_factor))
        f.bad(key + ".attention_factor", "must be a positive number (from mscale / mscale_all_dim: " +
                                             std::to_string(y.attention_factor) + ")");
    } else if (type != "default") {
      f.bad(key, "has rope type '" + type + "'; supported: default, yarn");
    }
    if (obj.contains("rope_theta")) {
      if (!obj["rope_theta"].is_number()) f.bad(key + ".rope_theta", "must be a number");
      c.rope_theta = float(obj["rope_theta"].get<double>());
    }
    if (obj.contains("partial_rotary_factor")) {
      const json& p = obj["partial_rotary_factor"];
      if (!p.is_number()) f.bad(key + ".partial_rotary_factor", "must be a number");
      set_rotary_dim(f, key + ".partial_rotary_factor", p.get<double>(), c);
    }
  };
  if (f.has("rope_scaling")) check_type("rope_scaling", f.j["rope_scaling"]);
  if (f.has("rope_parameters")) check_type("rope_parameters", f.j["rope_parameters"]);
  // As a float: 1e39 would become Inf and every rotation angle NaN.
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) f.bad("rope_theta", "must be a positive number");
}

// quantization_config: FP8 e4m3 with 128 x 128 blocks and dynamic activations is what is
// implemented (Qwen's and DeepSeek's FP8 checkpoints); every other method is refused by name
// rather than loaded as if its packed integers were weights.
void parse_quantization(const Fields& f, ModelConfig& c) {
  if (!f.has("quantization_config")) return;
  const json& q = f.j["quantization_config"];
  if (!q.is_object()) f.bad("quantization_config", "must be an object");
  Fields qf{q, f.src};
  std::string method = q.contains("quant_method") && q["quant_method"].is_string() ? q["quant_method"].get<std::string>() : "";
  if (method.empty()) f.bad("quantization_config.quant_method", "is missing");
  if (method != "fp8")
    f.bad("quantization_config.quant_method",
          "is '" + method + "'; only fp8 (e4m3, 128x128 block scales) checkpoints are supported");
  if (q.contains("fmt") && q["fmt"] != "e4m3")
    f.bad("quantization_config.fmt", "is " + q["fmt"].dump() + "; only e4m3 is supported");
  if (q.contains("activation_scheme") && q["activation_scheme"] != "dynamic")
    f.bad("quantization_config.activation_scheme", "is " + q["activation_scheme"].dump() + "; only dynamic is supported");
  if (!q.contains("weight_block_size") || !q["weight_block_size"].is_array() || q["weight_block_size"].size() != 2 ||
      q["weight_block_size"][0] != 128 || q["weight_block_size"][1] != 128)
    f.bad("quantization_config.weight_block_size",
          "is " + (q.contains("weight_block_size") ? q["weight_block_size"].dump() : std::string("missing")) +
              "; only [128, 128] blocks are supported (per-tensor and per-channel fp8 are not)");
  c.quant.fp8 = true;
  c.quant.block = 128;
  if (qf.has("modules_to_not_convert")) {
    if (!q["modules_to_not_convert"].is_array()) f.bad("quantization_config.modules_to_not_convert", "must be a list");
    for (const json& m : q["modules_to_not_convert"]) {
      if (!m.is_string()) f.bad("quantization_config.modules_to_not_convert", "must be a list of strings");
      c.quant.modules_to_not_convert.push_back(m.get<std::string>());
    }
  }
}

// MLA fields (DeepSeek-V2/V3, GLM-4.7-Flash). The head dims must agree with one another; the
// tensors are checked against them when loaded.
void parse_mla(const Fields& f, ModelConfig& c) {
  MlaConfig& m = c.mla;
  m.q_lora_rank = f.non_negative_or("q_lora_rank", 0);
  m.kv_lora_rank = f.positive("kv_lora_rank");
  m.qk_nope_head_dim = f.positive("qk_nope_head_dim");
  m.qk_rope_head_dim = f.positive("qk_rope_head_dim");
  m.v_head_dim = f.positive("v_head_dim");
  m.rope_interleave = f.boolean_or("rope_interleave", true);
  // Sums and products of these dims index tensors: bounded far above any real model (DeepSeek-V3:
  // 1536, 512, 128, 64, 128) and far below int overflow.
  for (const char* k : {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"})
    if (f.has(k) && f.integer(k) > 65536) f.bad(k, "must be at most 65536, got " + f.j[k].dump());
  if (m.qk_rope_head_dim % 2) f.bad("qk_rope_head_dim", "must be even for rotary embeddings");
  if (f.has("head_dim") && f.integer("head_dim") != m.qk_rope_head_dim && f.integer("head_dim") != m.qk_head_dim())
    f.bad("head_dim", "(" + f.j["head_dim"].dump() + ") disagrees with qk_nope_head_dim + qk_rope_head_dim (" +
                          std::to_string(m.qk_head_dim()) + ")");
  if (f.has("num_key_value_heads") && f.integer("num_key_value_heads") != c.num_heads)
    f.bad("num_key_value_heads", "must equal num_attention_heads with latent attention (every head reads the latent)");
  c.head_dim = m.qk_head_dim();
  c.rotary_dim = m.qk_rope_head_dim;
  c.num_kv_heads = c.num_heads;
  if (f.has("partial_rotary_factor") && f.number("partial_rotary_factor") != 1.0)
    f.bad("partial_rotary_factor", "must be 1 with latent attention (the rope part is qk_rope_head_dim)");
}

// DeepSeek's dense/MoE layer pattern: a layer is MoE when it has routed experts, comes at or
// after first_k_dense_replace and its index is a multiple of moe_layer_freq; mlp_layer_types
// ("dense" / "sparse" per layer, transformers v5) overrides both.
void deepseek_layer_pattern(const Fields& f, ModelConfig& c, int first_dense_default) {
  const int L = c.num_layers;
  if (f.has("mlp_layer_types")) {
    const json& t = f.j["mlp_layer_types"];
    if (!t.is_array() || int(t.size()) != L)
      f.bad("mlp_layer_types", "must list \"dense\" or \"sparse\" for each of the " + std::to_string(L) + " layers");
    for (int l = 0; l < L; l++) {
      if (t[size_t(l)] != "dense" && t[size_t(l)] != "sparse")
        f.bad("mlp_layer_types", "entry " + std::to_string(l) + " is " + t[size_t(l)].dump() + "; expected dense or sparse");
      c.sparse_layer[size_t(l)] = t[size_t(l)] == "sparse";
    }
    return;
  }
  const int first_dense = f.non_negative_or("first_k_dense_replace", first_dense_default);
  const int freq = f.positive_or("moe_layer_freq", 1);
  for (int l = 0; l < L; l++) c.sparse_layer[size_t(l)] = l >= first_dense && l % freq == 0;
}

}  // namespace

ModelConfig parse_model_config(const json& j, const std::string& source) {
  if (!j.is_object()) throw InputError(source + ": config is not a JSON object");
  Fields f{j, source};
  ModelConfig c;
  c.source = source;
  if (!f.has("model_type") || !j["model_type"].is_string()) f.bad("model_type", "is missing");
  c.model_type = j["model_type"].get<std::string>();
  if (c.model_type == "qwen3_moe") c.family = Family::Qwen3Moe;
  else if (c.model_type == "qwen2_moe") c.family = Family::Qwen2Moe;
  else if (c.model_type == "glm4_moe") c.family = Family::Glm4Moe;
  else if (c.model_type == "mixtral") c.family = Family::Mixtral;
  else if (c.model_type == "deepseek_v2") c.family = Family::DeepseekV2;
  else if (c.model_type == "deepseek_v3") c.family = Family::DeepseekV3;
  else if (c.model_type == "glm4_moe_lite") c.family = Family::Glm4MoeLite;
  else
    f.bad("model_type", "is '" + c.model_type +
                            "'; supported: qwen3_moe, qwen2_moe, glm4_moe, mixtral, deepseek_v2, deepseek_v3, "
                            "glm4_moe_lite");

  for (const char* k : {"torch_dtype", "dtype"})
    if (c.torch_dtype.empty() && f.has(k) && j[k].is_string()) c.torch_dtype = j[k].get<std::string>();
  c.vocab_size = f.positive("vocab_size");
  c.hidden_size = f.positive("hidden_size");
  c.num_layers = f.positive("num_hidden_layers");
  c.num_heads = f.positive("num_attention_heads");
  c.num_kv_heads = f.positive_or("num_key_value_heads", c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0)
    f.bad("num_key_value_heads", "(" + std::to_string(c.num_kv_heads) + ") must divide num_attention_heads (" +
                                     std::to_string(c.num_heads) + ")");
  const bool mla = c.family == Family::DeepseekV2 || c.family == Family::DeepseekV3 || c.family == Family::Glm4MoeLite;
  if (mla) {
    c.head_dim = 2;  // set by parse_mla below
  } else if (f.has("head_dim")) {
    c.head_dim = f.positive("head_dim");  // Qwen3-30B-A3B: 128 while hidden/heads is 64
  } else {
    if (c.hidden_size % c.num_heads != 0)
      f.bad("num_attention_heads", "(" + std::to_string(c.num_heads) + ") must divide hidden_size (" +
                                       std::to_string(c.hidden_size) + ") when head_dim is absent");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim % 2) f.bad("head_dim", "must be even for rotary embeddings");
  c.rotary_dim = c.head_dim;
  c.rms_norm_eps = float(f.number_or("rms_norm_eps", 1e-6));
  if (!(c.rms_norm_eps >= 0) || !std::isfinite(c.rms_norm_eps)) f.bad("rms_norm_eps", "must be a small non-negative number");
  c.max_position_embeddings = f.positive_or("max_position_embeddings", 1 << 20);
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", false);
  parse_rope(f, c);
  if (f.has("partial_rotary_factor")) set_rotary_dim(f, "partial_rotary_factor", f.number("partial_rotary_factor"), c);
  if (mla) parse_mla(f, c);
  if (c.rotary_dim % 2 || c.rotary_dim <= 0) f.bad("partial_rotary_factor", "gives an odd or empty rotary dimension");
  parse_quantization(f, c);
  c.num_nextn_predict_layers = f.non_negative_or("num_nextn_predict_layers", 0);
  if (f.boolean_or("use_sliding_window", false))
    f.bad("use_sliding_window", "is true; sliding-window attention is not supported");

  if (f.has("hidden_act") && j["hidden_act"] != "silu")
    f.bad("hidden_act", "is " + j["hidden_act"].dump() + "; only silu (SwiGLU) is supported");

  RoutingConfig& r = c.routing;
  const int L = c.num_layers;
  c.sparse_layer.assign(size_t(L), true);
  switch (c.family) {
    case Family::Qwen3Moe:
    case Family::Qwen2Moe: {
      c.qk_norm = c.family == Family::Qwen3Moe;
      c.qkv_bias = c.family == Family::Qwen2Moe ? true : f.boolean_or("attention_bias", false);
      // v4: num_experts; v5: num_local_experts.
      r.num_experts = f.has("num_experts") ? f.non_negative_or("num_experts", 0)
                                           : f.non_negative_or("num_local_experts", 0);
      c.intermediate_size = f.positive("intermediate_size");
      c.moe_intermediate_size = f.positive("moe_intermediate_size");
      r.norm_topk_prob = f.boolean_or("norm_topk_prob", c.family == Family::Qwen3Moe);
      int step = f.positive_or("decoder_sparse_step", 1);
      std::vector<int> dense = f.int_list_or_empty("mlp_only_layers");
      for (int l : dense)
        if (l < 0 || l >= L) f.bad("mlp_only_layers", "names layer " + std::to_string(l) + " outside 0.." + std::to_string(L - 1));
      for (int l = 0; l < L; l++)
        c.sparse_layer[size_t(l)] = r.num_experts > 0 && (l + 1) % step == 0 &&
                                    std::find(dense.begin(), dense.end(), l) == dense.end();
      if (c.family == Family::Qwen2Moe) {
        c.shared_intermediate_size = f.non_negative_or("shared_expert_intermediate_size", 0);
        c.shared_expert_gated = c.shared_intermediate_size > 0;
      }
      break;
    }
    case Family::Glm4Moe: {
      c.qkv_bias = f.boolean_or("attention_bias", false);
      c.qk_norm = f.boolean_or("use_qk_norm", false);
      r.kind = RoutingKind::SigmoidGroupLimited;
      r.num_experts = f.positive("n_routed_experts");
      c.intermediate_size = f.positive("intermediate_size");
      c.moe_intermediate_size = f.positive("moe_intermediate_size");
      r.norm_topk_prob = f.boolean_or("norm_topk_prob", true);
      r.n_group = f.positive_or("n_group", 1);
      r.topk_group = f.positive_or("topk_group", 1);
      r.routed_scaling_factor = float(f.number_or("routed_scaling_factor", 1.0));
      if (!std::isfinite(r.routed_scaling_factor)) f.bad("routed_scaling_factor", "must be a finite number");
      r.has_correction_bias = true;
      deepseek_layer_pattern(f, c, 0);  // GLM4-MoE takes DeepSeek-V3's MoE, its layer pattern included
      const int64_t shared = int64_t(f.non_negative_or("n_shared_experts", 0)) * c.moe_intermediate_size;
      if (shared > (1 << 30)) f.bad("n_shared_experts", "times moe_intermediate_size is too large");
      c.shared_intermediate_size = int(shared);
      if (r.num_experts % r.n_group != 0)
        f.bad("n_group", "(" + std::to_string(r.n_group) + ") must divide n_routed_experts (" +
                             std::to_string(r.num_experts) + ")");
      if (r.topk_group > r.n_group) f.bad("topk_group", "must not exceed n_group");
      break;
    }
    case Family::DeepseekV2:
    case Family::DeepseekV3:
    case Family::Glm4MoeLite: {
      // MLA attention (parse_mla) and DeepSeek's MoE: routed experts, n_shared_experts shared
      // ones of the routed width, dense first layers.
      if (f.boolean_or("attention_bias", false)) f.bad("attention_bias", "is true; latent attention has no biases");
      r.num_experts = f.non_negative_or("n_routed_experts", 0);
      c.intermediate_size = f.positive("intermediate_size");
      c.moe_intermediate_size = f.positive("moe_intermediate_size");
      r.n_group = f.positive_or("n_group", 1);
      r.topk_group = f.positive_or("topk_group", 1);
      r.routed_scaling_factor = float(f.number_or("routed_scaling_factor", 1.0));
      if (!std::isfinite(r.routed_scaling_factor)) f.bad("routed_scaling_factor", "must be a finite number");
      std::string method = c.family == Family::DeepseekV2 ? "greedy" : "noaux_tc";
      if (f.has("topk_method")) {
        if (!j["topk_method"].is_string()) f.bad("topk_method", "must be a string");
        method = j["topk_method"].get<std::string>();
      }
      std::string scoring = c.family == Family::DeepseekV2 ? "softmax" : "sigmoid";
      if (f.has("scoring_func")) {
        if (!j["scoring_func"].is_string()) f.bad("scoring_func", "must be a string");
        scoring = j["scoring_func"].get<std::string>();
      }
      if (method == "greedy" || method == "group_limited_greedy") {
        if (scoring != "softmax") f.bad("scoring_func", "is '" + scoring + "'; topk_method " + method + " needs softmax");
        r.kind = RoutingKind::SoftmaxGroupLimited;
        r.group_limited = method == "group_limited_greedy";
        r.norm_topk_prob = f.boolean_or("norm_topk_prob", false);
      } else if (method == "noaux_tc") {
        if (scoring != "sigmoid") f.bad("scoring_func", "is '" + scoring + "'; topk_method noaux_tc needs sigmoid");
        r.kind = RoutingKind::SigmoidGroupLimited;
        r.has_correction_bias = true;
        r.norm_topk_prob = f.boolean_or("norm_topk_prob", true);
      } else {
        f.bad("topk_method", "is '" + method + "'; supported: greedy, group_limited_greedy, noaux_tc");
      }
      // GLM-4.7-Flash: transformers 5.17 reads only mlp_layer_types (default: layer 0 dense).
      deepseek_layer_pattern(f, c, c.family == Family::Glm4MoeLite ? 1 : 0);
      if (r.num_experts == 0) std::fill(c.sparse_layer.begin(), c.sparse_layer.end(), false);
      const int64_t shared = int64_t(f.non_negative_or("n_shared_experts", 0)) * c.moe_intermediate_size;
      if (shared > (1 << 30)) f.bad("n_shared_experts", "times moe_intermediate_size is too large");
      c.shared_intermediate_size = int(shared);
      if (r.num_experts > 0 && r.num_experts % r.n_group != 0)
        f.bad("n_group", "(" + std::to_string(r.n_group) + ") must divide n_routed_experts (" +
                             std::to_string(r.num_experts) + ")");
      if (r.topk_group > r.n_group) f.bad("topk_group", "must not exceed n_group");
      break;
    }
    case Family::Mixtral: {
      c.qkv_bias = false;
      r.num_experts = f.positive("num_local_experts");
      c.moe_intermediate_size = f.positive("intermediate_size");
      c.intermediate_size = c.moe_intermediate_size;
      r.norm_topk_prob = true;  // softmax over all experts, top-k, renormalise
      break;
    }
  }
  r.top_k = f.positive("num_experts_per_tok");
  if (c.num_sparse_layers() > 0) {
    if (r.num_experts <= 0) f.bad("num_experts", "must be positive when the model has MoE layers");
    if (r.top_k > r.num_experts)
      f.bad("num_experts_per_tok", "(" + std::to_string(r.top_k) + ") exceeds the number of experts (" +
                                       std::to_string(r.num_experts) + ")");
    if (r.kind == RoutingKind::SigmoidGroupLimited || (r.kind == RoutingKind::SoftmaxGroupLimited && r.group_limited)) {
      int per_group = r.num_experts / r.n_group;
      if (r.top_k > r.topk_group * per_group)
        f.bad("num_experts_per_tok", "exceeds the experts in topk_group groups");
      if (r.n_group > 1 && per_group < 2) f.bad("n_group", "leaves fewer than 2 experts per group");
    }
  }

  c.eos_token_ids = f.int_list_or_empty("eos_token_id");
  c.bos_token_id = f.has("bos_token_id") && j["bos_token_id"].is_number_integer() ? int(j["bos_token_id"].get<int64_t>()) : -1;
  return c;
}

ModelConfig load_model_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  if (!file_exists(path)) throw InputError(path + ": missing (is " + model_dir + " a model folder?)");
  ModelConfig c = parse_model_config(read_json_file(path), path);
  const std::string gen = model_dir + "/generation_config.json";
  if (file_exists(gen)) {
    json g = read_json_file(gen);
    if (g.is_object() && g.contains("eos_token_id")) {
      Fields f{g, gen};
      std::vector<int> ids = f.int_list_or_empty("eos_token_id");
      std::set<int> all(c.eos_token_ids.begin(), c.eos_token_ids.end());
      for (int id : ids) if (all.insert(id).second) c.eos_token_ids.push_back(id);
    }
  }
  return c;
}

}  // namespace epmoe
