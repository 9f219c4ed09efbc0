// `epmoe info --model DIR`: what the checkpoint holds, without running it.
#include <cstdio>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "cli/options.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"

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
  std::printf("attention      %d query heads, %d kv heads, head_dim %d, rotary dim %d, rope theta %g%s%s\n", c.num_heads,
              c.num_kv_heads, c.head_dim, c.rotary_dim, double(c.rope_theta), c.qkv_bias ? ", qkv bias" : "",
              c.qk_norm ? ", q/k norm" : "");
  const char* kind = r.kind == RoutingKind::SoftmaxTopK           ? "softmax top-k"
                     : r.kind == RoutingKind::SigmoidGroupLimited ? "sigmoid, group-limited (DeepSeek-V3)"
                                                                  : "softmax, group-limited (DeepSeek-V2)";
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
    std::printf("  %-5s        %lld params, %s\n", dt.c_str(), (long long)pb.first, human_bytes(double(pb.second)).c_str());
  std::printf("files          %zu\n", ck.files().size());
  return 0;
}

}  // namespace

Command register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show a model's architecture, sizes, parameters and dtypes");
  auto o = std::make_shared<RunOptions>();
  add_model_option(*cmd, *o);
  return {cmd, [o] { return run_info(*o); }};
}

}  // namespace epmoe
