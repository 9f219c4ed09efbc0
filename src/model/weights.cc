#include "model/weights.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>

#include "util/error.h"
#include "util/threads.h"

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
    case Family::DeepseekV2:
    case Family::DeepseekV3:
    case Family::Glm4MoeLite: return {"mlp", "gate_proj", "up_proj", "down_proj", "shared_experts", ""};
  }
  return {};
}

// Called with every weight view the loader hands out and the checkpoint name it came from.
using WeightVisitor = std::function<void(const TensorView& v, const std::string& tensor)>;

struct Loader {
  const ModelConfig& cfg;
  const Checkpoint& ckpt;
  WeightVisitor visit;  // empty: plain loading

  void seen(const TensorView& v, const std::string& tensor) const {
    if (visit) visit(v, tensor);
  }
  TensorView matrix(const std::string& name, int64_t rows, int64_t cols) const {
    TensorView v = ckpt.get(name);
    if (v.rank() != 2 || v.shape[0] != rows || v.shape[1] != cols)
      throw InputError("tensor '" + name + "' has shape " + v.shape_str() + ", expected [" + std::to_string(rows) +
                       ", " + std::to_string(cols) + "] from " + cfg.source);
    if (v.dtype == DType::F8_E4M3) {
      attach_scale(v, name);
    } else if (!dtype_is_float_weight(v.dtype)) {
      throw InputError("tensor '" + name + "' has dtype " + std::string(dtype_name(v.dtype)) +
                       "; expected F32, BF16, F16 or F8_E4M3 with a block scale");
    }
    seen(v, name);
    return v;
  }
  // An FP8 weight X.weight takes its scale grid from X.weight_scale_inv: [ceil(rows / 128),
  // ceil(cols / 128)] in F32 (DeepSeek) or BF16 (Qwen); the weight is code * scale.
  void attach_scale(TensorView& v, const std::string& name) const {
    const std::string sname = name + "_scale_inv";
    if (!cfg.quant.fp8)
      throw InputError("tensor '" + name + "' is F8_E4M3 but " + cfg.source + " has no fp8 quantization_config");
    if (!ckpt.contains(sname))
      throw InputError("tensor '" + name + "' is F8_E4M3 without its scale '" + sname + "'");
    TensorView s = ckpt.get(sname);
    const int64_t b = cfg.quant.block;
    const int64_t gr = (v.shape[0] + b - 1) / b, gc = (v.shape[1] + b - 1) / b;
    if (s.rank() != 2 || s.shape[0] != gr || s.shape[1] != gc)
      throw InputError("tensor '" + sname + "' has shape " + s.shape_str() + ", expected the [" + std::to_string(gr) + ", " +
                       std::to_string(gc) + "] grid of " + std::to_string(b) + "x" + std::to_string(b) + " blocks of '" +
                       name + "' " + v.shape_str());
    if (s.dtype != DType::F32 && s.dtype != DType::BF16)
      throw InputError("tensor '" + sname + "' has dtype " + std::string(dtype_name(s.dtype)) + "; expected F32 or BF16");
    seen(s, sname);
    v.scale = BlockScale{s.data, s.dtype, gr, gc, 0, b};
  }
  std::vector<float> vec(const std::string& name, int64_t n) const {
    TensorView v = ckpt.get(name);
    if (v.numel() != n)
      throw InputError("tensor '" + name + "' has shape " + v.shape_str() + ", expected [" + std::to_string(n) + "]");
    if (!dtype_is_float_weight(v.dtype))
      throw InputError("tensor '" + name + "' has dtype " + std::string(dtype_name(v.dtype)) + "; expected F32, BF16 or F16");
    seen(v, name);
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
    for (const TensorView* t : {&gu, &d})
      if (t->dtype == DType::F8_E4M3)
        throw InputError("tensor '" + t->name + "' is F8_E4M3 in transformers v5's fused expert layout; FP8 experts " +
                         "are supported in the hub's per-expert layout (experts.E.gate_proj.weight + weight_scale_inv)");
    if (gu.rank() != 3 || gu.shape[0] != E || gu.shape[1] != 2 * I || gu.shape[2] != H)
      throw InputError("tensor '" + fused_gu + "' has shape " + gu.shape_str() + ", expected [" + std::to_string(E) +
                       ", " + std::to_string(2 * I) + ", " + std::to_string(H) + "]");
    if (d.rank() != 3 || d.shape[0] != E || d.shape[1] != H || d.shape[2] != I)
      throw InputError("tensor '" + fused_d + "' has shape " + d.shape_str() + ", expected [" + std::to_string(E) +
                       ", " + std::to_string(H) + ", " + std::to_string(I) + "]");
    for (int e : experts) {
      TensorView g = gu.index0(e), de = d.index0(e);
      ld.seen(g, fused_gu);  // only this rank's slices: the others are never read
      ld.seen(de, fused_d);
      m.experts[e] = {g.slice_rows(0, I), g.slice_rows(I, I), de};
    }
    return;
  }
  for (int e : experts)
    m.experts[e] = ld.swiglu(pfx + "experts." + std::to_string(e) + ".", n.gate, n.up, n.down, I);
}

