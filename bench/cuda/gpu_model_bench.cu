// Decode and prefill tokens/s of a synthesized Qwen3-30B-A3B-shaped model on one GPU (issues 9
// and 33): hidden 2048, 32 q heads / 4 kv heads of 128, q/k norm, 128 experts top-8 of 768,
// vocab 151936, the real model's 48 layers by default (--layers N: the 4-layer model of the
// earlier runs hides the depth -- there the lm_head is over half the bytes a decode step reads),
// random weights generated on the device, bf16 compute. The numbers include what `epmoe generate`
// does per step (the argmax on the device, one id per sequence to the host).
// Decode runs twice per batch size in the same process: kernel by kernel (graph off) and as one
// CUDA graph per step (graph on, docs/gpu.md "Decode as one CUDA graph"); prefill never graphs.
//
// Every row stands beside its floor, measured in the same run: a decode step cannot take less
// than the bytes it must read (the attention and router weights of every layer, the experts its
// tokens route to -- expected distinct experts E (1 - (1 - k/E)^B) for routing uniform over the
// experts, as the random router gives --, the lm_head, the KV cache of the context) over the HBM
// read bandwidth a streaming kernel reaches here; a prefill cannot take less than its FLOPs at the
// dense bf16 tensor-core peak (--peak-tflops, default 989: H100/H200 SXM) nor less than reading
// every weight its tokens route to once.
//
//   gpu_model_bench [--out FILE.tsv] [--layers N (48)] [--batches LIST (1,8,64,256)] [--prefill 0|1 (1)]
//                   [--steps N (32)] [--peak-tflops F (989)] [--profile-step 0|1 (0)]
//                   [--kv-cache-dtype bf16|fp32 (bf16: what serve gives a bf16 checkpoint)]
//                   [--split-gemv-ring -1|0|8|16|32 (-1: chosen per weight; 0: split_gemv v3)]
//                   [--split-gemv-ring-wide -1|8|16|32 (the o projection's)] [--split-gemv-early N|-1]
// --profile-step 1: one eager decode step of each batch size (the first timed one, graph off)
// between cudaProfilerStart and cudaProfilerStop, for `ncu --profile-from-start off`
// (scripts/gpu-decode-profile.sh).
// --trace 1: the kernel timeline of the graph's timed decode steps (kernels/cuda/kernel_trace.h):
// per kernel name, how long it held the step's chain of dependent kernels, median over the steps.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <stdexcept>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include "comm/nccl_group.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_trace.h"
#include "kernels/cuda/split_linear.cuh"
#include "ep/backend.h"
#include "model/cuda/gpu_model.h"
#include "model/language_model.h"

using namespace epmoe;

namespace {

__global__ void read_all_kernel(const uint4* p, size_t n, unsigned* sink) {
  uint4 acc = {0, 0, 0, 0};
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);  // streaming: no reuse, as a weight read of a decode step
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) atomicAdd(sink, 1u);  // keeps the loads
}

// The HBM read bandwidth one streaming kernel reaches (bytes/s): the best of 10 reads of 4 GiB.
double measure_read_bandwidth() {
  const size_t bytes = size_t(4) << 30;
  void* buf = nullptr;
  unsigned* sink = nullptr;
  EPMOE_CUDA_CHECK(cudaMalloc(&buf, bytes));
  EPMOE_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  EPMOE_CUDA_CHECK(cudaMemset(buf, 1, bytes));
  int sms = 0;
  EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t a, b;
  EPMOE_CUDA_CHECK(cudaEventCreate(&a));
  EPMOE_CUDA_CHECK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int r = 0; r < 10; r++) {
    EPMOE_CUDA_CHECK(cudaEventRecord(a));
    read_all_kernel<<<sms * 8, 512>>>(static_cast<const uint4*>(buf), bytes / sizeof(uint4), sink);
    EPMOE_CUDA_CHECK(cudaEventRecord(b));
    EPMOE_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    EPMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms);
  }
  EPMOE_CUDA_CHECK(cudaEventDestroy(a));
  EPMOE_CUDA_CHECK(cudaEventDestroy(b));
  EPMOE_CUDA_CHECK(cudaFree(buf));
  EPMOE_CUDA_CHECK(cudaFree(sink));
  return double(bytes) / (double(best) / 1e3);
}

