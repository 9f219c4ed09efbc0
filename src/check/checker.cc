#include "check/checker.h"

#include <memory>
#include <random>

#include "engine/lockstep.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "util/error.h"
#include "util/token_ids.h"

namespace epmoe {

namespace {

// The reference read from a file written by a single-process `epmoe score` (rank 0's sequence).
ReferenceRun reference_from_file(const std::string& path, const ModelConfig& cfg, int rank) {
  SafetensorsFile f(path);
  TensorView v = f.get("logits");
  auto meta = f.metadata();
  auto it = meta.find("ids");
  if (it == meta.end()) throw InputError(path + ": no 'ids' in the metadata (write it with `epmoe score`)");
  std::vector<int32_t> ids = parse_ids(it->second, path + " metadata ids");
  if (v.rank() != 2 || v.shape[0] != int64_t(ids.size()) || v.shape[1] != cfg.vocab_size)
    throw InputError(path + ": logits have shape " + v.shape_str() + ", expected [" + std::to_string(ids.size()) + ", " +
                     std::to_string(cfg.vocab_size) + "]");
  ReferenceRun r;
  if (rank != 0) return r;
  r.ids = {0};
  r.prompts = {ids};
  r.generated = {{}};
  r.logits = {to_f32(v)};
  r.logprobs = {log_softmax_rows(r.logits[0], cfg.vocab_size)};
  return r;
}

bool row_passes(const CheckRow& r, bool exact) {
  const bool logits_ok = exact ? r.stats.identical : r.stats.max_abs_dlogprob <= 1e-4;
  return r.audit.pass && logits_ok && !r.stats.degenerate && r.stats.greedy_agree == r.stats.greedy_total;
}

}  // namespace

bool CheckResult::pass() const {
  for (auto& r : rows)
    if (!r.pass) return false;
  return true;
}

std::vector<std::string> parse_backend_list(const std::string& spec, Device device) {
  if (spec == "all") return backend_names(device);
  std::vector<std::string> out;
  for (size_t p = 0; p <= spec.size();) {
    size_t q = spec.find(',', p);
    if (q == std::string::npos) q = spec.size();
    std::string name = spec.substr(p, q - p);
    if (name.empty()) throw InputError("--moe-a2a-backend: empty name in '" + spec + "'");
    out.push_back(name);
    p = q + 1;
  }
  return out;
}

CheckResult run_check(const CheckOptions& o) {
  const EngineOptions& eo = o.engine;
  const Device device = eo.device;
  const std::vector<std::string> names = o.backends.empty() ? backend_names(device) : o.backends;
  Group& group = start_group(device, eo.comm_timeout);
  EngineOptions ctx = eo;
  ctx.compute = resolve_compute(device, eo.compute);
  apply_run_context(ctx);
  CheckResult res;
  res.cfg = load_model_config(eo.model_dir);
  const ModelConfig& cfg = res.cfg;
  Checkpoint ckpt(eo.model_dir);
  const int R = group.size(), me = group.rank(), E = cfg.routing.num_experts;
  res.rank = me, res.ranks = R;
  res.exact = eo.backend_options.combine == CombineMode::Deterministic;
  const Placement place = make_placement(eo, E, R);
  if (eo.check_weights)  // the local reference loads every expert on every rank
    check_weights_finite(cfg, ckpt, o.reference == "local" ? Placement::make_default(E, 1, 0).logical_owned_by(0)
                                                           : place.logical_owned_by(me));
  std::vector<std::unique_ptr<A2ABackend>> backends;
  for (auto& n : names)  // InputError on a bad name or pair, before any weight is read
    backends.push_back(make_backend(n, device, group, place, eo.backend_options));

  // The reference: this rank's sequences (prompt i on rank i mod R) with every expert local and
  // no communication, on the same device.
  int gen = o.gen_tokens;
  ReferenceRun ref;
  if (o.reference == "local") {
    const Placement solo = Placement::make_default(E, 1, 0);
    auto ref_model = make_model(device, cfg, ckpt, solo, 0, ctx.compute, ctx.kv, ctx.fp8_compute, ctx.lm_head);
    auto local = make_local_backend(device, solo);
    std::mt19937_64 rng(o.seed);
    std::vector<uint64_t> ids;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < o.prompts; i++) {
      std::vector<int32_t> p(size_t(o.prompt_len));
      for (auto& t : p) t = int32_t(rng() % uint64_t(cfg.vocab_size));
      if (i % R == me) {
        ids.push_back(uint64_t(i));
        prompts.push_back(p);
      }
    }
    ref = run_reference(*ref_model, *local, group, ids, prompts, gen, ctx.forward);
  } else {
    ref = reference_from_file(o.reference, cfg, me);
    gen = 0;
  }

  // Every run option acts here as in the other commands (the reference above takes the same): the
  // KV pool, the lm_head form and --check-numerics reach both models and every forward.
  auto model = make_model(device, cfg, ckpt, place, me, ctx.compute, ctx.kv, ctx.fp8_compute, ctx.lm_head);
  for (size_t i = 0; i < names.size(); i++) {
    CheckRow row;
    row.backend = names[i];
    const AuditOptions ao = make_audit_options(cfg.hidden_size, cfg.routing.top_k, eo.backend_options, R);
    row.audit = run_audit(group, device, place, *backends[i], ao);
    row.stats = compare_backend(*model, *backends[i], group, ref, gen, ctx.forward);
    row.pass = row_passes(row, res.exact);
    res.rows.push_back(row);
  }
  return res;
}

}  // namespace epmoe
