// The wire formats of `epmoe serve`, apart from HTTP itself: requests of sglang's native
// /generate and of the OpenAI API parsed into ServeRequests (validated field by field, every
// refusal an HttpError naming the field), and the JSON of their responses and stream events.
// Log-probs are written with json_float: the shortest decimal that reads back as the same fp32.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/job.h"
#include "tokenizer/tokenizer.h"

namespace epmoe {

// A refusal the client caused: HTTP status, and the request field at fault ("" for none).
struct HttpError : std::runtime_error {
  HttpError(int status_, std::string field_, const std::string& message)
      : std::runtime_error(message), status(status_), field(std::move(field_)) {}
  int status;
  std::string field;
};

// The JSON body of an error: {"error": {"message", "type", "param", "code"}} (OpenAI's shape,
// which sglang's clients read too).
nlohmann::json error_body(int status, const std::string& message, const std::string& field = "");

// What the protocol needs to know of the model being served.
struct ServedModel {
  std::string name;        // --served-model-name (the folder's name by default)
  std::string path;
  int vocab_size = 0;
  int max_positions = 0;   // max_position_embeddings
  std::vector<int> eos_ids;
  const Tokenizer* tokenizer = nullptr;  // null: ids only
  int max_top_logprobs = 20;
  // Routing replay (--enable-return-routed-experts): return_routed_experts is accepted, and the
  // shape of what it returns ([tokens][moe_layers][top_k]).
  bool routed_experts = false;
  int moe_layers = 0, top_k = 0;
};

// ---- sglang's native /generate ----
struct NativeCall {
  std::vector<ServeRequest> requests;  // one per prompt (n samples each)
  bool batch = false;                  // text / input_ids was a list of prompts: the reply is a list
  bool stream = false;
  bool return_logprob = false;
  int logprob_start_len = -1;
  int top_logprobs_num = 0;
  // sglang's routing replay fields: meta_info.routed_experts (base64 of int32 [seq_len - 1 - start,
  // moe_layers, top_k]), from token routed_experts_start_len on; epmoe's routed_expert_weights
  // (base64 of the fp32 weights in the same layout) with return_routed_expert_weights.
  bool return_routed_experts = false;
  bool return_routed_expert_weights = false;
  int routed_experts_start_len = 0;
};
NativeCall parse_generate(const nlohmann::json& body, const ServedModel& m);
// {text, output_ids, meta_info} of sample j of a finished (or, streaming, running) job; `index`
// (with several prompts or samples) is its place in the call's flat list: prompt * n + sample.
nlohmann::json native_result(const Job& job, size_t sample, const NativeCall& call, const ServedModel& m,
                             size_t index = 0);

// ---- OpenAI ----
struct OpenAICall {
  std::vector<ServeRequest> requests;  // one per prompt (n samples each)
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  int logprobs = -1;      // completions: `logprobs` N (-1: none); chat: top_logprobs when logprobs true
  // vLLM's return_token_ids: each choice's `token_ids` (a stream chunk: its new ids) and the
  // prompt's `prompt_token_ids` (completions: per choice; chat: on the response, the ChatML ids).
  bool return_token_ids = false;
  std::string model;
  std::string id;         // cmpl-... / chatcmpl-...
  int64_t created = 0;
};
OpenAICall parse_completion(const nlohmann::json& body, const ServedModel& m);
OpenAICall parse_chat(const nlohmann::json& body, const ServedModel& m);

// The logprobs object of `n` tokens from token `from` of a sample (completions or chat shape).
nlohmann::json openai_logprobs(const SampleProgress& s, size_t from, size_t n, bool chat, int top,
                               const ServedModel& m, int64_t text_offset_base = 0);
// finish_reason of a finished sample ("stop", "length", "abort").
nlohmann::json openai_finish(const SampleProgress& s);
// The whole (non-streamed) response of finished jobs, choice index = prompt * n + sample.
nlohmann::json openai_response(const OpenAICall& call, const std::vector<JobPtr>& jobs, const ServedModel& m);
nlohmann::json openai_usage(const std::vector<JobPtr>& jobs);

// The ChatML prompt of `messages` (system / user / assistant / tool turns), opened for the
// assistant: the template of Qwen models. HttpError when the tokenizer has no <|im_start|>.
std::string chatml_prompt(const nlohmann::json& messages, const Tokenizer& tok);

// A JSON document as bytes: invalid UTF-8 (a token's raw bytes) becomes U+FFFD.
std::string dump_json(const nlohmann::json& j);

}  // namespace epmoe
