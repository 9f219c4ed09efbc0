// The subcommands of `epmoe`: what each takes, and the function that runs it (exit code 0;
// errors are thrown as epmoe::Error). cli/flags.cc fills these structs from the command line; the
// commands themselves never see CLI11 (flags.h says why).
#pragma once

#include <cstdint>
#include <string>

#include "cli/options.h"
#include "engine/sampling.h"

namespace epmoe {

struct ScoreOptions {
  RunOptions run;
  std::string ids;
  std::string out;
  float temperature = 1.0f;
};

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
  SamplingParams sampling;
  uint64_t seed = 0;
  bool seed_given = false;
  int n = 1;
  int top_logprobs = 0;  // --logprobs N
  bool logprobs = false;  // --logprobs given
  bool json = false;
  int64_t max_batch_tokens = 0;
  int max_running_requests = 0;
  bool no_prefix_cache = false;
};

struct TokenizeOptions {
  std::string model_dir;
  std::string text;
  bool text_given = false;
  std::string jsonl;
  bool decode = false;
};

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
};

struct SynthOptions {
  std::string like;
  int layers = 0;
  std::string dtype;  // "": the preset's (fp8 with an fp8 quantization_config, else its torch_dtype: f32 or bf16)
  std::string out;
  uint64_t seed = 0;
  double shard_gb = 5.0;
  int threads = 0;  // writers (0: every core); the bytes do not depend on it
};

struct ServeCliOptions {
  RunOptions run;
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string api_key;
  std::string served_model_name;
  std::string weight_version = "default";
  int64_t max_batch_tokens = 2048;
  int max_running_requests = 256;
  bool no_prefix_cache = false;
  int http_threads = 0;
  int64_t max_body_mb = 64;
  double heartbeat = 1.0;
  bool enable_routed_experts = false;  // --enable-return-routed-experts
  std::string dp_attention = "on";     // --dp-attention on|off: requests spread over the ranks
};

int run_info(const RunOptions& o);  // reads only --model
int run_score(const ScoreOptions& o);
int run_generate(const GenerateOptions& o);
int run_tokenize(const TokenizeOptions& o);
int run_check_command(const CheckCliOptions& o);
int run_synth(const SynthOptions& o);
int run_serve(const ServeCliOptions& o);

}  // namespace epmoe
