// `epmoe generate`: greedy decoding. Prompts come as ids (--prompt-ids, or --prompts-file with one
// comma-separated list per line) or as text (--prompt, with --chat for the ChatML template).
// Sequences are spread over the ranks (sequence i on rank i mod R); results print in input order.
#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/lockstep.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace epmoe {

namespace {

struct GenerateOptions {
  RunOptions run;
  std::string prompt_ids;
  bool prompt_ids_given = false;  // given, even if empty (an empty prompt is an error, not absent)
  std::string prompts_file;
  std::string prompt;
  bool prompt_given = false;
  bool chat = false;
  std::string system;
  int max_new_tokens = 16;
  bool ignore_eos = false;
};

// A prompt and where it came from (the flag, or file:line), for messages.
struct Prompt {
  std::string source;
  std::vector<int32_t> ids;
};

std::vector<Prompt> read_prompts_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw InputError(path + ": cannot open prompts file");
  std::vector<Prompt> out;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    n++;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (line.back() == '\r') line.pop_back();
    const std::string where = path + ":" + std::to_string(n);
    out.push_back({where, parse_ids(line, where)});
  }
  if (out.empty()) throw InputError(path + ": no prompts");
  return out;
}

int run_generate(const GenerateOptions& o) {
  const int sources = o.prompt_ids_given + !o.prompts_file.empty() + o.prompt_given;
  if (sources != 1) throw InputError("generate: give exactly one of --prompt-ids, --prompts-file, --prompt");
  if (o.chat && !o.prompt_given) throw InputError("--chat needs a text --prompt");

  std::unique_ptr<Tokenizer> tok;
  std::vector<Prompt> prompts;
  if (o.prompt_given) {
    if (o.prompt.empty() && !o.chat) throw InputError("--prompt: empty prompt");
    tok = std::make_unique<Tokenizer>(Tokenizer::load(o.run.model_dir));
    std::string text = o.chat ? tok->chat_prompt(o.prompt, o.system) : o.prompt;
    prompts.push_back({"--prompt", tok->encode(text)});
    if (prompts.back().ids.empty()) throw InputError("--prompt: the prompt encodes to no tokens");
  } else if (o.prompt_ids_given) {
    prompts.push_back({"--prompt-ids", parse_ids(o.prompt_ids, "--prompt-ids")});
  } else {
    prompts = read_prompts_file(o.prompts_file);
  }
  // Every prompt is checked against the model before any rank loads a weight.
  const ModelConfig cfg = load_model_config(o.run.model_dir);
  for (const Prompt& p : prompts) check_prompt(p.ids, cfg, p.source, o.max_new_tokens);
  Runtime rt = start_runtime(o.run);
  const int me = rt.group->rank();
  std::vector<GenerateRequest> mine;
  for (size_t i : my_share(prompts.size(), *rt.group)) mine.push_back({uint64_t(i), prompts[i].ids});

  GenerateParams gp;
  gp.max_new_tokens = o.max_new_tokens;
  if (!o.ignore_eos) gp.stop_ids = rt.cfg.eos_token_ids;
  gp.forward = rt.options.forward;

  // Text mode streams tokens as they come (single prompt, served by rank 0).
  std::unique_ptr<StreamDecoder> stream;
  std::function<void(size_t, int32_t)> on_token;
  if (tok && me == 0) {
    stream = std::make_unique<StreamDecoder>(*tok);
    on_token = [&](size_t, int32_t id) {
      std::fputs(stream->push(id).c_str(), stdout);
      std::fflush(stdout);
    };
  }
  auto outs = generate_greedy(*rt.model, *rt.backend, *rt.group, mine, gp, on_token);
  auto all = gather_results(*rt.group, prompts.size(), mine, outs);
  if (me == 0) {
    if (tok) {
      std::fputs(stream->flush().c_str(), stdout);
      std::fputs("\n", stdout);
    } else {
      for (auto& ids : all) std::printf("%s\n", join_ids(ids).c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

Command register_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Greedy decoding from token ids or text");
  auto o = std::make_shared<GenerateOptions>();
  add_run_options(*cmd, o->run);
  cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt as comma-separated token ids; prints the new ids")
      ->each([o](const std::string&) { o->prompt_ids_given = true; });
  cmd->add_option("--prompts-file", o->prompts_file,
                  "File with one comma-separated id list per line; sequences are spread over the ranks, "
                  "results print one line per prompt in input order");
  cmd->add_option("--prompt", o->prompt, "Prompt text (needs tokenizer files in the model folder); prints text")
      ->each([o](const std::string&) { o->prompt_given = true; });
  cmd->add_flag("--chat", o->chat, "Wrap --prompt in the ChatML template");
  cmd->add_option("--system", o->system, "System message for --chat");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "Tokens to generate per prompt")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the eos ids of config.json / generation_config.json");
  return {cmd, [o] { return run_generate(*o); }};
}

}  // namespace epmoe
