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
#include "ep/fault.h"
#include "util/error.h"

namespace epmoe {

namespace {

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

}  // namespace

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

}  // namespace epmoe
