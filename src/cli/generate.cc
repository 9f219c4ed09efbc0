// `epmoe generate`: greedy decoding. Prompts come as ids (--prompt-ids, or --prompts-file with one
// comma-separated list per line) or as text (--prompt, with --chat for the ChatML template).
// Sequences are spread over the ranks (sequence i on rank i mod R); results print in input order.
#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "cli/options.h"
#include "model/generate.h"
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

// Gathers every rank's results on all ranks, indexed by request id.
std::vector<std::vector<int32_t>> gather_results(MpiGroup& comm, size_t total,
                                                 const std::vector<GenerateRequest>& mine,
                                                 const std::vector<std::vector<int32_t>>& outs) {
  // Pack as [id, n, tokens...] records.
  std::vector<int32_t> packed;
  for (size_t i = 0; i < mine.size(); i++) {
    packed.push_back(int32_t(mine[i].id));
    packed.push_back(int32_t(outs[i].size()));
    packed.insert(packed.end(), outs[i].begin(), outs[i].end());
  }
  const int R = comm.size();
  int64_t my = int64_t(packed.size());
  std::vector<int64_t> sizes(static_cast<size_t>(R));
  comm.allgather(&my, sizeof my, sizes.data());
  std::vector<size_t> bytes(static_cast<size_t>(R));
  size_t all = 0;
  for (int r = 0; r < R; r++) all += (bytes[size_t(r)] = size_t(sizes[size_t(r)]) * sizeof(int32_t));
  std::vector<int32_t> recv(all / sizeof(int32_t));
  comm.allgatherv(packed.data(), packed.size() * sizeof(int32_t), recv.data(), bytes);
  std::vector<std::vector<int32_t>> res(total);
  for (size_t i = 0; i < recv.size();) {
    const size_t id = size_t(recv[i]), n = size_t(recv[i + 1]);
    res[id].assign(recv.begin() + long(i) + 2, recv.begin() + long(i + 2 + n));
    i += 2 + n;
  }
  return res;
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
  if (use_cuda(o.run)) {
#ifdef EPMOE_HAVE_CUDA
    // The GPU path: greedy on every rank's prompts, results on every rank; rank 0 prints them
    // (text mode prints the decoded text at the end, not streamed).
    std::vector<std::vector<int32_t>> ids;
    for (const Prompt& p : prompts) ids.push_back(p.ids);
    int rank = 0;
    auto all = cuda::cuda_generate(cuda_options(o.run), ids, o.max_new_tokens,
                                   o.ignore_eos ? std::vector<int>{} : cfg.eos_token_ids, &rank);
    if (rank == 0) {
      if (tok) {
        std::printf("%s\n", tok->decode(all[0]).c_str());
      } else {
        for (auto& v : all) std::printf("%s\n", join_ids(v).c_str());
      }
      std::fflush(stdout);
    }
#endif
    return 0;
  }

  Runtime rt = make_runtime(o.run);
  const int R = rt.comm->size(), me = rt.comm->rank();
  std::vector<GenerateRequest> mine;
  for (size_t i = 0; i < prompts.size(); i++)
    if (int(i % size_t(R)) == me) mine.push_back({uint64_t(i), prompts[i].ids});

  GenerateParams gp;
  gp.max_new_tokens = o.max_new_tokens;
  if (!o.ignore_eos) gp.stop_ids = rt.cfg.eos_token_ids;
  gp.forward.check_numerics = o.run.check_numerics;

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
  auto outs = generate_greedy(*rt.model, *rt.backend, *rt.comm, mine, gp, on_token);
  auto all = gather_results(*rt.comm, prompts.size(), mine, outs);
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
  add_device_options(*cmd, o->run);
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
