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

#include "check/checker.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "ep/fault.h"
#include "util/error.h"

namespace epmoe {

namespace {

struct CheckCliOptions {
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

void print_table(const CheckCliOptions& o, const ModelConfig& cfg, int R, const std::vector<CheckRow>& rows, bool exact) {
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

void write_json(const std::string& path, const CheckCliOptions& o, int R, const std::vector<CheckRow>& rows, bool exact, bool all_pass) {
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

int report(const CheckCliOptions& o, const ModelConfig& cfg, int R, int me, const std::vector<CheckRow>& rows, bool exact) {
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

int run_check_command(const CheckCliOptions& o) {
  CheckOptions c;
  c.engine = engine_options(o.run);
  c.engine.backend_options.fault = parse_fault(o.inject);
  c.backends = parse_backend_list(o.backends, c.engine.device);
  c.prompts = o.prompts, c.prompt_len = o.prompt_len, c.gen_tokens = o.gen_tokens, c.seed = o.seed;
  c.reference = o.reference;
  const CheckResult res = run_check(c);
  return report(o, res.cfg, res.ranks, res.rank, res.rows, res.exact);
}

}  // namespace

Command register_check(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "check",
      "Prove every a2a backend against the single-process reference: a reduction audit with probe experts, then the "
      "log-probabilities, bits and greedy tokens of real sequences. Run it under mpirun -np R (CPUs), or with --device cuda under scripts/gpu-launch.sh R (one "
      "process per GPU).");
  auto o = std::make_shared<CheckCliOptions>();
  add_run_options(*cmd, o->run, /*with_backend=*/false);
  std::string names;
  for (Device d : all_devices()) {
    std::string list;
    for (auto& n : backend_names(d)) list += (list.empty() ? "" : ",") + n;
    names += std::string(names.empty() ? "" : "; ") + device_name(d) + ": " + list;
  }
  cmd->add_option("--moe-a2a-backend", o->backends, "'all' (every backend of the device) or a comma-separated list (" + names + ")")
      ->capture_default_str();
  cmd->add_option("--prompts", o->prompts, "Random prompts, spread over the ranks")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--prompt-len", o->prompt_len, "Tokens per prompt")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--gen-tokens", o->gen_tokens, "Greedy tokens generated per prompt")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the random prompts")->capture_default_str();
  cmd->add_option("--json", o->json, "Also write the results as JSON to this file");
  std::string faults;
  for (auto& n : fault_names()) faults += (faults.empty() ? "" : "|") + n;
  cmd->add_option("--inject", o->inject, "Inject a bug class into every backend to see the check catch it: " + faults +
                                      " (cuda: double-reduce)");
  cmd->add_option("--reference", o->reference,
                  "'local': each rank recomputes its sequences with all experts in-process (the model must fit); or a "
                  "logits file written by a single-process `epmoe score`")
      ->capture_default_str();
  return {cmd, [o] { return run_check_command(*o); }};
}

}  // namespace epmoe
