// `epmoe generate`: greedy decoding or seeded sampling (engine/sampling.h). Prompts come as ids
// (--prompt-ids), as text (--prompt, with --chat for the ChatML template), or one per line of
// --prompts-file (comma-separated ids, or text: a JSON string for text with newlines). Each prompt gives --n samples (sample j uses seed + j);
// sequences are spread over the ranks (sequence i on rank i mod R); results print in input order,
// as ids / text, or with --json one object per (prompt, sample) per line.
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "engine/lockstep.h"
#include "engine/sampling.h"
#include "io/json_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace epmoe {

namespace {

// One line of --json: everything needed to replay and to check the sample.
nlohmann::json json_line(size_t index, int sample, std::optional<uint64_t> seed, const std::vector<int32_t>& prompt,
                         const Generation& g, const Tokenizer* tok, bool logprobs, int top_n) {
  nlohmann::json j;
  j["index"] = index;
  j["sample"] = sample;
  j["seed"] = seed ? nlohmann::json(*seed) : nlohmann::json(nullptr);  // null: greedy, no seed given
  j["prompt_ids"] = prompt;
  j["output_ids"] = g.tokens;
  if (logprobs) {
    nlohmann::json lp = nlohmann::json::array();
    for (float v : g.logprobs) lp.push_back(json_fp32(v));
    j["output_logprobs"] = lp;
  }
  if (top_n > 0) {
    nlohmann::json steps = nlohmann::json::array();
    for (auto& step : g.top) {
      nlohmann::json alts = nlohmann::json::array();
      for (auto& [id, v] : step) alts.push_back({id, json_fp32(v)});
      steps.push_back(alts);
    }
    j["top_logprobs"] = steps;
  }
  j["finish_reason"] = finish_reason_name(g.finish);
  j["cached_tokens"] = g.cached_tokens;  // prompt tokens reused from the prefix cache
  if (tok) j["text"] = tok->decode(g.tokens);
  return j;
}

// A prompt and where it came from (the flag, or file:line), for messages.
struct Prompt {
  std::string source;
  std::vector<int32_t> ids;
  bool text = false;  // given as text: the output is decoded too
};

// A line of --prompts-file: ids when it holds only digits, commas, signs and blanks; else text,
// taken as a JSON string when it starts with a quote (for newlines and escapes), else as is.
bool is_id_line(const std::string& line) {
  return line.find_first_not_of("0123456789,-+ \t") == std::string::npos;
}

std::vector<Prompt> read_prompts_file(const std::string& path, const std::string& model_dir,
                                      std::unique_ptr<Tokenizer>& tok) {
  std::ifstream f(path);
  if (!f) throw InputError(path + ": cannot open prompts file");
  std::vector<Prompt> out;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    n++;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    if (is_id_line(line)) {
      out.push_back({where, parse_ids(line, where)});
      continue;
    }
    std::string text = line;
    if (line.front() == '"') {
      try {
        text = nlohmann::json::parse(line).get<std::string>();
      } catch (const std::exception& e) {
        throw InputError(where + ": a line starting with a quote must be one JSON string (" + e.what() + ")");
      }
    }
    if (!tok) {
      try {
        tok = std::make_unique<Tokenizer>(Tokenizer::load(model_dir));
      } catch (const InputError& e) {
        throw InputError(where + ": a text prompt needs the model's tokenizer files: " + e.what());
      }
    }
    Prompt p{where, tok->encode(text), true};
    if (p.ids.empty()) throw InputError(where + ": the prompt encodes to no tokens");
    out.push_back(std::move(p));
  }
  if (out.empty()) throw InputError(path + ": no prompts");
  return out;
}

}  // namespace

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
    prompts.push_back({"--prompt", tok->encode(text), true});
    if (prompts.back().ids.empty()) throw InputError("--prompt: the prompt encodes to no tokens");
  } else if (o.prompt_ids_given) {
    prompts.push_back({"--prompt-ids", parse_ids(o.prompt_ids, "--prompt-ids")});
  } else {
    prompts = read_prompts_file(o.prompts_file, o.run.model_dir, tok);
  }
  // Every prompt is checked against the model before any rank loads a weight.
  const ModelConfig cfg = load_model_config(o.run.model_dir);
  for (const Prompt& p : prompts) check_prompt(p.ids, cfg, p.source, o.max_new_tokens);
  validate(o.sampling);
  if (o.n < 1) throw InputError("--n " + std::to_string(o.n) + ": at least one sample per prompt");
  if (o.n > 1 && o.sampling.temperature <= 0.0f)
    throw InputError("--n " + std::to_string(o.n) + ": greedy decoding gives one answer; set --temperature > 0");
  RunOptions run = o.run;
  run.max_tokens_per_call = o.max_batch_tokens;  // (0: unbounded) the scheduler never feeds more a step
  Runtime rt = start_runtime(run);
  const int me = rt.group->rank();
  // The seed of sampling: given, or drawn by rank 0 and agreed by every rank (and reported, to
  // replay). Greedy decoding needs none (and makes no collective for it).
  const bool sampling = o.sampling.temperature > 0.0f;
  uint64_t seed = o.seed;
  if (sampling && !o.seed_given) seed = uint64_t(rt.group->allgather_i64(int64_t(fresh_seed()))[0]);
  // Result r = prompt r / n, sample r % n. A prompt's samples stay on one rank: they share its KV
  // blocks (computed once).
  const size_t total = prompts.size() * size_t(o.n);
  std::vector<GenerateRequest> mine;
  std::vector<uint64_t> result_ids;
  for (size_t p : my_share(prompts.size(), *rt.group)) {
    GenerateRequest q;
    q.id = uint64_t(p) * uint64_t(o.n);
    q.prompt = prompts[p].ids;
    q.seed = seed;
    q.n = o.n;
    mine.push_back(std::move(q));
    for (int j = 0; j < o.n; j++) result_ids.push_back(uint64_t(p) * uint64_t(o.n) + uint64_t(j));
  }

  GenerateParams gp;
  gp.max_new_tokens = o.max_new_tokens;
  if (!o.ignore_eos) gp.stop_ids = rt.cfg.eos_token_ids;
  gp.forward = rt.options.forward;
  gp.sampling = o.sampling;
  gp.logprobs = o.logprobs;
  gp.top_logprobs = o.top_logprobs;
  gp.max_batch_tokens = o.max_batch_tokens;
  gp.max_running_requests = o.max_running_requests;
  gp.prefix_cache = !o.no_prefix_cache;

  // Text mode streams tokens as they come (one prompt, one sample, served by rank 0).
  std::unique_ptr<StreamDecoder> stream;
  std::function<void(size_t, int32_t)> on_token;
  if (tok && me == 0 && !o.json && total == 1) {
    stream = std::make_unique<StreamDecoder>(*tok);
    on_token = [&](size_t, int32_t id) {
      std::fputs(stream->push(id).c_str(), stdout);
      std::fflush(stdout);
    };
  }
  auto outs = generate(*rt.model, *rt.backend, *rt.group, mine, gp, on_token);
  auto all = gather_generations(*rt.group, total, result_ids, outs);
  if (me == 0) {
    if (sampling && !o.json) std::fprintf(stderr, "epmoe generate: seed %llu\n", (unsigned long long)seed);
    for (size_t r = 0; r < total; r++) {
      const size_t index = r / size_t(o.n);
      const int sample = int(r % size_t(o.n));
      if (o.json) {
        const std::optional<uint64_t> used =
            sampling || o.seed_given ? std::optional<uint64_t>(seed + uint64_t(sample)) : std::nullopt;
        const Tokenizer* text_of = prompts[index].text ? tok.get() : nullptr;
        // (dump_json: every log-prob as the shortest decimal of its fp32)
        std::printf("%s\n", dump_json(json_line(index, sample, used, prompts[index].ids, all[r], text_of,
                                                o.logprobs, o.top_logprobs))
                               .c_str());
      } else if (stream) {
        std::fputs(stream->flush().c_str(), stdout);
        std::fputs("\n", stdout);
      } else if (prompts[index].text) {
        if (total > 1) std::printf("--- prompt %zu sample %d\n", index, sample);
        std::printf("%s\n", tok->decode(all[r].tokens).c_str());
      } else {
        std::printf("%s\n", join_ids(all[r].tokens).c_str());
      }
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace epmoe
