#include "cli/options.h"

#include <algorithm>
#include <cmath>

#include "check/audit.h"
#include "kernels/matmul.h"
#include "util/error.h"
#include "util/threads.h"

namespace epmoe {

void add_model_option(CLI::App& cmd, RunOptions& o) {
  cmd.add_option("--model", o.model_dir, "Hugging Face model folder (config.json + safetensors)")->required();
}

void add_run_options(CLI::App& cmd, RunOptions& o, bool with_backend) {
  add_model_option(cmd, o);
  cmd.add_option("--threads", o.threads, "Worker threads per rank (0: the cores available to this rank)")
      ->check(CLI::NonNegativeNumber);
  if (with_backend) {
    std::string names;
    for (auto& n : backend_names()) names += (names.empty() ? "" : "|") + n;
    cmd.add_option("--moe-a2a-backend", o.backend, "All-to-all backend for expert parallelism: " + names)
        ->capture_default_str();
  }
  cmd.add_option("--combine", o.combine,
                 "deterministic: one row per (token, slot) summed at home in slot order (bit-identical for every "
                 "layout); fast: per-rank partial sums (fewer bytes, ~1e-6 differences)")
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
  cmd.add_flag("--check-numerics", o.check_numerics, "Stop at the first layer that produces NaN or Inf");
  cmd.add_flag("--check-weights", o.check_weights, "Scan the weights this rank loads for NaN/Inf");
  cmd.add_option("--compute", o.compute,
                 "Activation precision of the matmuls: f32 (default), or bf16 (activations rounded to bf16 and "
                 "multiplied with the AVX512-BF16 dot-product instructions on bf16 weights; needs that CPU feature, "
                 "else f32 is used)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd.add_flag("--audit", o.audit, "Run the reduction audit of the backend once before the work");
}

void add_device_options(CLI::App& cmd, RunOptions& o) {
  cmd.get_option("--compute")->each([&o](const std::string&) { o.compute_given = true; });
  cmd.add_option("--device", o.device,
                 "cpu, or cuda: the GPU path (one process per GPU; several GPUs through scripts/gpu-launch.sh; "
                 "--compute defaults to bf16 there; needs a build with -DEPMOE_CUDA=ON)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd.add_flag("--batch-invariant", o.batch_invariant,
               "--device cuda: a row's bits never depend on the batch (always so there: no split-K, fixed-order "
               "reductions; accepted for compatibility, costs nothing)");
}

bool use_cuda(const RunOptions& o) {
  if (o.device != "cuda") return false;
#ifdef EPMOE_HAVE_CUDA
  return true;
#else
  throw InputError("--device cuda: this epmoe was built without CUDA (configure with -DEPMOE_CUDA=ON on a machine "
                   "with nvcc and NCCL)");
#endif
}

#ifdef EPMOE_HAVE_CUDA
cuda::CudaRunOptions cuda_options(const RunOptions& o) {
  cuda::CudaRunOptions c;
  c.model_dir = o.model_dir;
  c.backend = o.backend;
  c.compute = o.compute_given ? o.compute : "bf16";
  c.batch_invariant = o.batch_invariant;
  c.redundant_experts = o.redundant_experts;
  c.placement_file = o.placement_file;
  c.max_dispatch_tokens_per_rank = o.max_dispatch_tokens_per_rank;
  c.comm_timeout = o.comm_timeout;
  c.check_numerics = o.check_numerics;
  if (o.combine != "deterministic") throw InputError("--device cuda: only --combine deterministic is implemented");
  if (o.audit || o.check_weights) throw InputError("--device cuda: --audit and --check-weights run on the CPU path only");
  return c;
}
#endif

Runtime make_runtime(const RunOptions& o) {
  if (o.device == "cuda")
    throw InputError("--device cuda: this command runs on CPUs only (GPU checks: scripts/gpu-test.sh)");
  Runtime rt;
  rt.comm = &MpiGroup::world();
  rt.comm->set_timeout(o.comm_timeout);
  set_num_threads(o.threads);
  set_compute_mode(o.compute == "bf16" ? ComputeMode::BF16 : ComputeMode::F32);
  rt.cfg = load_model_config(o.model_dir);
  rt.ckpt = std::make_unique<Checkpoint>(o.model_dir);
  const int E = rt.cfg.routing.num_experts, R = rt.comm->size();
  rt.placement = o.placement_file.empty() ? Placement::make_default(E, R, o.redundant_experts)
                                          : Placement::from_file(o.placement_file, E, R);
  if (o.check_weights) check_weights_finite(rt.cfg, *rt.ckpt, rt.placement.logical_owned_by(rt.comm->rank()));
  rt.model = std::make_unique<Model>(rt.cfg, *rt.ckpt, rt.placement, rt.comm->rank());
  rt.backend_options = backend_options(o);
  rt.backend = make_backend(o.backend, *rt.comm, rt.placement, rt.backend_options);
  if (o.audit) {
    AuditOptions ao;
    ao.H = rt.cfg.hidden_size;
    ao.K = rt.cfg.routing.top_k;
    ao.tokens_per_rank = o.max_dispatch_tokens_per_rank + 5;
    ao.exact = rt.backend_options.combine == CombineMode::Deterministic;
    AuditResult a = run_audit(*rt.comm, rt.placement, *rt.backend, ao);
    if (!a.pass) throw CheckError("reduction audit of --moe-a2a-backend " + o.backend + " failed: " + a.verdict);
    if (rt.comm->rank() == 0)
      std::fprintf(stderr, "epmoe: reduction audit of %s: ok (%lld tokens)\n", o.backend.c_str(), (long long)a.tokens);
  }
  return rt;
}

BackendOptions backend_options(const RunOptions& o) {
  BackendOptions b;
  b.combine = o.combine == "fast" ? CombineMode::Fast : CombineMode::Deterministic;
  b.max_dispatch_tokens_per_rank = o.max_dispatch_tokens_per_rank;
  b.chunk_tokens = o.chunk_tokens;
  return b;
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

std::vector<int32_t> parse_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) i++;
    size_t j = i;
    if (j < text.size() && text[j] == '-') j++;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) j++;
    if (j == i || (j == i + 1 && text[i] == '-'))
      throw InputError(what + ": expected comma-separated token ids, got '" + text + "'");
    long long v = std::stoll(text.substr(i, j - i));
    if (v < INT32_MIN || v > INT32_MAX) throw InputError(what + ": id " + text.substr(i, j - i) + " out of range");
    ids.push_back(int32_t(v));
    while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) j++;
    if (j < text.size() && text[j] != ',') throw InputError(what + ": expected ',' after id " + std::to_string(v));
    i = j + 1;
    if (j < text.size() && i >= text.size()) throw InputError(what + ": trailing ','");
  }
  return ids;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); i++) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace epmoe