// What one step of the model must read or compute, from its config (bf16 weights, the fp32 router
// split into two bf16 planes, the KV cache in its dtype, as GpuModel holds them).
struct StepCost {
  const ModelConfig& c;
  double attn_weight_bytes() const {  // q, k, v, o of one layer
    const double qd = double(c.num_heads) * c.head_dim, kvd = double(c.num_kv_heads) * c.head_dim;
    return 2.0 * (qd + 2 * kvd) * c.hidden_size + 2.0 * c.hidden_size * qd;
  }
  double expert_bytes() const { return 2.0 * 3 * double(c.moe_intermediate_size) * c.hidden_size; }
  double router_bytes() const { return 4.0 * double(c.routing.num_experts) * c.hidden_size; }
  double lm_head_bytes() const { return 2.0 * double(c.vocab_size) * c.hidden_size; }
  double kv_value_bytes = 2;  // bf16 KV cache (4: fp32)
  double kv_bytes_per_token() const { return 2.0 * kv_value_bytes * double(c.num_kv_heads) * c.head_dim * c.num_layers; }
  // Expected distinct experts of a layer for B tokens routed uniformly (top-k without replacement:
  // each expert is picked by a token with probability k / E).
  double distinct_experts(int B) const {
    const double E = c.routing.num_experts, k = c.routing.top_k;
    return E * (1.0 - std::pow(1.0 - k / E, double(B)));
  }
  // Bytes of a decode step of B sequences whose contexts hold `ctx` positions on average.
  double decode_bytes(int B, double ctx) const {
    return double(c.num_layers) * (attn_weight_bytes() + router_bytes() + distinct_experts(B) * expert_bytes()) +
           lm_head_bytes() + double(B) * ctx * kv_bytes_per_token();
  }
  // FLOPs of a prefill of L tokens: 2 per active weight per token (q/k/v/o, router, the k routed
  // experts, lm_head) plus the causal attention's two products (L^2 / 2 positions per head).
  double prefill_flops(int L) const {
    const double qd = double(c.num_heads) * c.head_dim;
    const double per_token_params =
        double(c.num_layers) * ((attn_weight_bytes() + router_bytes() / 2) / 2 + c.routing.top_k * expert_bytes() / 2) +
        lm_head_bytes() / 2;
    const double attn = double(c.num_layers) * 2.0 * 2.0 * qd * (double(L) * (L + 1) / 2);
    return 2.0 * per_token_params * L + attn;
  }
};

