// `epmoe info --model DIR`: what the checkpoint holds, without running it.
#include <cstdio>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "kernels/matmul.h"

namespace epmoe {

namespace {

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    u++;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
  return buf;
}

}  // namespace

int run_info(const RunOptions& o) {
  ModelConfig c = load_model_config(o.model_dir);
  Checkpoint ck(o.model_dir);
  std::map<std::string, std::pair<int64_t, int64_t>> by_dtype;  // dtype -> params, bytes
  int64_t params = 0, expert_params = 0;
  for (auto& n : ck.names()) {
    TensorView v = ck.get(n);
    params += v.numel();
    if (n.find(".experts.") != std::string::npos) expert_params += v.numel();
    auto& e = by_dtype[std::string(dtype_name(v.dtype))];
    e.first += v.numel();
    e.second += int64_t(v.nbytes());
  }
  const auto& r = c.routing;
  std::printf("model          %s\n", o.model_dir.c_str());
  std::printf("family         %s\n", std::string(family_name(c.family)).c_str());
  std::printf("layers         %d (hidden %d, vocab %d, max positions %d)\n", c.num_layers, c.hidden_size, c.vocab_size,
              c.max_position_embeddings);
  if (c.mla.enabled()) {
    const MlaConfig& m = c.mla;
    std::printf("attention      multi-head latent: %d heads, q %s, kv latent %d, head dims nope %d + rope %d (%s), v %d\n",
                c.num_heads, m.q_lora_rank ? ("LoRA rank " + std::to_string(m.q_lora_rank)).c_str() : "from q_proj",
                m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.rope_interleave ? "interleaved pairs" : "half split",
                m.v_head_dim);
    // The cache holds the normalised latent and the shared rope key per token, in fp32.
    const int64_t mla_bytes = int64_t(m.kv_lora_rank + m.qk_rope_head_dim) * 4 * c.num_layers;
    const int64_t per_head = int64_t(c.num_heads) * (m.qk_head_dim() + m.v_head_dim) * 4 * c.num_layers;
    std::printf("KV cache       %s per token (latent + rope key); a per-head cache would take %s (%.1fx)\n",
                human_bytes(double(mla_bytes)).c_str(), human_bytes(double(per_head)).c_str(),
                double(per_head) / double(mla_bytes));
  } else {
    std::printf("attention      %d query heads, %d kv heads, head_dim %d, rotary dim %d%s%s\n", c.num_heads, c.num_kv_heads,
                c.head_dim, c.rotary_dim, c.qkv_bias ? ", qkv bias" : "", c.qk_norm ? ", q/k norm" : "");
  }
  std::printf("rope           theta %g", double(c.rope_theta));
  if (c.yarn.enabled)
    std::printf(", YaRN factor %g over %d positions (cos/sin x %g), softmax scale %g", c.yarn.factor,
                c.yarn.original_max_position_embeddings, c.yarn.attention_factor, double(c.softmax_scale()));
  std::printf("\n");
  const char* kind = r.kind == RoutingKind::SoftmaxTopK           ? "softmax top-k"
                     : r.kind == RoutingKind::SigmoidGroupLimited ? "sigmoid, group-limited (DeepSeek-V3)"
                     : r.group_limited                            ? "softmax, group-limited (DeepSeek-V2)"
                                                                  : "softmax, greedy (DeepSeek-V2)";
  std::printf("experts        %d routed, top-%d, expert intermediate %d, routing %s%s", r.num_experts, r.top_k,
              c.moe_intermediate_size, kind, r.norm_topk_prob ? ", renormalised" : "");
  if (r.kind != RoutingKind::SoftmaxTopK)
    std::printf(", %d groups keep %d, scale %g", r.n_group, r.topk_group, double(r.routed_scaling_factor));
  std::printf("\n");
  if (c.shared_intermediate_size)
    std::printf("shared expert  intermediate %d%s\n", c.shared_intermediate_size, c.shared_expert_gated ? ", sigmoid-gated" : "");
  std::string sparse, dense;
  for (int l = 0; l < c.num_layers; l++) (c.sparse_layer[size_t(l)] ? sparse : dense) += (std::to_string(l) + " ");
  std::printf("sparse layers  %s\n", sparse.empty() ? "(none)" : sparse.c_str());
  std::printf("dense layers   %s\n", dense.empty() ? "(none)" : dense.c_str());
  std::printf("tied lm_head   %s\n", c.tie_word_embeddings ? "yes" : "no");
  std::printf("parameters     %lld (%lld in routed experts)\n", (long long)params, (long long)expert_params);
  for (auto& [dt, pb] : by_dtype)
    std::printf("  %-7s      %lld params, %s\n", dt.c_str(), (long long)pb.first, human_bytes(double(pb.second)).c_str());
  if (c.quant.fp8)
    std::printf("quantization   fp8 e4m3, %dx%d block scales (weight_scale_inv); %zu modules not converted\n", c.quant.block,
                c.quant.block, c.quant.modules_to_not_convert.size());
  if (c.num_nextn_predict_layers > 0) {
    int64_t mtp = 0;
    for (auto& n : ck.names())
      if (n.rfind("model.layers.", 0) == 0 && std::stoi(n.substr(13)) >= c.num_layers) mtp++;
    std::printf("MTP layers     %d multi-token-prediction layer(s) (%lld tensors) are not loaded: epmoe decodes one "
                "token per step\n",
                c.num_nextn_predict_layers, (long long)mtp);
  }
  std::printf("files          %zu\n", ck.files().size());
  std::printf("cpu kernels    %s\n", kernel_description(ComputeMode::F32).c_str());  // the CPU default, --compute f32
  return 0;
}

}  // namespace epmoe
