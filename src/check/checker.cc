#include "check/checker.h"

#include <memory>
#include <random>

#include "engine/lockstep.h"
#include "io/safetensors.h"
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
  const Device device = o.engine.device;
  const std::vector<std::string> names = o.backends.empty() ? backend_names(device) : o.backends;
  if (names.empty()) throw InputError("--moe-a2a-backend: no backend to check");
  const bool local_reference = o.reference == "local";

  // The checked runtime through make_runtime's steps, as every command builds its own (each run
  // option acts as there); the backends after the first over its group and placement. Every name
  // and pair is refused here (InputError) before any weight is read.
  EngineOptions eo = o.engine;
  eo.backend = names[0];
  // The local reference loads every expert: its --check-weights scan covers this rank's.
  if (local_reference) eo.check_weights = false;
  Runtime rt = prepare_runtime(eo);
  Group& group = *rt.group;
  std::vector<std::unique_ptr<A2ABackend>> backends;
  backends.push_back(std::move(rt.backend));
  for (size_t i = 1; i < names.size(); i++)
    backends.push_back(make_backend(names[i], device, group, rt.placement, eo.backend_options));

  CheckResult res;
  res.cfg = rt.cfg;
  const ModelConfig& cfg = res.cfg;
  const int R = group.size(), me = group.rank();
  res.rank = me, res.ranks = R;
  res.exact = eo.backend_options.combine == CombineMode::Deterministic;
  const ForwardOptions& fwd = rt.options.forward;

  // The reference: this rank's sequences (prompt i on rank i mod R) on a second runtime, solo:
  // every expert local and no communication, on the same device with the same run options. It
  // goes (with its model's memory) before the checked model is loaded.
  int gen = o.gen_tokens;
  ReferenceRun ref;
  if (local_reference) {
    EngineOptions ro = o.engine;
    ro.solo = true;
    const Runtime solo = make_runtime(ro);
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
    ref = run_reference(*solo.model, *solo.backend, group, ids, prompts, gen, solo.options.forward);
  } else {
    ref = reference_from_file(o.reference, cfg, me);
    gen = 0;
  }

  load_model(rt);
  const AuditOptions ao = make_audit_options(cfg.hidden_size, cfg.routing.top_k, eo.backend_options, R);
  for (size_t i = 0; i < names.size(); i++) {
    CheckRow row;
    row.backend = names[i];
    row.audit = run_audit(group, device, rt.placement, *backends[i], ao);
    row.stats = compare_backend(*rt.model, *backends[i], group, ref, gen, fwd);
    row.pass = row_passes(row, res.exact);
    res.rows.push_back(row);
  }
  return res;
}

}  // namespace epmoe
