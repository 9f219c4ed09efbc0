// `epmoe check`: every backend against the single-process reference, after a reduction audit.
//
//   mpirun -np R epmoe check --model DIR [--moe-a2a-backend all|NAME,...] [--prompts N]
//       [--prompt-len L] [--gen-tokens G] [--json FILE] [--inject FAULT] [--reference local|FILE]
//   scripts/gpu-launch.sh R epmoe check --device cuda --model DIR ...   (one process per GPU)
//
// Exit 0 when every backend passes, 1 when one fails, 2 on bad input.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "check/audit.h"
#include "check/differential.h"
#ifdef EPMOE_HAVE_CUDA
#include "cuda/check.h"
#endif
#include "cli/commands.h"
#include "cli/options.h"
#include "ep/fault.h"
#include "io/json_util.h"
#include "io/safetensors.h"
#include "kernels/matmul.h"
#include "util/threads.h"
#include "util/error.h"

namespace epmoe {

namespace {

struct CheckOptions {
  RunOptions run;
  std::string backends = "all";
  int prompts = 8;
  int prompt_len = 16;
  int gen_tokens = 8;
  std::string json;
  std::string inject;
  std::string reference = "local";
  uint64_t seed = 1;
  bool audit_only = false;
};

struct Row {
  std::string backend;
  AuditResult audit;
  BackendStats stats;
  bool pass = false;
};

std::vector<std::string> chosen_backends(const std::string& spec) {
  if (spec == "all") return backend_names();
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

void print_table(const CheckOptions& o, const ModelConfig& cfg, int R, const std::vector<Row>& rows, bool exact) {
  std::printf("epmoe check: %s, %d rank%s, %s combine, reference: %s%s\n", o.run.model_dir.c_str(), R, R == 1 ? "" : "s",
              exact ? "deterministic" : "fast", o.reference == "local" ? "local (all experts, one process)" : o.reference.c_str(),
              o.inject.empty() ? "" : (", injected fault: " + o.inject).c_str());
  if (o.reference == "local")
    std::printf("sequences: %d prompts x %d tokens + %d generated, spread over the ranks; vocab %d\n", o.prompts,
                o.prompt_len, o.gen_tokens, cfg.vocab_size);
  std::printf("%-11s %-44s %11s %11s %9s %8s %10s %s\n", "backend", "reduction audit", "max|dlogp|", "mean|dlogp|",
              "identical", "greedy", "degenerate", "verdict");
  for (auto& r : rows) {
    std::string audit = r.audit.verdict.substr(0, r.audit.verdict.find(", "));  // the dominant diagnosis
    if (audit.size() > 44) audit = audit.substr(0, 41) + "...";
    char greedy[32];
    std::snprintf(greedy, sizeof greedy, "%lld/%lld", (long long)r.stats.greedy_agree, (long long)r.stats.greedy_total);
    std::printf("%-11s %-44s %11.3g %11.3g %9s %8s %10s %s\n", r.backend.c_str(), audit.c_str(), r.stats.max_abs_dlogprob,
                r.stats.mean_abs_dlogprob, r.stats.identical ? "yes" : "no", greedy, r.stats.degenerate ? "YES" : "no",
                r.pass ? "PASS" : "FAIL");
  }
  for (auto& r : rows)
    if (r.audit.verdict.find(", ") != std::string::npos)
      std::printf("  %s audit, all diagnoses: %s\n", r.backend.c_str(), r.audit.verdict.c_str());
}

void write_json(const std::string& path, const CheckOptions& o, int R, const std::vector<Row>& rows, bool exact, bool all_pass) {
  nlohmann::json j;
  j["model"] = o.run.model_dir;
  j["ranks"] = R;
  j["combine"] = exact ? "deterministic" : "fast";
  j["reference"] = o.reference;
  j["inject"] = o.inject.empty() ? "none" : o.inject;
  j["prompts"] = o.prompts;
  j["prompt_len"] = o.prompt_len;
  j["gen_tokens"] = o.gen_tokens;
  j["pass"] = all_pass;
  for (auto& r : rows) {
    nlohmann::json b;
    b["backend"] = r.backend;
    b["audit"] = {{"pass", r.audit.pass}, {"verdict", r.audit.verdict}, {"tokens", r.audit.tokens},
                  {"counts", r.audit.counts}, {"max_rel_error", r.audit.max_rel_error}};
    b["max_abs_dlogprob"] = r.stats.max_abs_dlogprob;
    b["mean_abs_dlogprob"] = r.stats.mean_abs_dlogprob;
    b["identical"] = r.stats.identical;
    b["greedy_agree"] = r.stats.greedy_agree;
    b["greedy_total"] = r.stats.greedy_total;
    b["degenerate"] = r.stats.degenerate;
    b["pass"] = r.pass;
    j["backends"].push_back(b);
  }
  std::ofstream f(path);
  if (!f) throw InputError(path + ": cannot open for writing");
  f << j.dump(2) << "\n";
}

bool row_passes(const Row& r, bool exact) {
  const bool logits_ok = exact ? r.stats.identical : r.stats.max_abs_dlogprob <= 1e-4;
  return r.audit.pass && logits_ok && !r.stats.degenerate && r.stats.greedy_agree == r.stats.greedy_total;
}

int report(const CheckOptions& o, const ModelConfig& cfg, int R, int me, const std::vector<Row>& rows, bool exact) {
  bool all_pass = true;
  for (auto& r : rows) all_pass &= r.pass;
  if (me == 0) {
    print_table(o, cfg, R, rows, exact);
    std::printf("%s\n", all_pass ? "check: every backend passes" : "check: FAILED");
    if (!o.json.empty()) write_json(o.json, o, R, rows, exact, all_pass);
    std::fflush(stdout);
  }
  return all_pass ? 0 : 1;
}

#ifdef EPMOE_HAVE_CUDA
// --device cuda: the same check over the GPU group (src/cuda/check.cu), deterministic combine.
int run_check_cuda(const CheckOptions& o) {
  if (o.reference != "local") throw InputError("--device cuda: only --reference local is implemented");
  cuda::CudaCheckOptions c;
  c.run = cuda_options(o.run);
  c.backends = o.backends == "all" ? cuda::gpu_backend_names() : chosen_backends(o.backends);
  c.prompts = o.prompts, c.prompt_len = o.prompt_len, c.gen_tokens = o.gen_tokens, c.seed = o.seed;
  c.fault = parse_fault(o.inject);
  const ModelConfig cfg = load_model_config(o.run.model_dir);
  const cuda::CudaCheckResult res = cuda::cuda_check(c);
  std::vector<Row> rows;
  for (auto& r : res.rows) {
    Row row{r.backend, r.audit, r.stats, false};
    row.pass = row_passes(row, true);
    rows.push_back(row);
  }
  return report(o, cfg, res.ranks, res.rank, rows, true);
}
#endif

int run_check(const CheckOptions& o) {
  if (use_cuda(o.run)) {
#ifdef EPMOE_HAVE_CUDA
    return run_check_cuda(o);
#endif
  }
  const Fault fault = parse_fault(o.inject);
  const auto names = chosen_backends(o.backends);
  MpiGroup& comm = MpiGroup::world();
  comm.set_timeout(o.run.comm_timeout);
  set_num_threads(o.run.threads);
  set_compute_mode(o.run.compute == "bf16" ? ComputeMode::BF16 : ComputeMode::F32);
  RunOptions ro = o.run;
  ro.backend = names[0];  // validated below for all of them
  ModelConfig cfg = load_model_config(o.run.model_dir);
  Checkpoint ckpt(o.run.model_dir);
  const int R = comm.size(), me = comm.rank();
  const int E = cfg.routing.num_experts;
  Placement place = o.run.placement_file.empty() ? Placement::make_default(E, R, o.run.redundant_experts)
                                                 : Placement::from_file(o.run.placement_file, E, R);
  if (o.run.check_weights)  // the local reference loads every expert on every rank
    check_weights_finite(cfg, ckpt, o.reference == "local" ? Placement::make_default(E, 1, 0).logical_owned_by(0)
                                                           : place.logical_owned_by(me));
  const BackendOptions bopt = backend_options(o.run);
  const bool exact = bopt.combine == CombineMode::Deterministic;
  std::vector<std::unique_ptr<A2ABackend>> backends;
  for (auto& n : names) backends.push_back(make_backend(n, comm, place, bopt));  // InputError on a bad name

  // The reference: this rank's sequences with every expert local and no backend.
  int gen = o.gen_tokens;
  ReferenceRun ref;
  if (o.reference == "local") {
    Placement solo = Placement::make_default(E, 1, 0);
    Model ref_model(cfg, ckpt, solo, 0);
    auto local = make_local_backend(solo);
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
    ref = run_reference(ref_model, *local, comm, ids, prompts, gen);
  } else {
    ref = reference_from_file(o.reference, cfg, me);
    gen = 0;
  }

  Model model(cfg, ckpt, place, me);
  std::vector<Row> rows;
  for (size_t i = 0; i < names.size(); i++) {
    set_injected_fault(fault);
    Row row;
    row.backend = names[i];
    AuditOptions ao;
    ao.H = cfg.hidden_size;
    ao.K = cfg.routing.top_k;
    ao.tokens_per_rank = bopt.max_dispatch_tokens_per_rank + 5;  // bounded backends need a second round
    ao.exact = exact;
    row.audit = run_audit(comm, place, *backends[i], ao);
    row.stats = compare_backend(model, *backends[i], comm, ref, gen);
    set_injected_fault(Fault::None);
    row.pass = row_passes(row, exact);
    rows.push_back(row);
  }
  return report(o, cfg, R, me, rows, exact);
}

}  // namespace

Command register_check(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "check",
      "Prove every a2a backend against the single-process reference: a reduction audit with probe experts, then the "
      "log-probabilities, bits and greedy tokens of real sequences. Run it under mpirun -np R (CPUs), or with --device cuda under scripts/gpu-launch.sh R (one "
      "process per GPU).");
  auto o = std::make_shared<CheckOptions>();
  add_run_options(*cmd, o->run, /*with_backend=*/false);
  add_device_options(*cmd, o->run);
  std::string names;
  for (auto& n : backend_names()) names += (names.empty() ? "" : ",") + n;
  cmd->add_option("--moe-a2a-backend", o->backends, "'all' or a comma-separated list of: " + names)->capture_default_str();
  cmd->add_option("--prompts", o->prompts, "Random prompts, spread over the ranks")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--prompt-len", o->prompt_len, "Tokens per prompt")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--gen-tokens", o->gen_tokens, "Greedy tokens generated per prompt")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random prompts")->capture_default_str();
  cmd->add_option("--json", o->json, "Also write the results as JSON to this file");
  std::string faults;
  for (auto& n : fault_names()) faults += (faults.empty() ? "" : "|") + n;
  cmd->add_option("--inject", o->inject, "Inject a bug class into every backend to see the check catch it: " + faults);
  cmd->add_option("--reference", o->reference,
                  "'local': each rank recomputes its sequences with all experts in-process (the model must fit); or a "
                  "logits file written by a single-process `epmoe score`")
      ->capture_default_str();
  return {cmd, [o] { return run_check(*o); }};
}

}  // namespace epmoe