// The timeline of the traced steps: per kernel name, the time from its pdl_wait's return to the
// next kernel's (the time it held the chain), summed per step, median over the steps.
void print_trace(const std::vector<cuda::KernelTrace>& traces, int layers, int B) {
  if (traces.empty()) {
    std::printf("\ntrace, %d sequence(s): no complete step\n", B);
    return;
  }
  const std::vector<std::string>& names = traces[0].names;
  std::vector<std::string> order;  // names in first-launch order
  for (const std::string& n : names)
    if (std::find(order.begin(), order.end(), n) == order.end()) order.push_back(n);
  std::vector<std::vector<double>> per(order.size());  // [name][step] us
  std::vector<double> span;
  for (const cuda::KernelTrace& t : traces) {
    std::vector<double> sum(order.size(), 0.0);
    for (size_t i = 0; i + 1 < t.stamps.size(); i++) {
      const size_t k = size_t(std::find(order.begin(), order.end(), t.names[i]) - order.begin());
      sum[k] += double(t.stamps[i + 1] - t.stamps[i]) / 1e3;
    }
    for (size_t k = 0; k < order.size(); k++) per[k].push_back(sum[k]);
    span.push_back(double(t.stamps.back() - t.stamps.front()) / 1e3);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double total = median(span);
  std::printf("\ntrace, %d sequence(s), graph on, %zu steps: %zu kernels a step; the first kernel's wait to the "
              "last's: median %.1f us (the last kernel's own time is not in it)\n",
              B, traces.size(), names.size(), total);
  std::printf("| kernel | launches a step | us a step (median) | us a layer | share |\n|---|---|---|---|---|\n");
  std::vector<size_t> idx(order.size());
  for (size_t k = 0; k < idx.size(); k++) idx[k] = k;
  std::vector<double> med(order.size());
  for (size_t k = 0; k < order.size(); k++) med[k] = median(per[k]);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return med[a] > med[b]; });
  for (size_t k : idx) {
    const long n = long(std::count(names.begin(), names.end(), order[k]));
    std::printf("| %s | %ld | %.1f | %.2f | %.1f%% |\n", order[k].c_str(), n, med[k], med[k] / layers,
                100.0 * med[k] / total);
  }
  // The same by position in a layer, so that kernels of one name apart (gate+up and down, the q/k/v
  // and o projections, the two norms) show apart: the layer's period P is the shortest with which the
  // middle half of the names repeats; position j's figure is the median over every layer and step.
  const size_t n = names.size();
  size_t P = 0;
  for (size_t q = 1; q <= 128 && 2 * q < n / 2 && !P; q++) {
    bool same = true;
    for (size_t i = n / 4; i + q < 3 * n / 4 && same; i++) same = names[i] == names[i + q];
    if (same) P = q;
  }
  if (!P) {
    std::printf("\n(no repeating layer in the trace: no per-position table)\n");
    return;
  }
  const size_t i0 = n / 4;  // (a layer's kernels from an arbitrary one of them: names tell which)
  std::printf("\nper position in a layer (%zu kernels a layer, from kernel %zu of the step), us: median, worst\n", P, i0);
  std::printf("| position | kernel | median | worst |\n|---|---|---|---|\n");
  for (size_t j = 0; j < P; j++) {
    std::vector<double> v;
    for (const cuda::KernelTrace& t : traces)
      for (size_t i = (i0 + j) % P; i + 1 < t.stamps.size(); i += P)
        if (t.names[i] == names[i0 + j] && i >= P && i + 2 * P < t.stamps.size())  // (not the first or last layers)
          v.push_back(double(t.stamps[i + 1] - t.stamps[i]) / 1e3);
    if (v.empty()) continue;
    std::printf("| %zu | %s | %.2f | %.2f |\n", j, names[i0 + j].c_str(), median(v), *std::max_element(v.begin(), v.end()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    NcclGroup& g = NcclGroup::world();  // selects this process's GPU
    (void)g;
    int layers = 48, steps = 32;
    double peak_tflops = 989.0;
    FILE* f = nullptr;
    std::vector<int> batches = {1, 8, 64, 256};
    bool prefill = true, profile_step = false, trace = false;
    KvOptions kv;
    kv.dtype = KvDtype::BF16;
    for (int a = 1; a < argc; a += 2) {
      const std::string k = argv[a];
      if (a + 1 >= argc) throw std::runtime_error("flag " + k + " needs a value");
      const std::string v = argv[a + 1];
      if (k == "--out") {
        f = std::fopen(v.c_str(), "w");
        if (!f) throw std::runtime_error("--out " + v + ": cannot open for writing");
      } else if (k == "--batches") {
        batches.clear();
        for (size_t p = 0; p < v.size();) {
          const size_t q = std::min(v.find(',', p), v.size());
          batches.push_back(std::stoi(v.substr(p, q - p)));
          p = q + 1;
        }
      } else if (k == "--prefill") {
        prefill = v != "0";
      } else if (k == "--layers") {
        layers = std::stoi(v);
        if (layers < 1) throw std::runtime_error("--layers " + v + ": at least 1");
      } else if (k == "--steps") {
        steps = std::stoi(v);
        if (steps < 1) throw std::runtime_error("--steps " + v + ": at least 1");
      } else if (k == "--kv-cache-dtype") {
        kv.dtype = parse_kv_dtype(v);
        if (kv.dtype == KvDtype::Auto) kv.dtype = KvDtype::BF16;
      } else if (k == "--profile-step") {
        profile_step = v != "0";
      } else if (k == "--trace") {
        trace = v != "0";
        if (trace && !cuda::kernel_trace_built())
          throw std::runtime_error("--trace 1 needs a build with -DEPMOE_KERNEL_TRACE=ON (scripts/gpu-package.sh TRACE=1)");
      } else if (k == "--peak-tflops") {
        peak_tflops = std::stod(v);
      } else if (k == "--split-gemv-ring-wide" || k == "--split-gemv-early") {
        // split_gemv v6: the ring of the o projection (K >= 4096) alone, 8/16/32 blocks; how many
        // ring chunks a warp asks for before its PDL wait (-1: all) -- the same bits.
        cuda::SplitGemvConfig c = cuda::split_gemv_config();
        (k == "--split-gemv-early" ? c.early : c.ring_wide) = std::stoi(v);
        cuda::set_split_gemv_config(c);
      } else if (k == "--split-gemv-ring") {
        // The decode projections' split_gemv ring: -1 chosen per weight (default), 8/16/32 blocks
        // (one warp per CTA), 0 v3 (register prefetch) -- the same bits, to compare in one process.
        // (EPMOE_SPLIT_GEMV=v4 chooses the version; set before the weights are packed.)
        cuda::SplitGemvConfig c = cuda::split_gemv_config();
        c.ring = std::stoi(v);
        c.warps = c.ring > 0 ? 1 : c.warps;
        if (c.ring == 0) c.version = 3;
        cuda::set_split_gemv_config(c);
      } else {
        throw std::runtime_error("unknown flag " + k +
                                 " (flags: --out, --layers, --batches, --prefill, --steps, --peak-tflops, --profile-step, "
                                 "--kv-cache-dtype, --split-gemv-ring, --split-gemv-ring-wide, --split-gemv-early, --trace)");
      }
    }
    const double read_bw = measure_read_bandwidth();
    std::printf("HBM read bandwidth (streaming kernel, best of 10 x 4 GiB): %.0f GB/s; bf16 peak taken as %.0f TFLOP/s\n\n",
                read_bw / 1e9, peak_tflops);
    nlohmann::json j = {{"architectures", {"Qwen3MoeForCausalLM"}},
                        {"model_type", "qwen3_moe"},
                        {"hidden_size", 2048},
                        {"num_hidden_layers", layers},
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
    ModelConfig cfg = parse_model_config(j, "synthesized Qwen3-30B-A3B (" + std::to_string(layers) + " layers)");
    Placement pl = Placement::make_default(cfg.routing.num_experts, 1, 0);
    const auto t_synth = std::chrono::steady_clock::now();
    auto model = make_synthetic_gpu_model(cfg, pl, 0, /*f32=*/false, 42, kv);
    EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
    std::printf("%d layers synthesized on the device in %.1f s\n\n", layers,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_synth).count());
    LanguageModel& m = *model;
    auto be = make_local_backend(Device::Cuda, pl);
    StepCost cost{cfg};
    cost.kv_value_bytes = kv.dtype == KvDtype::BF16 ? 2 : 4;
    std::printf("KV cache: %s, %lld positions\n\n", kv_dtype_name(kv.dtype), (long long)m.kv_pool().total_blocks() * m.kv_pool().block_tokens());
    if (f)
      std::fprintf(f, "phase\tbatch\tcontext\tgraph\ttokens_per_s\tms_per_step\tfloor_ms\tof_floor\tlayers\n");
    std::printf("| phase | sequences | context | graph | tokens/s | ms per step | floor ms | floor / time |\n"
                "|---|---|---|---|---|---|---|---|\n");
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
          // Bound by whichever is longer: its FLOPs at the peak, or reading every weight its tokens
          // route to once (at 512 tokens every expert of every layer: the reads win on an H200).
          const double t = ms(t0, t1);
          const double floor = std::max(cost.prefill_flops(L) / (peak_tflops * 1e12),
                                        cost.decode_bytes(L, 0) / read_bw) * 1e3;
          std::printf("| prefill | 1 | %d | - | %.0f | %.2f | %.2f | %.2f |\n", L, L / (t / 1e3), t, floor, floor / t);
          if (f)
            std::fprintf(f, "prefill\t1\t%d\t-\t%.1f\t%.3f\t%.3f\t%.3f\t%d\n", L, L / (t / 1e3), t, floor, floor / t,
                         layers);
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
        // The prompts in chunks of 16 sequences (2048 tokens a step, serve's --max-batch-tokens
        // default): one 32K-token step at B = 256 needs more activation memory than the default
        // --mem-fraction leaves beside a 48-layer model and its pool.
        std::vector<int32_t> ids;
        for (size_t c = 0; c < ps.size(); c += 16) {
          const size_t e = std::min(ps.size(), c + 16);
          auto part = m.forward_greedy({ps.begin() + long(c), ps.begin() + long(e)},
                                       {prompts.begin() + long(c), prompts.begin() + long(e)}, *be);
          ids.insert(ids.end(), part.begin(), part.end());
        }
        double total = 0;
        std::vector<double> per_step;
        // (--trace: the names noted in step 0, which captures the graph or runs the same kernels
        // eagerly before step 1 captures them; the stamps of every timed replay)
        const bool traced = trace && on == 1;
        std::vector<cuda::KernelTrace> traces;
        for (int s = 0; s < steps + 2; s++) {
          std::vector<std::vector<int32_t>> next;
          for (int b = 0; b < B; b++) next.push_back({ids[size_t(b)]});
          const bool profiled = profile_step && on == 0 && s == 2;
          if (profiled) EPMOE_CUDA_CHECK(cudaProfilerStart());
          if (traced && s == 0) cuda::kernel_trace_start(size_t(64) * size_t(layers) + 256);
          if (traced && s >= 2) cuda::kernel_trace_clear();
          auto t0 = now();
          ids = m.forward_greedy(ps, next, *be);
          auto t1 = now();
          if (traced && s == 0) cuda::kernel_trace_stop_names();
          if (traced && s >= 2) {
            cuda::KernelTrace t = cuda::kernel_trace_read();
            if (t.complete()) traces.push_back(std::move(t));
            else if (s == 2)
              std::printf("trace, %d sequence(s): %zu kernels launched, %zu stamps (a kernel that does not call "
                          "pdl_wait once in CTA 0, or one not launched by launch_pdl)\n",
                          B, t.names.size(), t.stamps.size());
          }
          if (profiled) EPMOE_CUDA_CHECK(cudaProfilerStop());
          if (s >= 2) total += ms(t0, t1), per_step.push_back(ms(t0, t1));
        }
        if (traced) {
          cuda::kernel_trace_end();
          print_trace(traces, layers, B);
        }
        std::sort(per_step.begin(), per_step.end());
        // The average context of the timed steps: 128 prompt + 1 + the 2 untimed steps + half the timed ones.
        const double ctx = 128 + 3 + steps / 2.0;
        const double floor = cost.decode_bytes(B, ctx) / read_bw * 1e3, med = per_step[per_step.size() / 2];
        last[on] = ids;
        const GpuGraphStats after = gpu_graph_stats(m);
        std::printf("| decode | %d | 128+ | %s | %.0f | %.2f (median %.2f, worst %.2f) | %.2f | %.2f |\n", B,
                    on ? "on" : "off", B * steps / (total / 1e3), total / steps, med, per_step.back(), floor,
                    floor / (total / steps));
        if (on)
          std::fprintf(stderr, "  B %d graph on: %lld replays, %lld captures, %lld eager steps\n", B,
                       (long long)(after.replays - before.replays), (long long)(after.captures - before.captures),
                       (long long)(after.eager_steps - before.eager_steps));
        if (f)
          std::fprintf(f, "decode\t%d\t128\t%s\t%.1f\t%.3f\t%.3f\t%.3f\t%d\n", B, on ? "on" : "off",
                       B * steps / (total / 1e3), total / steps, floor, floor / (total / steps), layers);
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