// Index of the first NaN or Inf in a float-weight view, or -1. Works on the bits (exponent all
// ones), so it needs no conversion, and splits the scan over the threads; the minimum over the
// ranges is the first bad element whatever the split.
int64_t first_non_finite(const TensorView& v) {
  const int64_t n = v.numel();
  std::atomic<int64_t> first{n};
  parallel_for(n, int64_t(1) << 16, [&](int64_t b, int64_t e) {
    auto scan = [&](auto bits_of, auto mask) {
      for (int64_t i = b; i < e && i < first.load(std::memory_order_relaxed); i++)
        if ((bits_of(i) & mask) == mask) {
          int64_t cur = first.load();
          while (i < cur && !first.compare_exchange_weak(cur, i)) {
          }
          return;
        }
    };
    const auto* bytes = static_cast<const unsigned char*>(v.data);
    switch (v.dtype) {
      case DType::F32:
        scan([&](int64_t i) { uint32_t u; std::memcpy(&u, bytes + 4 * i, 4); return u; }, uint32_t(0x7f800000u));
        break;
      case DType::BF16:
        scan([&](int64_t i) { uint16_t u; std::memcpy(&u, bytes + 2 * i, 2); return u; }, uint16_t(0x7f80u));
        break;
      case DType::F16:
        scan([&](int64_t i) { uint16_t u; std::memcpy(&u, bytes + 2 * i, 2); return u; }, uint16_t(0x7c00u));
        break;
      case DType::F8_E4M3:  // e4m3fn has no Inf; 0x7f and 0xff are its NaNs
        scan([&](int64_t i) { return uint8_t(bytes[i]); }, uint8_t(0x7fu));
        break;
      default: break;  // the loader accepts only float weights
    }
  });
  return first.load() < n ? first.load() : -1;
}

ModelWeights load_weights_impl(const ModelConfig& cfg, const Checkpoint& ckpt, const std::vector<int>& experts,
                               WeightVisitor visit);

}  // namespace

LmHeadForm parse_lm_head_form(const std::string& s) {
  if (s == "checkpoint") return LmHeadForm::Checkpoint;
  if (s == "int8") return LmHeadForm::Int8;
  throw InputError("--lm-head '" + s + "': expected checkpoint or int8");
}

ModelWeights load_weights(const ModelConfig& cfg, const Checkpoint& ckpt, const std::vector<int>& experts,
                          LmHeadForm lm_head) {
  ModelWeights w = load_weights_impl(cfg, ckpt, experts, {});
  switch (lm_head) {
    case LmHeadForm::Checkpoint: break;
    case LmHeadForm::Int8: {
      // Quantized once here, from the checkpoint's tensor; a tied embedding stays as it is for
      // the lookups (only the head's matmul reads the int8 copy).
      auto q = std::make_shared<QuantizedMatrix>(quantize_rows_int8(w.lm_head));
      w.lm_head = q->view;
      w.lm_head_int8 = std::move(q);
      break;
    }
  }
  return w;
}

void check_weights_finite(const ModelConfig& cfg, const Checkpoint& ckpt, const std::vector<int>& experts) {
  load_weights_impl(cfg, ckpt, experts, [&](const TensorView& v, const std::string& tensor) {
    const int64_t i = first_non_finite(v);
    if (i < 0) return;
    const float x = v.at(i);
    throw InputError("--check-weights: tensor '" + v.name + "' in " + ckpt.file_of(tensor) + " holds " +
                     (std::isnan(x) ? "NaN" : x > 0 ? "+Inf" : "-Inf") + " at element " + std::to_string(i) +
                     " of shape " + v.shape_str());
  });
}

namespace {

ModelWeights load_weights_impl(const ModelConfig& cfg, const Checkpoint& ckpt, const std::vector<int>& experts,
                               WeightVisitor visit) {
  Loader ld{cfg, ckpt, std::move(visit)};
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
    if (cfg.mla.enabled()) {
      const MlaConfig& m = cfg.mla;
      MlaWeights& w = L.attn.mla;
      const int64_t heads = cfg.num_heads;
      if (m.q_lora_rank > 0) {
        w.q_a = ld.matrix(a + "q_a_proj.weight", m.q_lora_rank, H);
        w.q_a_norm = ld.vec(a + "q_a_layernorm.weight", m.q_lora_rank);
        w.q_b = ld.matrix(a + "q_b_proj.weight", heads * m.qk_head_dim(), m.q_lora_rank);
      } else {
        w.q = ld.matrix(a + "q_proj.weight", heads * m.qk_head_dim(), H);
      }
      w.kv_a = ld.matrix(a + "kv_a_proj_with_mqa.weight", m.kv_lora_rank + m.qk_rope_head_dim, H);
      w.kv_a_norm = ld.vec(a + "kv_a_layernorm.weight", m.kv_lora_rank);
      w.kv_b = ld.matrix(a + "kv_b_proj.weight", heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
      L.attn.o = ld.matrix(a + "o_proj.weight", H, heads * m.v_head_dim);
    } else {
      L.attn.q = ld.matrix(a + "q_proj.weight", q_out, H);
      L.attn.k = ld.matrix(a + "k_proj.weight", kv_out, H);
      L.attn.v = ld.matrix(a + "v_proj.weight", kv_out, H);
      L.attn.o = ld.matrix(a + "o_proj.weight", H, q_out);
    }
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

}  // namespace

}  // namespace epmoe
