#include "cli/options.h"

#include <algorithm>
#include <cstdio>

#include "check/audit.h"
#include "util/error.h"

namespace epmoe {

void add_model_option(CLI::App& cmd, RunOptions& o) {
  cmd.add_option("--model", o.model_dir, "Hugging Face model folder (config.json + safetensors)")->required();
}

void add_run_options(CLI::App& cmd, RunOptions& o, bool with_backend) {
  add_model_option(cmd, o);
  cmd.add_option("--device", o.device,
                 "cpu (MPI ranks: mpirun -np R), or cuda: one process per GPU (several GPUs through "
                 "scripts/gpu-launch.sh R; needs a build with -DEPMOE_CUDA=ON)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "Worker threads per rank on the CPU (0: the cores available to this rank)")
      ->check(CLI::NonNegativeNumber);
  if (with_backend) {
    std::string names;
    for (Device d : all_devices()) {
      std::string list;
      for (auto& n : backend_names(d)) list += (list.empty() ? "" : "|") + n;
      names += std::string(names.empty() ? "" : "; ") + device_name(d) + ": " + list;
    }
    cmd.add_option("--moe-a2a-backend", o.backend, "All-to-all backend for expert parallelism (" + names + ")")
        ->capture_default_str();
  }
  cmd.add_option("--combine", o.combine,
                 "deterministic: one row per (token, slot) summed at home in slot order (bit-identical for every "
                 "layout); fast: per-rank partial sums (fewer bytes, ~1e-6 differences; every backend has it on cpu, "
                 "some on cuda: a backend without it is refused, naming those with it)")
      ->check(CLI::IsMember({"deterministic", "fast"}))
      ->capture_default_str();
  cmd.add_option("--ep-redundant-experts", o.redundant_experts,
                 "Extra replicas of experts 0..N-1 (or as the --placement file says)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--placement", o.placement_file, "JSON file: logical expert -> list of physical slots");
  cmd.add_option("--max-dispatch-tokens-per-rank", o.max_dispatch_tokens_per_rank,
                 "Capacity of the low-latency backend's buffers per round; more tokens go in further rounds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--chunk-tokens", o.chunk_tokens, "Tokens per chunk of the pipelined (fused) backend")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--comm-timeout", o.comm_timeout, "Seconds a rank waits on its peers before aborting the group")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_flag("--check-numerics", o.check_numerics,
               "Stop at the first layer (cpu) or the logits (cuda) that produce NaN or Inf");
  cmd.add_flag("--check-weights", o.check_weights, "Scan the weights this rank loads for NaN/Inf");
  cmd.add_option("--compute", o.compute,
                 "Activation precision of the matmuls. cpu: f32 (default), or bf16 (activations rounded to bf16 and "
                 "multiplied with the AVX512-BF16 dot-product instructions on bf16 weights; needs that CPU feature, "
                 "else f32 is used). cuda: bf16 (default: bf16 tensor cores, fp32-grade products outside the routed "
                 "experts) or f32")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd.add_option("--fp8-compute", o.fp8_compute,
                 "Routed experts of an FP8 checkpoint. dequant (default): exact, code x block scale in fp32 -- the "
                 "arithmetic of the goldens, on both devices. tensor-core (cuda only): e4m3 weights kept on the GPU "
                 "(half the bytes), activations quantized per token and 128-channel group, fp8 tensor-core products; "
                 "faster at decode, not bit-near the goldens (docs/gpu.md)")
      ->check(CLI::IsMember({"dequant", "tensor-core"}))
      ->capture_default_str();
  cmd.add_option("--lm-head", o.lm_head,
                 "How the lm_head is read. checkpoint (default): as stored, exact. int8 (cpu only): rows quantized at "
                 "load to int8 with one bf16 scale per 32 weights (llama.cpp Q8_0's layout and error, |w - q s| <= "
                 "s/2): half the bytes of a bf16 head, the matrix every decode step reads whole -- faster decode, "
                 "logits no longer the checkpoint's")
      ->check(CLI::IsMember({"checkpoint", "int8"}))
      ->capture_default_str();
  cmd.add_option("--kv-cache-tokens", o.kv_cache_tokens,
                 "Token positions of the paged KV cache per rank, allocated at start (0: a quarter of the available "
                 "memory on the CPU, 40% of the free GPU memory; at most 1M). Requests wait until their blocks fit; "
                 "one that could never fit is refused")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--kv-block-size", o.kv_block_tokens,
                 "Tokens per KV block: the unit of paging and of prefix reuse (the bits never depend on it)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd.add_flag("--audit", o.audit, "Run the reduction audit of the backend once before the work");
  cmd.add_flag("--batch-invariant", o.batch_invariant,
               "A row's bits never depend on the batch: always so on both devices (no split-K, fixed-order "
               "reductions); accepted for compatibility, costs nothing");
}

EngineOptions engine_options(const RunOptions& o) {
  EngineOptions e;
  e.model_dir = o.model_dir;
  e.device = parse_device(o.device, "--device");
  e.backend = o.backend;
  e.backend_options.combine = o.combine == "fast" ? CombineMode::Fast : CombineMode::Deterministic;
  e.backend_options.max_dispatch_tokens_per_rank = o.max_dispatch_tokens_per_rank;
  e.backend_options.chunk_tokens = o.chunk_tokens;
  e.backend_options.max_tokens_per_rank = int(std::min<int64_t>(o.max_tokens_per_call, INT32_MAX));
  e.redundant_experts = o.redundant_experts;
  e.placement_file = o.placement_file;
  e.comm_timeout = o.comm_timeout;
  e.check_weights = o.check_weights;
  e.compute = o.compute;
  e.fp8_compute = o.fp8_compute;
  e.lm_head = o.lm_head;
  e.threads = o.threads;
  e.forward.check_numerics = o.check_numerics;
  e.kv.tokens = o.kv_cache_tokens;
  e.kv.block_tokens = o.kv_block_tokens;
  return e;
}

Runtime start_runtime(const RunOptions& o) {
  Runtime rt = make_runtime(engine_options(o));
  if (o.audit) {
    AuditOptions ao;
    ao.H = rt.cfg.hidden_size;
    ao.K = rt.cfg.routing.top_k;
    ao.tokens_per_rank = o.max_dispatch_tokens_per_rank + 5;
    // Under a bound on the tokens of a call, the audit keeps to it too (rank r audits
    // tokens_per_rank + 3r tokens).
    if (o.max_tokens_per_call > 0)
      ao.tokens_per_rank = std::min<int64_t>(ao.tokens_per_rank, o.max_tokens_per_call - 3 * (rt.group->size() - 1));
    if (ao.tokens_per_rank < 1)
      throw InputError("--audit with --max-batch-tokens " + std::to_string(o.max_tokens_per_call) +
                       ": too few tokens a step for the audit's " + std::to_string(rt.group->size()) +
                       " ranks (at least " + std::to_string(3 * rt.group->size() - 2) + ")");
    ao.exact = rt.options.backend_options.combine == CombineMode::Deterministic;
    AuditResult a = run_audit(*rt.group, rt.device, rt.placement, *rt.backend, ao);
    if (!a.pass) throw CheckError("reduction audit of --moe-a2a-backend " + o.backend + " failed: " + a.verdict);
    if (rt.group->rank() == 0)
      std::fprintf(stderr, "epmoe: reduction audit of %s: ok (%lld tokens)\n", o.backend.c_str(), (long long)a.tokens);
  }
  return rt;
}

void check_prompt(const std::vector<int32_t>& ids, const ModelConfig& cfg, const std::string& what, int new_tokens) {
  if (ids.empty()) throw InputError(what + ": empty prompt");
  for (size_t i = 0; i < ids.size(); i++)
    if (ids[i] < 0 || ids[i] >= cfg.vocab_size)
      throw InputError(what + ": token id " + std::to_string(ids[i]) + " (position " + std::to_string(i) +
                       ") is outside the vocabulary 0.." + std::to_string(cfg.vocab_size - 1) + " (vocab_size of " +
                       cfg.source + ")");
  // The last generated token is never fed back, so it needs no position.
  const int64_t positions = int64_t(ids.size()) + std::max(new_tokens, 1) - 1;
  if (positions > cfg.max_position_embeddings)
    throw InputError(what + ": " + std::to_string(ids.size()) + " prompt tokens" +
                     (new_tokens > 1 ? " + " + std::to_string(new_tokens) + " new tokens" : std::string()) +
                     " need " + std::to_string(positions) + " positions, more than max_position_embeddings (" +
                     std::to_string(cfg.max_position_embeddings) + ") of " + cfg.source);
}

}  // namespace epmoe
