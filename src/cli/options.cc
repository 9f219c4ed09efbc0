#include "cli/options.h"

#include <cmath>

#include "check/audit.h"
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
  cmd.add_flag("--audit", o.audit, "Run the reduction audit of the backend once before the work");
}

Runtime make_runtime(const RunOptions& o) {
  Runtime rt;
  rt.comm = &Communicator::world();
  rt.comm->set_timeout(o.comm_timeout);
  set_num_threads(o.threads);
  rt.cfg = load_model_config(o.model_dir);
  rt.ckpt = std::make_unique<Checkpoint>(o.model_dir);
  const int E = rt.cfg.routing.num_experts, R = rt.comm->size();
  rt.placement = o.placement_file.empty() ? Placement::make_default(E, R, o.redundant_experts)
                                          : Placement::from_file(o.placement_file, E, R);
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
