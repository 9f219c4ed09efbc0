// Decode and prefill tokens/s of a synthesized 4-layer Qwen3-30B-A3B-shaped model on one GPU
// (issue 9): hidden 2048, 32 q heads / 4 kv heads of 128, q/k norm, 128 experts top-8 of 768,
// vocab 151936, random weights generated on the device, bf16 compute. The numbers include what
// `epmoe generate` does per step (the argmax on the device, one id per sequence to the host).
// Decode runs twice per batch size in the same process: kernel by kernel (graph off) and as one
// CUDA graph per step (graph on, docs/gpu.md "Decode as one CUDA graph"); prefill never graphs.
//
//   gpu_model_bench [--out FILE.tsv] [--batches LIST (1,8,64,256)] [--prefill 0|1 (1)]
#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/nccl_group.h"
#include "ep/backend.h"
#include "model/cuda/gpu_model.h"
#include "model/language_model.h"

using namespace epmoe;

int main(int argc, char** argv) {
  try {
    NcclGroup& g = NcclGroup::world();  // selects this process's GPU
    (void)g;
    nlohmann::json j = {{"architectures", {"Qwen3MoeForCausalLM"}},
                        {"model_type", "qwen3_moe"},
                        {"hidden_size", 2048},
                        {"num_hidden_layers", 4},
                        {"num_attention_heads", 32},
                        {"num_key_value_heads", 4},
                        {"head_dim", 128},
                        {"intermediate_size", 6144},
                        {"moe_intermediate_size", 768},
                        {"num_experts", 128},
                        {"num_experts_per_tok", 8},
                        {"norm_topk_prob", true},
                        {"decoder_sparse_step", 1},
                        {"mlp_only_layers", nlohmann::json::array()},
                        {"vocab_size", 151936},
                        {"max_position_embeddings", 40960},
                        {"rms_norm_eps", 1e-6},
                        {"rope_theta", 1000000.0},
                        {"tie_word_embeddings", false},
                        {"attention_bias", false},
                        {"bos_token_id", 151643},
                        {"eos_token_id", 151645},
                        {"torch_dtype", "bfloat16"}};
    ModelConfig cfg = parse_model_config(j, "synthesized Qwen3-30B-A3B (4 layers)");
    Placement pl = Placement::make_default(cfg.routing.num_experts, 1, 0);
    auto model = make_synthetic_gpu_model(cfg, pl, 0, /*f32=*/false, 42);
    LanguageModel& m = *model;
    auto be = make_local_backend(Device::Cuda, pl);
    FILE* f = nullptr;
    std::vector<int> batches = {1, 8, 64, 256};
    bool prefill = true;
    for (int a = 1; a + 1 < argc; a += 2) {
      const std::string k = argv[a], v = argv[a + 1];
      if (k == "--out") {
        f = std::fopen(v.c_str(), "w");
      } else if (k == "--batches") {
        batches.clear();
        for (size_t p = 0; p < v.size();) {
          const size_t q = std::min(v.find(',', p), v.size());
          batches.push_back(std::stoi(v.substr(p, q - p)));
          p = q + 1;
        }
      } else if (k == "--prefill") {
        prefill = v != "0";
      } else {
        throw std::runtime_error("unknown flag " + k);
      }
    }
    if (f) std::fprintf(f, "phase\tbatch\tcontext\tgraph\ttokens_per_s\tms_per_step\n");
    std::printf("| phase | sequences | context | graph | tokens/s | ms per step |\n|---|---|---|---|---|---|\n");
    auto now = [] { return std::chrono::steady_clock::now(); };
    auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    // Prefill: one sequence of L tokens.
    for (int L : prefill ? std::vector<int>{512, 2048} : std::vector<int>{}) {
      std::vector<int32_t> ids(static_cast<size_t>(L));
      for (int i = 0; i < L; i++) ids[size_t(i)] = (i * 7919) % cfg.vocab_size;
      for (int rep = 0; rep < 2; rep++) {  // the first run allocates
        Sequence s = m.new_sequence(0);
        auto t0 = now();
        m.forward({&s}, {ids}, *be, false);
        auto t1 = now();
        if (rep == 1) {
          std::printf("| prefill | 1 | %d | - | %.0f | %.2f |\n", L, L / (ms(t0, t1) / 1e3), ms(t0, t1));
          if (f) std::fprintf(f, "prefill\t1\t%d\t-\t%.1f\t%.3f\n", L, L / (ms(t0, t1) / 1e3), ms(t0, t1));
        }
      }
    }
    // Decode: B sequences with 128-token prompts, then 32 timed steps of one token each (after 2
    // untimed ones: the first step of a batch size runs eagerly, the second captures its graph),
    // graph off then on, fresh sequences each time. The ids of the two runs must agree (the same
    // bits either way).
    for (int B : batches) {
      std::vector<int32_t> last[2];
      for (int on = 0; on < 2; on++) {
        set_gpu_cuda_graph(m, on == 1);
        const GpuGraphStats before = gpu_graph_stats(m);
        std::vector<Sequence> seqs;
        for (int b = 0; b < B; b++) seqs.push_back(m.new_sequence(uint64_t(b)));
        std::vector<Sequence*> ps;
        std::vector<std::vector<int32_t>> prompts;
        for (int b = 0; b < B; b++) {
          ps.push_back(&seqs[size_t(b)]);
          std::vector<int32_t> p(128);
          for (int i = 0; i < 128; i++) p[size_t(i)] = (b * 131 + i * 17) % cfg.vocab_size;
          prompts.push_back(p);
        }
        auto ids = m.forward_greedy(ps, prompts, *be);
        const int steps = 32;
        double total = 0;
        for (int s = 0; s < steps + 2; s++) {
          std::vector<std::vector<int32_t>> next;
          for (int b = 0; b < B; b++) next.push_back({ids[size_t(b)]});
          auto t0 = now();
          ids = m.forward_greedy(ps, next, *be);
          auto t1 = now();
          if (s >= 2) total += ms(t0, t1);
        }
        last[on] = ids;
        const GpuGraphStats after = gpu_graph_stats(m);
        std::printf("| decode | %d | 128+ | %s | %.0f | %.2f |\n", B, on ? "on" : "off", B * steps / (total / 1e3),
                    total / steps);
        if (on)
          std::fprintf(stderr, "  B %d graph on: %lld replays, %lld captures, %lld eager steps\n", B,
                       (long long)(after.replays - before.replays), (long long)(after.captures - before.captures),
                       (long long)(after.eager_steps - before.eager_steps));
        if (f)
          std::fprintf(f, "decode\t%d\t128\t%s\t%.1f\t%.3f\n", B, on ? "on" : "off", B * steps / (total / 1e3),
                       total / steps);
      }
      if (last[0] != last[1]) std::printf("| decode | %d | MISMATCH: the graph's ids differ from the eager ids | | | |\n", B);
    }
    set_gpu_cuda_graph(m, true);
    if (f) std::fclose(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_model_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
