#include "cli/options.h"

#include <algorithm>
#include <cstdio>

#include "check/audit.h"
#include "util/error.h"

namespace epmoe {

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
  e.kv.dtype = parse_kv_dtype(o.kv_cache_dtype);
  e.kv.mem_fraction = o.mem_fraction;
  return e;
}

Runtime start_runtime(const RunOptions& o) {
  Runtime rt = make_runtime(engine_options(o));
  if (o.audit) {
    const AuditOptions ao =
        make_audit_options(rt.cfg.hidden_size, rt.cfg.routing.top_k, rt.options.backend_options, rt.group->size());
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
