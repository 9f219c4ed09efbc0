// The wire formats of `epmoe serve`, apart from HTTP itself: requests of sglang's native
// /generate and of the OpenAI API parsed into ServeRequests (validated field by field, every
// refusal an HttpError naming the field), and the JSON of their responses and stream events.
// Log-probs are fp32 numbers (json_fp32) that dump_json writes as the shortest decimal reading back
// as the same fp32. Every field a client sends is looked up in the route's table of fields
// (protocol.cc): implemented, accepted because it has no effect here (with why), or refused with a
// 400 naming it unless it holds its no-op value; a field in no table is refused too -- nothing a
// client asks for is ignored.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/json_util.h"  // json_fp32, dump_json: log-probs as the shortest fp32 decimals

#include "serve/job.h"
#include "tensor/dtype.h"
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
  // sglang's / vLLM's return_sampling_mask: meta_info.sampling_mask, per output token the ids its
  // draw could have picked (RequestParams::sampling_mask).
  bool return_sampling_mask = false;
  // sglang's return_text_in_logprobs: each [logprob, id, text] entry carries the token's text
  // (the tokenizer's decode of that one id, as sglang's detokenizer gives it) instead of null.
  bool return_text_in_logprobs = false;
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
  // Routing replay on the OpenAI routes (sglang's fields, as on /generate): each choice's
  // `routed_experts` (base64 of int32 [fed tokens - start, moe_layers, top_k]) and epmoe's
  // `routed_expert_weights`, on the response and on a stream's last chunk of the choice.
  bool return_routed_experts = false, return_routed_expert_weights = false;
  int routed_experts_start_len = 0;
  // vLLM's sampling mask: each choice's `sampling_mask`, per token the ids its draw could have
  // picked (RequestParams::sampling_mask), on the response and on a stream's last chunk.
  bool return_sampling_mask = false;
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
// sglang's matched_stop of an OpenAI choice: the stop string or stop token id that ended the
// sample, null otherwise (and while it runs).
nlohmann::json openai_matched_stop(const SampleProgress& s);
// Whether a running sample's last token already ends it (it reached max_new_tokens, is a stop id,
// or completed a stop string): the engine marks it done at the end of its step. A stream holds
// such a token back until then, so that the token, its log-prob and the finish reason go out in
// one chunk -- never a last chunk of empty log-prob arrays.
bool sample_ends_at_last_token(const ServeRequest& r, const SampleProgress& s);
// A finished sample's routing from token `start` on, base64 (sglang's routed_experts layout), and
// the fp32 weights in the same layout.
std::string routed_experts_b64(const SampleProgress& s, int start, const ServedModel& m);
// The sampling mask of a sample (return_sampling_mask): per output token its support, ascending.
nlohmann::json sampling_mask_json(const SampleProgress& s);
std::string routed_weights_b64(const SampleProgress& s, int start, const ServedModel& m);
// Adds a finished choice's routed_experts / routed_expert_weights / sampling_mask where the call
// asked for them.
void add_routing(nlohmann::json& choice, const OpenAICall& call, const SampleProgress& s, const ServedModel& m);
// The whole (non-streamed) response of finished jobs, choice index = prompt * n + sample.
nlohmann::json openai_response(const OpenAICall& call, const std::vector<JobPtr>& jobs, const ServedModel& m);
nlohmann::json openai_usage(const std::vector<JobPtr>& jobs);

// ---- OpenAI Responses API (POST /v1/responses): text in, one assistant message out ----
struct ResponsesCall {
  ServeRequest request;
  bool stream = false;
  std::string model;
  std::string id, message_id;  // resp_..., msg_...
  int64_t created = 0;
  nlohmann::json echo;  // request settings the response object repeats (instructions, max_output_tokens...)
};
ResponsesCall parse_responses(const nlohmann::json& body, const ServedModel& m);
// The response object of a job's one sample: `status` in_progress (the stream's first events, no
// output yet) or, finished, completed / incomplete (max_output_tokens reached) / cancelled (abort).
nlohmann::json responses_object(const ResponsesCall& call, const Job& job, bool finished);
// The finished status of a sample: "completed", "incomplete" or "cancelled".
const char* responses_status(const SampleProgress& s);

// The ChatML prompt of `messages` (system / user / assistant / tool turns), opened for the
// assistant: the template of Qwen models. HttpError when the tokenizer has no <|im_start|>.
std::string chatml_prompt(const nlohmann::json& messages, const Tokenizer& tok);

// ---- tokenizer endpoints (sglang's /tokenize and /detokenize) and model cards ----
// /update_weights_from_disk (sglang's UpdateWeightFromDiskReqInput): each field acts or is refused
// through the field table, as every request body is.
struct UpdateFromDisk {
  std::string model_path;
  std::string weight_version;     // "" keeps the current one
  bool abort_all_requests = false;  // the requests in flight end now instead of finishing first
};
UpdateFromDisk parse_update_from_disk(const nlohmann::json& body);

// /update_weights_from_tensor, epmoe's form: a colocated trainer's tensors shared by CUDA IPC
// handles (sglang's body is torch-pickled, which a C++ server cannot read as sent; docs/serve.md).
// Each tensor: name, dtype (safetensors' spelling or torch's), shape, the base64 of the 64-byte
// cudaIpcMemHandle_t of its allocation (or torch's 66-byte form: a version byte, the kind 'c',
// then the handle) and its byte offset there (torch: `t.untyped_storage()._share_cuda_()[1]`,
// and `[3]` + `t.storage_offset() * t.element_size()`).
struct SharedTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::string handle;  // the handle's 64 bytes
  uint64_t offset = 0;
  size_t bytes() const;
};
struct UpdateFromTensor {
  std::vector<SharedTensor> tensors;
  std::string weight_version;       // "" keeps the current one
  bool commit = true;               // false: staged, as a bucket of /update_weights_from_safetensors
  bool abort_all_requests = false;  // the requests in flight end now instead of finishing first
};
UpdateFromTensor parse_update_from_tensor(const nlohmann::json& body);

// /tokenize {prompt: str | [str]} or {messages} (the chat template of /v1/chat/completions) ->
// {tokens, count, max_model_len}; /detokenize {tokens: [id] | [[id]], skip_special_tokens} -> {text}.
nlohmann::json tokenize(const nlohmann::json& body, const ServedModel& m);
nlohmann::json detokenize(const nlohmann::json& body, const ServedModel& m);
// The OpenAI model object of the served model (/v1/models, /v1/models/{id}).
nlohmann::json model_card(const ServedModel& m);


}  // namespace epmoe
