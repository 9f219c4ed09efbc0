#include "model/weights.h"

#include "util/error.h"

namespace epmoe {

namespace {

// Where a family keeps its MoE tensors. Pure data: the loader below has no family branches.
struct MoeNames {
  std::string block;                      // "mlp" or "block_sparse_moe"
  std::string gate, up, down;             // per-expert projection names
  std::string shared;                     // shared-expert module ("" when none)
  std::string shared_gate;                // gate of the shared expert ("" when none)
};

MoeNames moe_names(Family f) {
  switch (f) {
    case Family::Qwen3Moe: return {"mlp", "gate_proj", "up_proj", "down_proj", "", ""};
    case Family::Qwen2Moe: return {"mlp", "gate_proj", "up_proj", "down_proj", "shared_expert", "shared_expert_gate"};
    case Family::Glm4Moe: return {"mlp", "gate_proj", "up_proj", "down_proj", "shared_experts", ""};
    case Family::Mixtral: return {"block_sparse_moe", "w1", "w3", "w2", "", ""};
  }
  return {};
}

struct Loader {
  const ModelConfig& cfg;
  const Checkpoint& ckpt;

  TensorView matrix(const std::string& name, int64_t rows, int64_t cols) const {
    TensorView v = ckpt.get(name);
    if (v.rank() != 2 || v.shape[0] != rows || v.shape[1] != cols)
      throw InputError("tensor '" + name + "' has shape " + v.shape_str() + ", expected [" + std::to_string(rows) +
                       ", " + std::to_string(cols) + "] from " + cfg.source);
    if (!dtype_is_float_weight(v.dtype))
      throw InputError("tensor '" + name + "' has dtype " + std::string(dtype_name(v.dtype)) + "; expected F32, BF16 or F16");
    return v;
  }
  std::vector<float> vec(const std::string& name, int64_t n) const {
    TensorView v = ckpt.get(name);
    if (v.numel() != n)
      throw InputError("tensor '" + name + "' has shape " + v.shape_str() + ", expected [" + std::to_string(n) + "]");
    if (!dtype_is_float_weight(v.dtype))
      throw InputError("tensor '" + name + "' has dtype " + std::string(dtype_name(v.dtype)) + "; expected F32, BF16 or F16");
    return to_f32(v);
  }
  SwigluWeights swiglu(const std::string& prefix, const std::string& g, const std::string& u, const std::string& d,
                       int64_t inter) const {
    const int64_t H = cfg.hidden_size;
    return {matrix(prefix + g + ".weight", inter, H), matrix(prefix + u + ".weight", inter, H),
            matrix(prefix + d + ".weight", H, inter)};
  }
};

// Routed experts, either per-expert hub tensors or transformers v5's fused 3-D tensors
// (gate_up_proj [E, 2I, H] with the gate half first, down_proj [E, H, I]).
void load_experts(const Loader& ld, const MoeNames& n, const std::string& pfx, const std::vector<int>& experts,
                  MoeLayerWeights& m) {
  const ModelConfig& cfg = ld.cfg;
  const int64_t E = cfg.routing.num_experts, I = cfg.moe_intermediate_size, H = cfg.hidden_size;
  const std::string fused_gu = pfx + "experts.gate_up_proj", fused_d = pfx + "experts.down_proj";
  if (ld.ckpt.contains(fused_gu)) {
    TensorView gu = ld.ckpt.get(fused_gu), d = ld.ckpt.get(fused_d);
    if (gu.rank() != 3 || gu.shape[0] != E || gu.shape[1] != 2 * I || gu.shape[2] != H)
      throw InputError("tensor '" + fused_gu + "' has shape " + gu.shape_str() + ", expected [" + std::to_string(E) +
                       ", " + std::to_string(2 * I) + ", " + std::to_string(H) + "]");
    if (d.rank() != 3 || d.shape[0] != E || d.shape[1] != H || d.shape[2] != I)
      throw InputError("tensor '" + fused_d + "' has shape " + d.shape_str() + ", expected [" + std::to_string(E) +
                       ", " + std::to_string(H) + ", " + std::to_string(I) + "]");
    for (int e : experts) {
      TensorView g = gu.index0(e);
      m.experts[e] = {g.slice_rows(0, I), g.slice_rows(I, I), d.index0(e)};
    }
    return;
  }
  for (int e : experts)
    m.experts[e] = ld.swiglu(pfx + "experts." + std::to_string(e) + ".", n.gate, n.up, n.down, I);
}

}  // namespace

ModelWeights load_weights(const ModelConfig& cfg, const Checkpoint& ckpt, const std::vector<int>& experts) {
  Loader ld{cfg, ckpt};
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size, D = cfg.head_dim;
  const int64_t q_out = int64_t(cfg.num_heads) * D, kv_out = int64_t(cfg.num_kv_heads) * D;
  ModelWeights w;
  w.embed = ld.matrix("model.embed_tokens.weight", V, H);
  w.lm_head = cfg.tie_word_embeddings && !ckpt.contains("lm_head.weight") ? w.embed : ld.matrix("lm_head.weight", V, H);
  w.final_norm = ld.vec("model.norm.weight", H);
  const MoeNames names = moe_names(cfg.family);
  for (int l = 0; l < cfg.num_layers; l++) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights L;
    L.input_norm = ld.vec(p + "input_layernorm.weight", H);
    L.post_attention_norm = ld.vec(p + "post_attention_layernorm.weight", H);
    const std::string a = p + "self_attn.";
    L.attn.q = ld.matrix(a + "q_proj.weight", q_out, H);
    L.attn.k = ld.matrix(a + "k_proj.weight", kv_out, H);
    L.attn.v = ld.matrix(a + "v_proj.weight", kv_out, H);
    L.attn.o = ld.matrix(a + "o_proj.weight", H, q_out);
    if (cfg.qkv_bias) {
      L.attn.q_bias = ld.vec(a + "q_proj.bias", q_out);
      L.attn.k_bias = ld.vec(a + "k_proj.bias", kv_out);
      L.attn.v_bias = ld.vec(a + "v_proj.bias", kv_out);
    }
    if (cfg.qk_norm) {
      L.attn.q_norm = ld.vec(a + "q_norm.weight", D);
      L.attn.k_norm = ld.vec(a + "k_norm.weight", D);
    }
    L.sparse = cfg.sparse_layer[size_t(l)];
    if (!L.sparse) {
      L.dense = ld.swiglu(p + "mlp.", "gate_proj", "up_proj", "down_proj", cfg.intermediate_size);
    } else {
      const std::string m = p + names.block + ".";
      L.moe.router = ld.matrix(m + "gate.weight", cfg.routing.num_experts, H);
      if (cfg.routing.has_correction_bias)
        L.moe.correction_bias = ld.vec(m + "gate.e_score_correction_bias", cfg.routing.num_experts);
      load_experts(ld, names, m, experts, L.moe);
      if (cfg.shared_intermediate_size > 0) {
        L.moe.shared = ld.swiglu(m + names.shared + ".", "gate_proj", "up_proj", "down_proj", cfg.shared_intermediate_size);
        if (cfg.shared_expert_gated) L.moe.shared_gate = ld.matrix(m + names.shared_gate + ".weight", 1, H);
      }
    }
    w.layers.push_back(std::move(L));
  }
  return w;
}

}  // namespace epmoe
