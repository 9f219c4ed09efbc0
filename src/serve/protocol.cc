#include "serve/protocol.h"

#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <span>

#include "engine/sampling.h"
#include "io/json_util.h"
#include "tensor/ipc_import.h"
#include "util/error.h"

namespace epmoe {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& message) {
  throw HttpError(400, field, field.empty() ? message : field + ": " + message);
}

// Typed reads of one JSON object's fields; a refusal names the field (with its path, e.g.
// "sampling_params.temperature"). A field given as null counts as absent, as in Python clients.
class Fields {
 public:
  Fields(const json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {
    if (!obj_.is_object()) bad(prefix_.empty() ? "body" : prefix_.substr(0, prefix_.size() - 1), "must be a JSON object");
  }
  std::string name(const char* k) const { return prefix_ + k; }
  const json* get(const char* k) const {
    auto it = obj_.find(k);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<bool> boolean(const char* k) const {
    const json* v = get(k);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) bad(name(k), "must be true or false");
    return v->get<bool>();
  }
  std::optional<int64_t> integer(const char* k, int64_t lo, int64_t hi) const {
    const json* v = get(k);
    if (!v) return std::nullopt;
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (d != std::floor(d)) bad(name(k), "must be an integer, got " + v->dump());
      if (d < double(lo) || d > double(hi)) bad(name(k), range(lo, hi, v->dump()));
      return int64_t(d);
    }
    if (!v->is_number_integer()) bad(name(k), "must be an integer, got " + v->dump());
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) bad(name(k), range(lo, hi, v->dump()));
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi) bad(name(k), range(lo, hi, v->dump()));
    return x;
  }
  // A seed: an integer in [0, 2^64 - 1] (the range of the seeds the server reports, so any
  // reported seed replays). A negative one is refused rather than wrapped.
  std::optional<uint64_t> seed(const char* k) const {
    const json* v = get(k);
    if (!v) return std::nullopt;
    const char* range = "must be an integer in [0, 18446744073709551615], got ";
    if (v->is_number_unsigned()) return v->get<uint64_t>();
    if (v->is_number_integer()) {
      if (v->get<int64_t>() < 0) bad(name(k), range + v->dump());
      return uint64_t(v->get<int64_t>());
    }
    if (v->is_number_float()) {
      const double d = v->get<double>();
      // (2^64 is exactly representable; below it every integral double converts exactly)
      if (d == std::floor(d) && d >= 0 && d < 18446744073709551616.0) return uint64_t(d);
    }
    bad(name(k), range + v->dump());
  }
  std::optional<double> number(const char* k, double lo, double hi) const {
    const json* v = get(k);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(name(k), "must be a number, got " + v->dump());
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) bad(name(k), "must be in [" + fmt(lo) + ", " + fmt(hi) + "], got " + v->dump());
    return x;
  }
  std::optional<std::string> string(const char* k) const {
    const json* v = get(k);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad(name(k), "must be a string");
    return v->get<std::string>();
  }
  // A string or a list of strings.
  std::vector<std::string> strings(const char* k) const {
    const json* v = get(k);
    if (!v) return {};
    if (v->is_string()) return {v->get<std::string>()};
    if (!v->is_array()) bad(name(k), "must be a string or a list of strings");
    std::vector<std::string> out;
    for (auto& s : *v) {
      if (!s.is_string()) bad(name(k), "must be a string or a list of strings");
      if (s.get<std::string>().empty()) bad(name(k), "a stop string may not be empty");
      out.push_back(s.get<std::string>());
    }
    return out;
  }

 private:
  static std::string fmt(double d) {
    json j = d;
    return j.dump();
  }
  static std::string range(int64_t lo, int64_t hi, const std::string& got) {
    return "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + got;
  }
  const json& obj_;
  std::string prefix_;
};


// ---- the fields of each request object, and what epmoe does with each ----
//
// Implemented: parsed below. NoOp: accepted whatever its value, because here it changes nothing
// (the note says why). Refused: a 400 naming the field (the note is the message), unless the value
// is its no-op one -- null, or `neutral` (a JSON text; a list means any of its items), or, without
// `neutral`, false / 0 / "" / [] / {} -- so that clients sending defaults (AReaL's
// frequency_penalty 0, a `tools: []`) keep working. A field in no table is refused as unknown: the
// OpenAI API refuses unknown parameters, and an ignored typo (`max_token`) would silently change
// what a client gets. The lists follow sglang's GenerateReqInput / SamplingParams /
// CompletionRequest / ChatCompletionRequest and OpenAI's request schemas (docs/serve.md's tables).
enum class Support { Implemented, NoOp, Refused };
struct FieldRule {
  const char* name;
  Support support;
  const char* note = "";
  const char* neutral = nullptr;
};
using Rules = std::span<const FieldRule>;

constexpr Support I = Support::Implemented, N = Support::NoOp, R = Support::Refused;
constexpr const char* kNoMultimodal = "is not supported: epmoe serves text-only models";
constexpr const char* kNoGrammar =
    "is not supported: no constrained decoding (regex / JSON schema / EBNF) yet; the scheduler's sampling has no "
    "grammar mask";
constexpr const char* kNoLora = "is not supported: no LoRA adapters";
constexpr const char* kNoDisagg = "is not supported: no prefill/decode disaggregation or data-parallel routing";
constexpr const char* kNoCustomLogits = "is not supported: no custom logit processors or custom parameters";
constexpr const char* kNoSession = "is not supported: no sessions (send the whole prompt)";
constexpr const char* kNoCacheKey = "is not supported: the prefix cache has one namespace";
constexpr const char* kNoPriority = "is not supported: requests are admitted in arrival order";
constexpr const char* kNoHidden = "is not supported: hidden states are not returned";
constexpr const char* kNoTools = "is not supported: no tool calls (the ChatML template renders no tools)";
constexpr const char* kNoReasoning = "is not supported: no reasoning parser or thinking budget";
constexpr const char* kNoStopRegex = "is not supported: stop strings only (`stop`)";
constexpr const char* kSpacesNoOp =
    "no effect with tokenizer.json tokenizers (as in sglang and transformers' fast tokenizers)";

constexpr FieldRule kGenerateFields[] = {
    {"text", I}, {"input_ids", I}, {"sampling_params", I}, {"rid", I}, {"stream", I}, {"return_logprob", I},
    {"logprob_start_len", I}, {"top_logprobs_num", I}, {"return_text_in_logprobs", I},
    {"return_routed_experts", I}, {"routed_experts_start_len", I}, {"return_routed_expert_weights", I},
    {"no_logs", N, "epmoe logs no request contents"},
    {"token_ids_logprob", I},
    {"return_sampling_mask", I},
    {"return_flat_raw_top_logprobs", R, "is not supported: log-probs come as [logprob, id, text] lists"},
    {"return_flat_raw_top_logprobs_b64", R, "is not supported: log-probs come as [logprob, id, text] lists"},
    {"return_hidden_states", R, kNoHidden},
    {"return_indexer_topk", R, "is not supported"},
    {"return_entropy", R, "is not supported"},
    {"return_prompt_token_ids", R, "is not supported (the prompt is meta_info.prompt_tokens ids long)"},
    {"return_bytes", R, "is not supported"},
    {"input_embeds", R, "is not supported: give text or input_ids"},
    {"image_data", R, kNoMultimodal}, {"video_data", R, kNoMultimodal}, {"audio_data", R, kNoMultimodal},
    {"mm_hashes", R, kNoMultimodal}, {"mm_content_hashes", R, kNoMultimodal},
    {"use_audio_in_video", R, kNoMultimodal}, {"video_config", R, kNoMultimodal}, {"modalities", R, kNoMultimodal},
    {"max_dynamic_patch", R, kNoMultimodal}, {"min_dynamic_patch", R, kNoMultimodal},
    {"image_max_dynamic_patch", R, kNoMultimodal}, {"video_max_dynamic_patch", R, kNoMultimodal},
    {"images_config", R, kNoMultimodal}, {"need_wait_for_mm_inputs", R, kNoMultimodal},
    {"num_items_assigned", R, kNoMultimodal}, {"encoder_urls", R, kNoMultimodal},
    {"session_id", R, kNoSession}, {"session_params", R, kNoSession}, {"conversation_id", R, kNoSession},
    {"lora_path", R, kNoLora}, {"lora_id", R, kNoLora},
    {"custom_logit_processor", R, kNoCustomLogits}, {"positional_embed_overrides", R, "is not supported"},
    {"bootstrap_host", R, kNoDisagg}, {"bootstrap_port", R, kNoDisagg}, {"bootstrap_room", R, kNoDisagg},
    {"bootstrap_pair_key", R, kNoDisagg}, {"decode_tp_size", R, kNoDisagg}, {"routed_dp_rank", R, kNoDisagg},
    {"data_parallel_rank", R, kNoDisagg}, {"disagg_prefill_dp_rank", R, kNoDisagg},
    {"kv_router_hint", R, kNoDisagg}, {"routing_key", R, kNoDisagg}, {"http_worker_ipc", R, kNoDisagg},
    {"background", R, "is not supported: requests run while their connection waits"},
    {"require_reasoning", R, kNoReasoning}, {"max_thinking_tokens", R, kNoReasoning},
    {"priority", R, kNoPriority}, {"extra_key", R, kNoCacheKey}, {"cache_salt", R, kNoCacheKey},
    {"custom_labels", R, "is not supported: the metrics have no per-request labels"},
    {"log_metrics", R, "is not supported: every request but /health_generate's is counted in /metrics", "true"},
    {"external_trace_header", R, "is not supported: no tracing"},
    {"received_time", R, "is not supported: the server times requests from their arrival"},
    {"multi_item_delimiter_indices", R, "is not supported: no multi-item scoring"},
};

constexpr FieldRule kSamplingFields[] = {
    {"max_new_tokens", I}, {"stop", I}, {"stop_token_ids", I}, {"temperature", I}, {"top_p", I}, {"top_k", I},
    {"min_p", I}, {"n", I}, {"ignore_eos", I}, {"skip_special_tokens", I}, {"no_stop_trim", I},
    {"sampling_seed", I},
    {"spaces_between_special_tokens", N, kSpacesNoOp},
    {"stop_regex", R, kNoStopRegex},
    {"frequency_penalty", I}, {"presence_penalty", I}, {"repetition_penalty", I}, {"min_new_tokens", I},
    {"json_schema", R, kNoGrammar}, {"regex", R, kNoGrammar}, {"ebnf", R, kNoGrammar},
    {"structural_tag", R, kNoGrammar},
    {"custom_params", R, kNoCustomLogits},
    {"stream_interval", R, "is not supported (only 1): a stream sends every token as it comes", "1"},
    {"logit_bias", I},
};

// Fields of both OpenAI routes (OpenAI's own, then sglang's extensions).
#define EPMOE_OPENAI_COMMON_FIELDS                                                                               \
  {"model", I}, {"n", I}, {"seed", I}, {"stop", I}, {"stream", I}, {"stream_options", I}, {"temperature", I},   \
      {"top_p", I}, {"top_k", I}, {"min_p", I}, {"stop_token_ids", I}, {"no_stop_trim", I}, {"ignore_eos", I},  \
      {"skip_special_tokens", I}, {"return_token_ids", I}, {"rid", I},                                          \
      {"user", N, "an end-user id for the provider's monitoring: it changes no output"},                         \
      {"frequency_penalty", I}, {"presence_penalty", I}, {"repetition_penalty", I}, {"logit_bias", I},          \
      {"min_tokens", I}, {"regex", R, kNoGrammar}, {"ebnf", R, kNoGrammar},                                     \
      {"stop_regex", R, kNoStopRegex},                                                                          \
      {"response_format", R, "is not supported: no constrained decoding (only {\"type\": \"text\"})",           \
       R"({"type": "text"})"},                                                                                   \
      {"return_hidden_states", R, kNoHidden},                                                                   \
      {"return_routed_experts", I}, {"routed_experts_start_len", I}, {"return_routed_expert_weights", I},        \
      {"return_sampling_mask", I},                                                                              \
      {"return_cached_tokens_details", R, "is not supported: usage.prompt_tokens_details.cached_tokens only"},  \
      {"lora_path", R, kNoLora}, {"session_id", R, kNoSession}, {"session_params", R, kNoSession},              \
      {"custom_params", R, kNoCustomLogits}, {"custom_logit_processor", R, kNoCustomLogits},                    \
      {"images_config", R, kNoMultimodal}, {"bootstrap_host", R, kNoDisagg}, {"bootstrap_port", R, kNoDisagg}, \
      {"bootstrap_room", R, kNoDisagg}, {"routed_dp_rank", R, kNoDisagg},                                       \
      {"disagg_prefill_dp_rank", R, kNoDisagg}, {"data_parallel_rank", R, kNoDisagg},                           \
      {"extra_key", R, kNoCacheKey}, {"cache_salt", R, kNoCacheKey}, {"ngram_corpus_id", R, "is not supported"}, \
      {"priority", R, kNoPriority},                                                                             \
      {"custom_labels", R, "is not supported: the metrics have no per-request labels"},                         \
      {"metadata", R, "is not supported: completions are not stored"},                                          \
      {"store", R, "is not supported: completions are not stored"},                                             \
      {"service_tier", R, "is not supported (only auto / default)", R"(["auto", "default"])"},                  \
      {"safety_identifier", N, "an end-user id for the provider's monitoring: it changes no output"},           \
      {"prompt_cache_key", N, "a routing hint for the provider's cache: the prefix cache here matches any prompt"}

constexpr FieldRule kCompletionFields[] = {
    EPMOE_OPENAI_COMMON_FIELDS,
    {"prompt", I}, {"max_tokens", I}, {"logprobs", I}, {"best_of", I},
    {"echo", R, "is not supported"},
    {"suffix", R, "is not supported"},
    {"json_schema", R, kNoGrammar},
};

constexpr FieldRule kChatFields[] = {
    EPMOE_OPENAI_COMMON_FIELDS,
    {"messages", I}, {"max_tokens", I}, {"max_completion_tokens", I}, {"logprobs", I}, {"top_logprobs", I},
    {"separate_reasoning", N, "no reasoning parser: the content is never split"},
    {"stream_reasoning", N, "no reasoning parser: the content is never split"},
    {"parallel_tool_calls", N, "no tools are accepted, so no tool calls to run in parallel"},
    {"tools", R, kNoTools},
    {"tool_choice", R, kNoTools, R"(["none", "auto"])"},
    {"functions", R, kNoTools}, {"function_call", R, kNoTools, R"(["none", "auto"])"},
    {"reasoning_effort", R, kNoReasoning}, {"reasoning", R, kNoReasoning}, {"verbosity", R, kNoReasoning},
    {"task", R, "is not supported"},
    {"continue_final_message", R, "is not supported: the template always opens a new assistant turn"},
    {"chat_template_kwargs", R, "is not supported: the ChatML template takes no arguments"},
    {"return_prompt_token_ids", R, "is not supported: use return_token_ids (prompt_token_ids on the response)"},
    {"return_meta_info", R, "is not supported"},
    {"max_dynamic_patch", R, kNoMultimodal}, {"min_dynamic_patch", R, kNoMultimodal},
    {"use_audio_in_video", R, kNoMultimodal}, {"modalities", R, kNoMultimodal, R"([["text"]])"},
    {"audio", R, kNoMultimodal},
    {"prediction", R, "is not supported: no predicted outputs"},
    {"web_search_options", R, "is not supported: no web search"},
    {"input_ids", R, "is not supported on chat: use /v1/completions with token ids"},
};
#undef EPMOE_OPENAI_COMMON_FIELDS

constexpr FieldRule kStreamOptionsFields[] = {
    {"include_usage", I},
    {"continuous_usage_stats", R, "is not supported: usage comes in the last chunk (include_usage)"},
    {"include_obfuscation", R, "is not supported"},
};

constexpr FieldRule kMessageFields[] = {
    {"role", I}, {"content", I},
    {"name", R, "is not supported: the ChatML template has no participant names"},
    {"tool_calls", R, kNoTools}, {"tool_call_id", R, kNoTools}, {"tools", R, kNoTools},
    {"reasoning_content", R, kNoReasoning},
    {"refusal", R, "is not supported"},
    {"audio", R, kNoMultimodal},
    {"function_call", R, kNoTools},
};

constexpr FieldRule kContentPartFields[] = {{"type", I}, {"text", I}};

constexpr FieldRule kTokenizeFields[] = {
    {"model", I}, {"prompt", I}, {"messages", I},
    {"add_special_tokens", R, "is not supported (only true): prompts are encoded as tokenizer(text)", "true"},
    {"tools", R, kNoTools}, {"tool_choice", R, kNoTools, R"(["none", "auto"])"},
    {"reasoning_effort", R, kNoReasoning},
    {"continue_final_message", R, "is not supported: the template always opens a new assistant turn"},
    {"chat_template_kwargs", R, "is not supported: the ChatML template takes no arguments"},
};

constexpr FieldRule kDetokenizeFields[] = {{"model", I}, {"tokens", I}, {"skip_special_tokens", I}};

constexpr FieldRule kUpdateFromDiskFields[] = {
    {"model_path", I}, {"weight_version", I}, {"abort_all_requests", I},
    {"flush_cache", N, "the new weights start with an empty prefix cache either way"},
    {"load_format", R, "is not supported: only auto / safetensors (the checkpoint's safetensors files)",
     R"(["auto", "safetensors"])"},
    {"is_async", R, "is not supported (only false): the update applies between steps"},
    {"torch_empty_cache", R, "is not supported (only false)"},
    {"keep_pause", R, "is not supported (only false)"},
    {"recapture_cuda_graph", R, "is not supported (only false)"},
    {"token_step", R, "is not supported"},
};

constexpr FieldRule kUpdateFromTensorFields[] = {
    {"named_tensors", I}, {"weight_version", I}, {"abort_all_requests", I}, {"commit", I},
    {"flush_cache", N, "the new weights start with an empty prefix cache either way"},
    {"serialized_named_tensors", R,
     "is not readable here: sglang's form is torch-pickled (MultiprocessingSerializer); send named_tensors, each "
     "tensor's CUDA IPC handle, dtype, shape and offset (docs/serve.md, \"Weight sync from the trainer\")"},
    {"load_format", R, "is not supported: only cuda_ipc (named_tensors)", R"(["cuda_ipc"])"},
};

constexpr FieldRule kSharedTensorFields[] = {{"name", I}, {"dtype", I}, {"shape", I}, {"ipc_handle", I}, {"offset", I}};

bool is_neutral(const FieldRule& r, const json& v) {
  if (v.is_null()) return true;
  if (r.neutral) {
    const json n = json::parse(r.neutral);
    if (n.is_array()) {
      for (const json& x : n)
        if (x == v) return true;
      return false;
    }
    return n == v;
  }
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_number()) return v.get<double>() == 0.0;
  if (v.is_string() || v.is_array() || v.is_object()) return v.empty();
  return false;
}

// Refuses, naming it, the first field of `obj` that is unknown or refused with an effective value.
void check_fields(const json& obj, const std::string& prefix, Rules rules, const char* where) {
  if (!obj.is_object()) return;  // (the typed reads say what it should be)
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const FieldRule* rule = nullptr;
    for (const FieldRule& r : rules)
      if (it.key() == r.name) rule = &r;
    if (!rule)
      bad(prefix + it.key(), std::string("is not a field of ") + where +
                                 " (unknown fields are refused rather than ignored; docs/serve.md lists the fields)");
    if (rule->support == Support::Refused && !is_neutral(*rule, it.value())) bad(prefix + it.key(), rule->note);
  }
}

// The sampling settings common to both APIs, before they become a RequestParams.
struct SamplingSpec {
  int64_t max_new_tokens = 128;
  std::string max_field = "max_new_tokens";
  bool max_given = false;  // a default is cut to the context left after the prompt
  double temperature = 1.0, top_p = 1.0, min_p = 0.0;
  int64_t top_k = -1;
  std::vector<std::string> stop;
  std::vector<int> stop_ids;
  bool ignore_eos = false;
  int64_t n = 1;
  std::optional<uint64_t> seed;
  bool skip_special = true, no_stop_trim = false;
  bool logprobs = false;
  int top_logprobs = 0;
  int input_from = -1;
  bool routed_experts = false;
  bool sampling_mask = false;  // return_sampling_mask
  LogitProcessing processing;  // penalties, logit_bias, min_new_tokens (engine/sampling.h)
  std::vector<int32_t> logprob_ids;  // token_ids_logprob
  std::string min_field = "min_new_tokens";  // the minimum's field, for its message
};

// return_sampling_mask (both APIs): a sampled request must bound its support with top_k.
void sampling_mask_of(bool asked, SamplingSpec& s) {
  s.sampling_mask = asked;
  if (asked && s.temperature > 0.0 && !(s.top_k > 0 && s.top_k <= kMaxSamplingMaskIds))
    bad("return_sampling_mask", "with temperature > 0 needs top_k in 1.." + std::to_string(kMaxSamplingMaskIds) +
                                    " (without it the support can be the whole vocabulary)");
}

// Standard base64 of raw bytes (OpenSSL's encoder; sglang sends routed_experts this way).
std::string base64(const void* data, size_t n) {
  std::string out(4 * ((n + 2) / 3), '\0');
  const int w = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), static_cast<const unsigned char*>(data),
                                int(n));
  out.resize(size_t(w));
  return out;
}

std::vector<int32_t> ids_of(const json& v, const std::string& field, const ServedModel& m) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); i++) {
    const json& x = v[i];
    if (!x.is_number_integer()) bad(field, "token " + std::to_string(i) + " is not an integer: " + x.dump());
    const int64_t id = x.get<int64_t>();
    if (id < 0 || id >= m.vocab_size)
      bad(field, "token " + std::to_string(i) + " = " + std::to_string(id) + " is outside the vocabulary [0, " +
                     std::to_string(m.vocab_size) + ")");
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::vector<int32_t> encode(const std::string& text, const std::string& field, const ServedModel& m) {
  if (!m.tokenizer) bad(field, "this model has no tokenizer files; send token ids");
  std::vector<int32_t> ids = m.tokenizer->encode(text);
  for (int32_t id : ids)
    if (id >= m.vocab_size)
      bad(field, "the text encodes to id " + std::to_string(id) + ", outside the model's vocabulary of " +
                     std::to_string(m.vocab_size));
  return ids;
}

// logit_bias: {"token id": bias, ...} (OpenAI's and sglang's shape), each bias in [-100, 100].
std::vector<std::pair<int32_t, float>> logit_bias_of(const json& v, const std::string& field, const ServedModel& m) {
  if (!v.is_object()) bad(field, "must be an object of token id (a string) -> bias");
  std::vector<std::pair<int32_t, float>> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& k = it.key();
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
    if (ec != std::errc() || end != k.data() + k.size() || k.empty())
      bad(field, "key '" + k + "' is not a token id");
    if (id < 0 || id >= m.vocab_size)
      bad(field, "token " + k + " is outside the vocabulary [0, " + std::to_string(m.vocab_size) + ")");
    if (!it.value().is_number()) bad(field, "the bias of token " + k + " is not a number");
    const double b = it.value().get<double>();
    if (!(b >= -100 && b <= 100)) bad(field, "the bias of token " + k + " must be in [-100, 100]");
    out.push_back({int32_t(id), float(b)});
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The penalties, bias and minimum length of one request object (`f`; the minimum under `min_key`).
LogitProcessing processing_of(const Fields& f, const char* min_key, const ServedModel& m) {
  LogitProcessing p;
  p.frequency_penalty = float(f.number("frequency_penalty", -2, 2).value_or(0.0));
  p.presence_penalty = float(f.number("presence_penalty", -2, 2).value_or(0.0));
  p.repetition_penalty = float(f.number("repetition_penalty", 1e-6, 2).value_or(1.0));
  p.min_new_tokens = int(f.integer(min_key, 0, INT32_MAX).value_or(0));
  if (const json* b = f.get("logit_bias"); b && !b->is_null()) p.logit_bias = logit_bias_of(*b, f.name("logit_bias"), m);
  return p;
}

// A prompt and its settings as one ServeRequest (the checks that need both: the context length).
ServeRequest make_request(std::vector<int32_t> prompt, const std::string& prompt_field, const SamplingSpec& spec,
                          std::string rid, const ServedModel& m) {
  if (prompt.empty()) bad(prompt_field, "the prompt is empty (at least one token)");
  const int64_t P = int64_t(prompt.size());
  if (P > m.max_positions)
    bad(prompt_field, std::to_string(P) + " prompt tokens exceed the model's context of " +
                          std::to_string(m.max_positions) + " positions (max_position_embeddings)");
  if (P + spec.max_new_tokens - 1 > m.max_positions && spec.max_given)
    bad(spec.max_field, std::to_string(P) + " prompt tokens + " + std::to_string(spec.max_new_tokens) +
                         " new tokens exceed the model's context of " + std::to_string(m.max_positions) +
                         " positions");
  SamplingSpec s = spec;
  if (!s.max_given) s.max_new_tokens = std::max<int64_t>(0, std::min<int64_t>(s.max_new_tokens, m.max_positions - P + 1));
  ServeRequest r;
  r.rid = std::move(rid);
  r.prompt = std::move(prompt);
  r.params.max_new_tokens = int(s.max_new_tokens);
  r.params.sampling.temperature = float(s.temperature);
  r.params.sampling.top_p = float(s.top_p);
  r.params.sampling.top_k = int(s.top_k);
  r.params.sampling.min_p = float(s.min_p);
  try {
    validate(r.params.sampling);
  } catch (const InputError& e) {
    bad("sampling_params", e.what());
  }
  r.params.stop_ids = s.stop_ids;
  if (!s.ignore_eos)
    for (int e : m.eos_ids) r.params.stop_ids.push_back(e);
  r.params.processing = s.processing;
  r.params.logprob_ids = s.logprob_ids;
  if (s.processing.min_new_tokens > s.max_new_tokens)
    bad(s.min_field, std::to_string(s.processing.min_new_tokens) + " is more than " + s.max_field + " (" +
                         std::to_string(s.max_new_tokens) + ")");
  r.params.logprobs = s.logprobs;
  r.params.top_logprobs = s.top_logprobs;
  r.params.input_logprobs_from = s.input_from;
  r.params.routed_experts = s.routed_experts;
  r.params.sampling_mask = s.sampling_mask;
  const bool sampled = s.temperature > 0;
  r.seed = s.seed ? *s.seed : sampled ? fresh_seed() : 0;
  r.seed_reported = sampled || s.seed.has_value();
  r.n = int(s.n);
  r.stop_strings = s.stop;
  r.skip_special_tokens = s.skip_special;
  r.no_stop_trim = s.no_stop_trim;
  return r;
}

std::string make_id(const char* prefix) {
  static const char* hex = "0123456789abcdef";
  std::random_device rd;
  std::string s = prefix;
  for (int i = 0; i < 24; i++) s += hex[rd() & 15];
  return s;
}

// [logprob, id, text]: the text is sglang's, the tokenizer's decode of the one id (a piece of a
// UTF-8 character reads U+FFFD), when return_text_in_logprobs asked for it.
json logprob_triple(float lp, int32_t id, bool with_text, const ServedModel& m) {
  json t = json::array({json_fp32(lp), id, nullptr});
  if (with_text && m.tokenizer) t[2] = m.tokenizer->decode({id});
  return t;
}

std::string token_text(int32_t id, const ServedModel& m) {
  return m.tokenizer ? std::string(m.tokenizer->token_bytes(id)) : std::string();
}

}  // namespace

json error_body(int status, const std::string& message, const std::string& field) {
  const char* type = status == 401 ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  json e = {{"message", message}, {"type", type}, {"code", status}};
  e["param"] = field.empty() ? json(nullptr) : json(field);
  return {{"error", e}};
}

// ---------------------------------------------------------------- tokenizer endpoints

namespace {

const Tokenizer& need_tokenizer(const ServedModel& m, const char* field) {
  if (!m.tokenizer) throw HttpError(400, field, std::string(field) + ": this model has no tokenizer files");
  return *m.tokenizer;
}

void check_model_name(const Fields& f, const ServedModel& m) {
  const std::string model = f.string("model").value_or(m.name);
  if (model != m.name && model != m.path && model != "default")
    throw HttpError(400, "model", "model: '" + model + "' is not served here (this server serves '" + m.name + "')");
}

}  // namespace

UpdateFromDisk parse_update_from_disk(const json& body) {
  Fields f(body, "");
  check_fields(body, "", kUpdateFromDiskFields, "/update_weights_from_disk");
  UpdateFromDisk u;
  const auto path = f.string("model_path");
  if (!path) bad("model_path", "a checkpoint folder (string) is required");
  u.model_path = *path;
  u.weight_version = f.string("weight_version").value_or("");
  u.abort_all_requests = f.boolean("abort_all_requests").value_or(false);
  f.boolean("flush_cache");  // (its type is still checked)
  return u;
}

size_t SharedTensor::bytes() const {
  size_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

namespace {

// A dtype as safetensors spells it ("BF16") or as torch prints it ("torch.bfloat16", "bfloat16").
std::optional<DType> shared_dtype(std::string s) {
  if (auto d = dtype_from_name(s)) return d;
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  static const std::map<std::string, DType> torch_names = {
      {"float32", DType::F32}, {"float", DType::F32},    {"bfloat16", DType::BF16},       {"float16", DType::F16},
      {"half", DType::F16},    {"float64", DType::F64},  {"float8_e4m3fn", DType::F8_E4M3}, {"int64", DType::I64},
      {"int32", DType::I32},   {"int16", DType::I16},    {"int8", DType::I8},             {"uint8", DType::U8},
      {"bool", DType::BOOL}};
  auto it = torch_names.find(s);
  return it == torch_names.end() ? std::nullopt : std::optional<DType>(it->second);
}

// Standard base64 (with padding) to bytes; nullopt when it is not base64.
std::optional<std::string> unbase64(const std::string& s) {
  if (s.size() % 4 != 0) return std::nullopt;
  std::string out(s.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(s.data()), int(s.size()));
  if (n < 0) return std::nullopt;
  size_t len = size_t(n);
  for (size_t i = s.size(); i > 0 && s[i - 1] == '='; i--) len--;  // (EVP counts the padding's zeros)
  out.resize(len);
  return out;
}

}  // namespace

UpdateFromTensor parse_update_from_tensor(const json& body) {
  Fields f(body, "");
  check_fields(body, "", kUpdateFromTensorFields, "/update_weights_from_tensor");
  UpdateFromTensor u;
  u.weight_version = f.string("weight_version").value_or("");
  u.abort_all_requests = f.boolean("abort_all_requests").value_or(false);
  u.commit = f.boolean("commit").value_or(true);
  f.boolean("flush_cache");  // (its type is still checked)
  const json* list = f.get("named_tensors");
  if (!list || !list->is_array()) bad("named_tensors", "a list of {name, dtype, shape, ipc_handle, offset} is required");
  if (list->empty() && u.commit == false) bad("named_tensors", "an empty list stages nothing");
  std::set<std::string> names;
  for (size_t i = 0; i < list->size(); i++) {
    const std::string at = "named_tensors[" + std::to_string(i) + "].";
    Fields t((*list)[i], at);
    check_fields((*list)[i], at, kSharedTensorFields, "a shared tensor");
    SharedTensor st;
    st.name = t.string("name").value_or("");
    if (st.name.empty()) bad(at + "name", "a tensor name (string) is required");
    if (!names.insert(st.name).second) bad(at + "name", "'" + st.name + "' is given twice");
    const auto dt = t.string("dtype");
    if (!dt) bad(at + "dtype", "a dtype (string, e.g. \"BF16\" or \"torch.bfloat16\") is required");
    const auto d = shared_dtype(*dt);
    if (!d) bad(at + "dtype", "'" + *dt + "' is not a dtype");
    st.dtype = *d;
    const json* shape = t.get("shape");
    if (!shape || !shape->is_array()) bad(at + "shape", "a list of dimensions is required");
    for (const json& x : *shape) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) bad(at + "shape", "dimensions are integers >= 0, got " + shape->dump());
      st.shape.push_back(x.get<int64_t>());
    }
    const auto h = t.string("ipc_handle");
    if (!h) bad(at + "ipc_handle", "the base64 of the allocation's cudaIpcMemHandle_t is required");
    // The handle's 64 bytes, or torch's form of them (`_share_cuda_()[1]`, CUDACachingAllocator's
    // shareIpcHandle): a format-version byte, a kind byte ('c' for a cudaMalloc'd block, 'e' for an
    // expandable segment, whose handle is of another kind), then the handle itself.
    auto raw = unbase64(*h);
    const char torch_kind = raw && raw->size() == kIpcHandleBytes + 2 ? (*raw)[1] : 0;
    if (torch_kind == 'c') raw->erase(0, 2);
    if (torch_kind == 'e')
      bad(at + "ipc_handle", "is torch's handle of an expandable segment, which CUDA IPC handles cannot open: share "
                             "tensors allocated without PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True");
    if (!raw || raw->size() != kIpcHandleBytes)
      bad(at + "ipc_handle", "must be the base64 of a " + std::to_string(kIpcHandleBytes) +
                                 "-byte cudaIpcMemHandle_t (or torch's " + std::to_string(kIpcHandleBytes + 2) +
                                 "-byte form: version, 'c', handle); got " +
                                 (raw ? std::to_string(raw->size()) + " bytes" : std::string("invalid base64")));
    st.handle = *raw;
    st.offset = uint64_t(t.integer("offset", 0, INT64_MAX).value_or(0));
    u.tensors.push_back(std::move(st));
  }
  return u;
}

json tokenize(const json& body, const ServedModel& m) {
  Fields f(body, "");
  check_fields(body, "", kTokenizeFields, "/tokenize");
  check_model_name(f, m);
  const json* prompt = f.get("prompt");
  const json* messages = f.get("messages");
  if ((prompt != nullptr) == (messages != nullptr))
    bad(prompt ? "messages" : "prompt", "give exactly one of prompt, messages");
  json tokens, count;
  if (messages) {
    const Tokenizer& tok = need_tokenizer(m, "messages");
    // The ids /v1/chat/completions runs for these messages.
    const std::vector<int32_t> ids = tok.encode(chatml_prompt(*messages, tok));
    tokens = ids;
    count = ids.size();
  } else if (prompt->is_string()) {
    const std::vector<int32_t> ids = need_tokenizer(m, "prompt").encode(prompt->get<std::string>());
    tokens = ids;
    count = ids.size();
  } else if (prompt->is_array()) {
    const Tokenizer& tok = need_tokenizer(m, "prompt");
    tokens = json::array();
    count = json::array();
    for (size_t i = 0; i < prompt->size(); i++) {
      if (!(*prompt)[i].is_string()) bad("prompt[" + std::to_string(i) + "]", "must be a string");
      const std::vector<int32_t> ids = tok.encode((*prompt)[i].get<std::string>());
      tokens.push_back(ids);
      count.push_back(ids.size());
    }
  } else {
    bad("prompt", "must be a string or a list of strings");
  }
  return {{"tokens", tokens}, {"count", count}, {"max_model_len", m.max_positions}};
}

json detokenize(const json& body, const ServedModel& m) {
  Fields f(body, "");
  check_fields(body, "", kDetokenizeFields, "/detokenize");
  check_model_name(f, m);
  const Tokenizer& tok = need_tokenizer(m, "tokens");
  const bool skip = f.boolean("skip_special_tokens").value_or(true);
  const json* t = f.get("tokens");
  if (!t) bad("tokens", "is required");
  if (!t->is_array()) bad("tokens", "must be a list of token ids or a list of such lists");
  // Ids outside the model's vocabulary are refused (decode would skip them silently).
  if (!t->empty() && (*t)[0].is_array()) {
    json texts = json::array();
    for (size_t i = 0; i < t->size(); i++) {
      if (!(*t)[i].is_array()) bad("tokens", "mixes lists and ids");
      texts.push_back(tok.decode(ids_of((*t)[i], "tokens[" + std::to_string(i) + "]", m), skip));
    }
    return {{"text", texts}};
  }
  return {{"text", tok.decode(ids_of(*t, "tokens", m), skip)}};
}

json model_card(const ServedModel& m) {
  return {{"id", m.name},       {"object", "model"}, {"created", 0}, {"owned_by", "epmoe"},
          {"root", m.path},     {"parent", nullptr}, {"max_model_len", m.max_positions}};
}

// ---------------------------------------------------------------- native

NativeCall parse_generate(const json& body, const ServedModel& m) {
  Fields f(body, "");
  check_fields(body, "", kGenerateFields, "/generate");
  NativeCall call;
  call.stream = f.boolean("stream").value_or(false);
  call.return_logprob = f.boolean("return_logprob").value_or(false);
  call.logprob_start_len = int(f.integer("logprob_start_len", -1, INT32_MAX).value_or(-1));
  call.top_logprobs_num = int(f.integer("top_logprobs_num", 0, m.max_top_logprobs).value_or(0));
  call.return_routed_experts = f.boolean("return_routed_experts").value_or(false);
  call.return_routed_expert_weights = f.boolean("return_routed_expert_weights").value_or(false);
  call.routed_experts_start_len = int(f.integer("routed_experts_start_len", 0, INT32_MAX).value_or(0));
  call.return_sampling_mask = f.boolean("return_sampling_mask").value_or(false);
  call.return_text_in_logprobs = f.boolean("return_text_in_logprobs").value_or(false);
  if (call.return_text_in_logprobs && !m.tokenizer)
    bad("return_text_in_logprobs", "this model has no tokenizer files: log-probs carry ids only");
  if ((call.return_routed_experts || call.return_routed_expert_weights) && !m.routed_experts)
    bad(call.return_routed_experts ? "return_routed_experts" : "return_routed_expert_weights",
        "the server records routed experts only when started with --enable-return-routed-experts");
  const json* text = f.get("text");
  const json* ids = f.get("input_ids");
  if ((text != nullptr) == (ids != nullptr)) bad(text ? "input_ids" : "text", "give exactly one of text, input_ids");
  // The prompts: one, or a list (a batch, answered with a list).
  std::vector<std::vector<int32_t>> prompts;
  std::string field = text ? "text" : "input_ids";
  if (text) {
    if (text->is_string()) {
      prompts.push_back(encode(text->get<std::string>(), "text", m));
    } else if (text->is_array()) {
      call.batch = true;
      for (size_t i = 0; i < text->size(); i++) {
        if (!(*text)[i].is_string()) bad("text", "must be a string or a list of strings");
        prompts.push_back(encode((*text)[i].get<std::string>(), "text[" + std::to_string(i) + "]", m));
      }
    } else {
      bad("text", "must be a string or a list of strings");
    }
  } else {
    if (!ids->is_array()) bad("input_ids", "must be a list of token ids or a list of such lists");
    if (!ids->empty() && (*ids)[0].is_array()) {
      call.batch = true;
      for (size_t i = 0; i < ids->size(); i++) {
        if (!(*ids)[i].is_array()) bad("input_ids", "mixes lists and ids");
        prompts.push_back(ids_of((*ids)[i], "input_ids[" + std::to_string(i) + "]", m));
      }
    } else {
      prompts.push_back(ids_of(*ids, "input_ids", m));
    }
  }
  if (call.batch && prompts.empty()) bad(field, "an empty list of prompts");
  // rid and sampling_params: one for all, or a list with one per prompt.
  auto per_prompt = [&](const char* k, size_t i) -> const json* {
    const json* v = f.get(k);
    if (!v || !call.batch || !v->is_array()) return v;
    if (v->size() != prompts.size())
      bad(k, "a list of " + std::to_string(v->size()) + " for " + std::to_string(prompts.size()) + " prompts");
    return &(*v)[i];
  };
  for (size_t i = 0; i < prompts.size(); i++) {
    const std::string at = call.batch ? "[" + std::to_string(i) + "]" : "";
    SamplingSpec s;
    const json* sp = per_prompt("sampling_params", i);
    if (sp) {
      Fields p(*sp, "sampling_params" + at + ".");
      check_fields(*sp, "sampling_params" + at + ".", kSamplingFields, "sampling_params");
      s.max_given = p.get("max_new_tokens") != nullptr;
      s.max_new_tokens = p.integer("max_new_tokens", 0, INT32_MAX).value_or(128);
      s.max_field = p.name("max_new_tokens");
      s.temperature = p.number("temperature", 0, 1e6).value_or(1.0);
      s.top_p = p.number("top_p", 1e-9, 1).value_or(1.0);
      s.top_k = p.integer("top_k", -1, INT32_MAX).value_or(-1);
      if (s.top_k == 0) s.top_k = -1;
      s.min_p = p.number("min_p", 0, 1).value_or(0.0);
      s.stop = p.strings("stop");
      if (const json* st = p.get("stop_token_ids")) {
        if (!st->is_array()) bad(p.name("stop_token_ids"), "must be a list of token ids");
        for (int32_t id : ids_of(*st, p.name("stop_token_ids"), m)) s.stop_ids.push_back(id);
      }
      s.ignore_eos = p.boolean("ignore_eos").value_or(false);
      s.n = p.integer("n", 1, 64).value_or(1);
      s.seed = p.seed("sampling_seed");
      s.skip_special = p.boolean("skip_special_tokens").value_or(true);
      s.no_stop_trim = p.boolean("no_stop_trim").value_or(false);
      s.processing = processing_of(p, "min_new_tokens", m);
      s.min_field = p.name("min_new_tokens");
    }
    if (!s.stop.empty() && !m.tokenizer) bad("sampling_params" + at + ".stop", "stop strings need the model's tokenizer");
    s.logprobs = call.return_logprob;
    s.top_logprobs = call.return_logprob ? call.top_logprobs_num : 0;
    s.input_from = call.return_logprob ? call.logprob_start_len : -1;
    s.routed_experts = call.return_routed_experts || call.return_routed_expert_weights;
    sampling_mask_of(call.return_sampling_mask, s);
    // token_ids_logprob: one list for every prompt, or (a batch) one list per prompt.
    if (const json* tl = f.get("token_ids_logprob"); tl && !tl->is_null()) {
      if (!tl->is_array()) bad("token_ids_logprob", "must be a list of token ids (or one list per prompt)");
      if (!call.return_logprob) bad("token_ids_logprob", "needs return_logprob: true (the log-probs come with the others)");
      const bool nested = !tl->empty() && (*tl)[0].is_array();
      if (nested && (!call.batch || tl->size() != prompts.size()))
        bad("token_ids_logprob", "a list per prompt needs a batch of as many prompts (" +
                                     std::to_string(prompts.size()) + ")");
      s.logprob_ids = nested ? ids_of((*tl)[i], "token_ids_logprob[" + std::to_string(i) + "]", m)
                             : ids_of(*tl, "token_ids_logprob", m);
      if (s.logprob_ids.size() > 1024) bad("token_ids_logprob", "at most 1024 ids");
    }
    std::string rid;
    if (const json* r = per_prompt("rid", i)) {
      if (!r->is_string()) bad("rid", "must be a string (or a list of strings, one per prompt)");
      rid = r->get<std::string>();
    } else {
      rid = make_id("");
    }
    call.requests.push_back(make_request(std::move(prompts[i]), field + at, s, rid, m));
  }
  return call;
}

json native_result(const Job& job, size_t j, const NativeCall& call, const ServedModel& m, size_t index) {
  const SampleProgress& s = job.samples[j];
  const ServeRequest& r = job.req;
  json meta;
  meta["id"] = r.n > 1 ? r.rid + "-" + std::to_string(j) : r.rid;
  if (!s.done) {
    meta["finish_reason"] = nullptr;
  } else {
    switch (s.finish) {
      case FinishReason::Stop:
        meta["finish_reason"] = {{"type", "stop"}};
        if (!s.matched_stop.empty()) meta["finish_reason"]["matched"] = s.matched_stop;
        else if (s.matched_id) meta["finish_reason"]["matched"] = *s.matched_id;
        break;
      case FinishReason::Length:
        meta["finish_reason"] = {{"type", "length"}, {"length", s.tokens.size()}};
        break;
      case FinishReason::Abort:
        meta["finish_reason"] = {{"type", "abort"}, {"message", "aborted"}};
        break;
    }
  }
  meta["prompt_tokens"] = r.prompt.size();
  meta["completion_tokens"] = s.tokens.size();
  meta["cached_tokens"] = job.cached_tokens;
  meta["sampling_seed"] = r.seed_reported ? json(r.seed + j) : json(nullptr);
  meta["weight_version"] = job.weight_version;
  meta["e2e_latency"] = job.e2e_seconds;
  if (call.return_logprob) {
    json out = json::array();
    for (size_t i = 0; i < s.logprobs.size() && i < s.tokens.size(); i++)
      out.push_back(logprob_triple(s.logprobs[i], s.tokens[i], call.return_text_in_logprobs, m));
    meta["output_token_logprobs"] = out;
    json in = json::array();
    const int64_t P = int64_t(r.prompt.size()), from = call.logprob_start_len;
    if (from >= 0 && s.done) {
      const int64_t first = std::max<int64_t>(from, 1);
      for (int64_t p = from; p < P; p++) {
        if (p == 0) {
          in.push_back(logprob_triple(0, r.prompt[0], call.return_text_in_logprobs, m));
          in.back()[0] = nullptr;
        } else if (size_t(p - first) < job.input_logprobs.size()) {
          in.push_back(
              logprob_triple(job.input_logprobs[size_t(p - first)], r.prompt[size_t(p)], call.return_text_in_logprobs, m));
        }
      }
    }
    meta["input_token_logprobs"] = in;
    // The top-N and the token_ids_logprob ids at the same prompt positions (position 0: null).
    auto at_prompt = [&](auto&& entry) {
      json out = json::array();
      if (from < 0 || !s.done) return out;
      const int64_t first = std::max<int64_t>(from, 1);
      for (int64_t p = from; p < P; p++) {
        if (p == 0) out.push_back(nullptr);
        else if (json e = entry(size_t(p - first)); !e.is_null()) out.push_back(std::move(e));
      }
      return out;
    };
    if (call.top_logprobs_num > 0)
      meta["input_top_logprobs"] = at_prompt([&](size_t k) -> json {
        if (k >= job.input_top.size()) return nullptr;
        json alts = json::array();
        for (auto& [id, lp] : job.input_top[k]) alts.push_back(logprob_triple(lp, id, call.return_text_in_logprobs, m));
        return alts;
      });
    if (!r.params.logprob_ids.empty()) {
      auto triples = [&](const std::vector<float>& lps) {
        json alts = json::array();
        for (size_t q = 0; q < lps.size() && q < r.params.logprob_ids.size(); q++)
          alts.push_back(logprob_triple(lps[q], r.params.logprob_ids[q], call.return_text_in_logprobs, m));
        return alts;
      };
      meta["input_token_ids_logprobs"] = at_prompt([&](size_t k) -> json {
        return k < job.input_ids_logprobs.size() ? triples(job.input_ids_logprobs[k]) : json(nullptr);
      });
      json outs = json::array();
      for (size_t i = 0; i < s.ids_logprobs.size() && i < s.tokens.size(); i++) outs.push_back(triples(s.ids_logprobs[i]));
      meta["output_token_ids_logprobs"] = outs;
    }
    if (call.top_logprobs_num > 0) {
      json tops = json::array();
      for (auto& step : s.top) {
        json alts = json::array();
        for (auto& [id, lp] : step) alts.push_back(logprob_triple(lp, id, call.return_text_in_logprobs, m));
        tops.push_back(alts);
      }
      meta["output_top_logprobs"] = tops;
    }
  }
  // Routing replay: every fed token's routing from routed_experts_start_len on (sglang's shape
  // [seq_len - 1 - start, moe_layers, top_k], int32 little-endian, base64), once the sample is done.
  if ((call.return_routed_experts || call.return_routed_expert_weights) && s.done) {
    if (call.return_routed_experts) meta["routed_experts"] = routed_experts_b64(s, call.routed_experts_start_len, m);
    if (call.return_routed_expert_weights)
      meta["routed_expert_weights"] = routed_weights_b64(s, call.routed_experts_start_len, m);
  }
  if (call.return_sampling_mask) meta["sampling_mask"] = sampling_mask_json(s);
  json out;
  out["text"] = s.text;
  out["output_ids"] = s.tokens;
  out["meta_info"] = meta;
  if (r.n > 1 || call.batch) out["index"] = index;
  return out;
}

// ---------------------------------------------------------------- OpenAI

namespace {

void check_model(const Fields& f, const ServedModel& m, OpenAICall& call) {
  call.model = f.string("model").value_or(m.name);
  if (call.model != m.name && call.model != m.path)
    throw HttpError(400, "model", "model: '" + call.model + "' is not served here (this server serves '" + m.name + "')");
}

SamplingSpec openai_sampling(const Fields& f, const ServedModel& m, int64_t default_max) {
  SamplingSpec s;
  const char* max_key = f.get("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  s.max_given = f.get(max_key) != nullptr;
  s.max_new_tokens = f.integer(max_key, 0, INT32_MAX).value_or(default_max);
  s.max_field = max_key;
  s.temperature = f.number("temperature", 0, 1e6).value_or(1.0);
  s.top_p = f.number("top_p", 1e-9, 1).value_or(1.0);
  s.top_k = f.integer("top_k", -1, INT32_MAX).value_or(-1);  // extension (vLLM, sglang)
  if (s.top_k == 0) s.top_k = -1;
  s.min_p = f.number("min_p", 0, 1).value_or(0.0);           // extension
  s.stop = f.strings("stop");
  if (!s.stop.empty() && !m.tokenizer) bad("stop", "stop strings need the model's tokenizer");
  if (const json* st = f.get("stop_token_ids")) {          // extension
    if (!st->is_array()) bad("stop_token_ids", "must be a list of token ids");
    for (int32_t id : ids_of(*st, "stop_token_ids", m)) s.stop_ids.push_back(id);
  }
  s.ignore_eos = f.boolean("ignore_eos").value_or(false);  // extension
  s.n = f.integer("n", 1, 64).value_or(1);
  s.seed = f.seed("seed");
  s.skip_special = f.boolean("skip_special_tokens").value_or(true);
  s.no_stop_trim = f.boolean("no_stop_trim").value_or(false);  // extension (sglang)
  s.processing = processing_of(f, "min_tokens", m);             // min_tokens: extension (vLLM, sglang)
  s.min_field = "min_tokens";
  return s;
}

// sglang's `rid` on the OpenAI routes: the request id /abort_request takes -- a string, or a list
// with one per prompt; without it, the response id (+ "-i" for prompt i of several).
std::string openai_rid(const Fields& f, const OpenAICall& call, size_t i, size_t prompts) {
  const json* r = f.get("rid");
  if (!r) return prompts > 1 ? call.id + "-" + std::to_string(i) : call.id;
  if (r->is_string()) return prompts > 1 ? r->get<std::string>() + "-" + std::to_string(i) : r->get<std::string>();
  if (!r->is_array() || r->size() != prompts)
    bad("rid", "must be a string or a list of " + std::to_string(prompts) + " strings (one per prompt)");
  if (!(*r)[i].is_string()) bad("rid", "must be a string or a list of strings");
  return (*r)[i].get<std::string>();
}

void stream_options(const Fields& f, OpenAICall& call) {
  call.stream = f.boolean("stream").value_or(false);
  call.return_token_ids = f.boolean("return_token_ids").value_or(false);
  call.return_routed_experts = f.boolean("return_routed_experts").value_or(false);
  call.return_routed_expert_weights = f.boolean("return_routed_expert_weights").value_or(false);
  call.routed_experts_start_len = int(f.integer("routed_experts_start_len", 0, INT32_MAX).value_or(0));
  call.return_sampling_mask = f.boolean("return_sampling_mask").value_or(false);
  if (const json* so = f.get("stream_options")) {
    Fields o(*so, "stream_options.");
    check_fields(*so, "stream_options.", kStreamOptionsFields, "stream_options");
    call.include_usage = o.boolean("include_usage").value_or(false);
  }
}

// Routing replay asked for on an OpenAI route: recorded for the request, if the server records it.
void routing_of(const OpenAICall& call, const ServedModel& m, SamplingSpec& s) {
  if ((call.return_routed_experts || call.return_routed_expert_weights) && !m.routed_experts)
    bad(call.return_routed_experts ? "return_routed_experts" : "return_routed_expert_weights",
        "the server records routed experts only when started with --enable-return-routed-experts");
  s.routed_experts = call.return_routed_experts || call.return_routed_expert_weights;
  sampling_mask_of(call.return_sampling_mask, s);
}

}  // namespace

OpenAICall parse_completion(const json& body, const ServedModel& m) {
  Fields f(body, "");
  check_fields(body, "", kCompletionFields, "/v1/completions");
  OpenAICall call;
  check_model(f, m, call);
  stream_options(f, call);
  SamplingSpec s = openai_sampling(f, m, 16);
  routing_of(call, m, s);
  call.logprobs = int(f.integer("logprobs", 0, m.max_top_logprobs).value_or(-1));
  if (f.integer("best_of", 1, 64).value_or(s.n) != s.n) bad("best_of", "is not supported (only equal to n)");
  s.logprobs = call.logprobs >= 0;
  s.top_logprobs = std::max(call.logprobs, 0);
  const json* p = f.get("prompt");
  if (!p) bad("prompt", "is required");
  // A string, a list of ids, a list of strings or a list of lists of ids.
  std::vector<std::pair<std::vector<int32_t>, std::string>> prompts;
  if (p->is_string()) {
    prompts.push_back({encode(p->get<std::string>(), "prompt", m), "prompt"});
  } else if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    for (size_t i = 0; i < p->size(); i++) {
      const std::string at = "prompt[" + std::to_string(i) + "]";
      const json& x = (*p)[i];
      if (x.is_string()) prompts.push_back({encode(x.get<std::string>(), at, m), at});
      else if (x.is_array()) prompts.push_back({ids_of(x, at, m), at});
      else bad(at, "must be a string or a list of token ids");
    }
  } else if (p->is_array()) {
    prompts.push_back({ids_of(*p, "prompt", m), "prompt"});
  } else {
    bad("prompt", "must be a string, a list of token ids, or a list of either");
  }
  call.id = make_id("cmpl-");
  call.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (size_t i = 0; i < prompts.size(); i++)
    call.requests.push_back(make_request(std::move(prompts[i].first), prompts[i].second, s,
                                         openai_rid(f, call, i, prompts.size()), m));
  return call;
}

std::string chatml_prompt(const json& messages, const Tokenizer& tok) {
  if (!tok.token_id("<|im_start|>") || !tok.token_id("<|im_end|>"))
    bad("messages", "this model's tokenizer has no ChatML tokens (<|im_start|>, <|im_end|>); use /v1/completions");
  if (!messages.is_array() || messages.empty()) bad("messages", "must be a non-empty list of messages");
  std::string out;
  for (size_t i = 0; i < messages.size(); i++) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    Fields f(messages[i], at + ".");
    check_fields(messages[i], at + ".", kMessageFields, "a chat message");
    const std::string role = f.string("role").value_or("");
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      bad(at + ".role", "must be one of system, developer, user, assistant, tool");
    std::string content;
    if (const json* c = f.get("content")) {
      if (c->is_string()) {
        content = c->get<std::string>();
      } else if (c->is_array()) {
        for (size_t k = 0; k < c->size(); k++) {
          const json& part = (*c)[k];
          const std::string pat = at + ".content[" + std::to_string(k) + "].";
          Fields pf(part, pat);
          if (pf.string("type").value_or("") != "text")
            bad(pat + "type", "only text parts are supported (epmoe serves text-only models)");
          check_fields(part, pat, kContentPartFields, "a text content part");
          content += pf.string("text").value_or("");
        }
      } else {
        bad(at + ".content", "must be a string or a list of text parts");
      }
    }
    out += "<|im_start|>" + std::string(role == "developer" ? "system" : role) + "\n" + content + "<|im_end|>\n";
  }
  return out + "<|im_start|>assistant\n";
}

OpenAICall parse_chat(const json& body, const ServedModel& m) {
  Fields f(body, "");
  check_fields(body, "", kChatFields, "/v1/chat/completions");
  OpenAICall call;
  call.chat = true;
  check_model(f, m, call);
  stream_options(f, call);
  if (!m.tokenizer) bad("messages", "this model has no tokenizer files; use /v1/completions with token ids");
  const json* msgs = f.get("messages");
  if (!msgs) bad("messages", "is required");
  std::vector<int32_t> prompt = encode(chatml_prompt(*msgs, *m.tokenizer), "messages", m);
  // Without max_tokens: the rest of the context, at most 1024 (every admitted request is promised
  // its whole KV need, so an unbounded default would hold the pool for nothing).
  const int64_t rest = std::max<int64_t>(1, int64_t(m.max_positions) - int64_t(prompt.size()) + 1);
  SamplingSpec s = openai_sampling(f, m, std::min<int64_t>(rest, 1024));
  routing_of(call, m, s);
  const bool lp = f.boolean("logprobs").value_or(false);
  const int64_t top = f.integer("top_logprobs", 0, m.max_top_logprobs).value_or(0);
  if (top > 0 && !lp) bad("top_logprobs", "needs logprobs: true");
  call.logprobs = lp ? int(top) : -1;
  s.logprobs = lp;
  s.top_logprobs = int(top);
  call.id = make_id("chatcmpl-");
  call.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  call.requests.push_back(make_request(std::move(prompt), "messages", s, openai_rid(f, call, 0, 1), m));
  return call;
}

// ---------------------------------------------------------------- Responses API

constexpr FieldRule kResponsesFields[] = {
    {"model", I}, {"input", I}, {"instructions", I}, {"max_output_tokens", I}, {"temperature", I}, {"top_p", I},
    {"stream", I}, {"metadata", I},
    {"user", N, "an end-user id for the provider's monitoring: it changes no output"},
    {"safety_identifier", N, "an end-user id for the provider's monitoring: it changes no output"},
    {"prompt_cache_key", N, "a routing hint for the provider's cache: the prefix cache here matches any prompt"},
    {"parallel_tool_calls", N, "no tool calls: nothing runs in parallel"},
    {"store", N, "responses are not stored (previous_response_id is refused)"},
    {"truncation", R, "is not supported (only disabled): a prompt longer than the context is refused", R"("disabled")"},
    {"previous_response_id", R, "is not supported: responses are not stored; send the whole conversation as input"},
    {"conversation", R, "is not supported: send the whole conversation as input"},
    {"tools", R, kNoTools}, {"tool_choice", R, kNoTools, R"(["none", "auto"])"},
    {"max_tool_calls", R, kNoTools},
    {"reasoning", R, kNoReasoning},
    {"text", R, "is not supported: plain text only (format {\"type\": \"text\"})", R"({"format": {"type": "text"}})"},
    {"include", R, "is not supported: no extra output (log-probs, reasoning, tool results)"},
    {"top_logprobs", R, "is not supported on /v1/responses: use /v1/chat/completions"},
    {"background", R, "is not supported: requests run while their connection waits"},
    {"prompt", R, "is not supported: no stored prompt templates"},
    {"service_tier", R, "is not supported (only auto / default)", R"(["auto", "default"])"},
    {"stream_options", R, "is not supported"},
};

// The Responses API's input as chat messages: a string is one user turn; a list holds messages
// ({role, content} with or without type "message"), content a string or input_text / output_text
// parts. instructions, when given, come first as a system turn.
json responses_messages(const Fields& f) {
  json msgs = json::array();
  if (auto ins = f.string("instructions"); ins && !ins->empty()) msgs.push_back({{"role", "system"}, {"content", *ins}});
  const json* in = f.get("input");
  if (!in) bad("input", "is required");
  if (in->is_string()) {
    msgs.push_back({{"role", "user"}, {"content", in->get<std::string>()}});
    return msgs;
  }
  if (!in->is_array()) bad("input", "must be a string or a list of messages");
  for (size_t i = 0; i < in->size(); i++) {
    const json& item = (*in)[i];
    const std::string at = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) bad(at, "must be a message object");
    for (auto it = item.begin(); it != item.end(); ++it)
      if (it.key() != "role" && it.key() != "content" && it.key() != "type" && it.key() != "id" && it.key() != "status")
        bad(at + "." + it.key(), "is not a field of a message (only text messages are supported)");
    if (item.contains("type") && item["type"] != "message")
      bad(at + ".type", "only message items are supported (no tool calls, reasoning or images), got " + item["type"].dump());
    if (!item.contains("role") || !item["role"].is_string()) bad(at + ".role", "is required");
    const json& c = item.contains("content") ? item["content"] : json();
    json content;
    if (c.is_string()) {
      content = c;
    } else if (c.is_array()) {
      std::string text;
      for (size_t k = 0; k < c.size(); k++) {
        const json& part = c[k];
        const std::string pat = at + ".content[" + std::to_string(k) + "]";
        const std::string type = part.is_object() && part.contains("type") && part["type"].is_string()
                                     ? part["type"].get<std::string>() : "";
        if (type != "input_text" && type != "output_text")
          bad(pat + ".type", "only input_text / output_text parts are supported (epmoe serves text-only models)");
        if (!part.contains("text") || !part["text"].is_string()) bad(pat + ".text", "is required");
        text += part["text"].get<std::string>();
      }
      content = text;
    } else {
      bad(at + ".content", "must be a string or a list of text parts");
    }
    msgs.push_back({{"role", item["role"]}, {"content", content}});
  }
  return msgs;
}

ResponsesCall parse_responses(const json& body, const ServedModel& m) {
  Fields f(body, "");
  check_fields(body, "", kResponsesFields, "/v1/responses");
  ResponsesCall call;
  call.model = f.string("model").value_or(m.name);
  if (call.model != m.name && call.model != m.path)
    throw HttpError(400, "model", "model: '" + call.model + "' is not served here (this server serves '" + m.name + "')");
  call.stream = f.boolean("stream").value_or(false);
  if (!m.tokenizer) bad("input", "this model has no tokenizer files; use /v1/completions with token ids");
  std::vector<int32_t> prompt = encode(chatml_prompt(responses_messages(f), *m.tokenizer), "input", m);
  SamplingSpec s;
  const int64_t rest = std::max<int64_t>(1, int64_t(m.max_positions) - int64_t(prompt.size()) + 1);
  s.max_given = f.get("max_output_tokens") != nullptr && !f.get("max_output_tokens")->is_null();
  s.max_new_tokens = f.integer("max_output_tokens", 1, INT32_MAX).value_or(std::min<int64_t>(rest, 1024));
  s.max_field = "max_output_tokens";
  s.temperature = f.number("temperature", 0, 2).value_or(1.0);
  s.top_p = f.number("top_p", 1e-9, 1).value_or(1.0);
  call.id = make_id("resp_");
  call.message_id = make_id("msg_");
  call.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const json* md = f.get("metadata");
  if (md && !md->is_null() && !md->is_object()) bad("metadata", "must be an object of strings");
  const json* ins = f.get("instructions");
  call.echo = {{"instructions", ins && ins->is_string() ? *ins : json(nullptr)},
               {"max_output_tokens", s.max_given ? json(s.max_new_tokens) : json(nullptr)},
               {"temperature", s.temperature},
               {"top_p", s.top_p},
               {"metadata", md && md->is_object() ? *md : json::object()},
               {"user", f.string("user") ? json(*f.string("user")) : json(nullptr)}};
  call.request = make_request(std::move(prompt), "input", s, call.id, m);
  return call;
}

const char* responses_status(const SampleProgress& s) {
  switch (s.finish) {
    case FinishReason::Stop: return "completed";
    case FinishReason::Length: return "incomplete";
    case FinishReason::Abort: return "cancelled";
  }
  return "completed";
}

json responses_object(const ResponsesCall& call, const Job& job, bool finished) {
  const SampleProgress* s = finished && !job.samples.empty() ? &job.samples[0] : nullptr;
  const char* status = s ? responses_status(*s) : "in_progress";
  json out = {{"id", call.id},
              {"object", "response"},
              {"created_at", call.created},
              {"status", status},
              {"error", nullptr},
              {"incomplete_details", s && s->finish == FinishReason::Length ? json{{"reason", "max_output_tokens"}}
                                                                             : json(nullptr)},
              {"model", call.model},
              {"output", json::array()},
              {"parallel_tool_calls", false},
              {"previous_response_id", nullptr},
              {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
              {"store", false},
              {"text", {{"format", {{"type", "text"}}}}},
              {"tool_choice", "none"},
              {"tools", json::array()},
              {"truncation", "disabled"},
              {"usage", nullptr}};
  for (auto it = call.echo.begin(); it != call.echo.end(); ++it) out[it.key()] = it.value();
  if (s) {
    out["output"].push_back({{"type", "message"},
                             {"id", call.message_id},
                             {"status", s->finish == FinishReason::Stop ? "completed" : "incomplete"},
                             {"role", "assistant"},
                             {"content", json::array({{{"type", "output_text"}, {"text", s->text}, {"annotations", json::array()}}})}});
    const int64_t P = int64_t(job.req.prompt.size()), O = int64_t(s->tokens.size());
    out["usage"] = {{"input_tokens", P},
                    {"input_tokens_details", {{"cached_tokens", job.cached_tokens}}},
                    {"output_tokens", O},
                    {"output_tokens_details", {{"reasoning_tokens", 0}}},
                    {"total_tokens", P + O}};
  }
  return out;
}

json openai_logprobs(const SampleProgress& s, size_t from, size_t n, bool chat, int top, const ServedModel& m,
                     int64_t base) {
  const size_t end = std::min(from + n, std::min(s.tokens.size(), s.logprobs.size()));
  if (chat) {
    json content = json::array();
    for (size_t i = from; i < end; i++) {
      const std::string t = token_text(s.tokens[i], m);
      json bytes = json::array();
      for (unsigned char c : t) bytes.push_back(int(c));
      json e = {{"token", t}, {"logprob", json_fp32(s.logprobs[i])}, {"bytes", bytes}};
      json alts = json::array();
      if (top > 0 && i < s.top.size())
        for (auto& [id, lp] : s.top[i]) {
          const std::string a = token_text(id, m);
          json bytes = json::array();
          for (unsigned char c : a) bytes.push_back(int(c));
          alts.push_back({{"token", a}, {"logprob", json_fp32(lp)}, {"bytes", bytes}});
        }
      e["top_logprobs"] = alts;
      content.push_back(e);
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (size_t i = from; i < end; i++) {
    tokens.push_back(token_text(s.tokens[i], m));
    lps.push_back(json_fp32(s.logprobs[i]));
    json alts = json::object();
    if (top > 0 && i < s.top.size())
      for (auto& [id, lp] : s.top[i]) alts[token_text(id, m)] = json_fp32(lp);
    tops.push_back(alts);
    offs.push_back(base + (i < s.text_offset.size() ? s.text_offset[i] : 0));
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json openai_finish(const SampleProgress& s) {
  if (!s.done) return nullptr;
  switch (s.finish) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
  }
  return nullptr;
}

json openai_matched_stop(const SampleProgress& s) {
  if (!s.done || s.finish != FinishReason::Stop) return nullptr;
  if (!s.matched_stop.empty()) return s.matched_stop;
  if (s.matched_id) return *s.matched_id;
  return nullptr;
}

bool sample_ends_at_last_token(const ServeRequest& r, const SampleProgress& s) {
  if (s.tokens.empty()) return false;
  if (int64_t(s.tokens.size()) >= int64_t(r.params.max_new_tokens) || !s.matched_stop.empty()) return true;
  for (int id : r.params.stop_ids)
    if (id == s.tokens.back()) return true;
  return false;
}

// The sampling mask (both APIs): per output token, the ids its draw could have picked (ascending).
json sampling_mask_json(const SampleProgress& s) {
  json masks = json::array();
  for (size_t i = 0; i < s.sampling_mask.size() && i < s.tokens.size(); i++) masks.push_back(s.sampling_mask[i]);
  return masks;
}

std::string routed_experts_b64(const SampleProgress& s, int start, const ServedModel& m) {
  const size_t per = size_t(m.moe_layers) * size_t(m.top_k);
  const size_t from = std::min(s.routed_experts.size(), size_t(start) * per);
  return base64(s.routed_experts.data() + from, (s.routed_experts.size() - from) * 4);
}
std::string routed_weights_b64(const SampleProgress& s, int start, const ServedModel& m) {
  const size_t per = size_t(m.moe_layers) * size_t(m.top_k);
  const size_t from = std::min(s.routed_weights.size(), size_t(start) * per);
  return base64(s.routed_weights.data() + from, (s.routed_weights.size() - from) * 4);
}
void add_routing(json& c, const OpenAICall& call, const SampleProgress& s, const ServedModel& m) {
  if (call.return_routed_experts) c["routed_experts"] = routed_experts_b64(s, call.routed_experts_start_len, m);
  if (call.return_routed_expert_weights)
    c["routed_expert_weights"] = routed_weights_b64(s, call.routed_experts_start_len, m);
  if (call.return_sampling_mask) c["sampling_mask"] = sampling_mask_json(s);
}

json openai_usage(const std::vector<JobPtr>& jobs) {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (auto& j : jobs) {
    prompt += int64_t(j->req.prompt.size());
    cached += j->cached_tokens;
    for (auto& s : j->samples) completion += int64_t(s.tokens.size());
  }
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json openai_response(const OpenAICall& call, const std::vector<JobPtr>& jobs, const ServedModel& m) {
  json choices = json::array();
  for (size_t p = 0; p < jobs.size(); p++) {
    const Job& job = *jobs[p];
    for (size_t j = 0; j < job.samples.size(); j++) {
      const SampleProgress& s = job.samples[j];
      json c;
      c["index"] = p * size_t(job.req.n) + j;
      if (call.chat) c["message"] = {{"role", "assistant"}, {"content", s.text}};
      else c["text"] = s.text;
      c["logprobs"] = call.logprobs >= 0 ? openai_logprobs(s, 0, s.tokens.size(), call.chat, call.logprobs, m)
                                         : json(nullptr);
      c["finish_reason"] = openai_finish(s);
      c["matched_stop"] = openai_matched_stop(s);
      add_routing(c, call, s, m);
      if (call.return_token_ids) {
        c["token_ids"] = s.tokens;
        if (!call.chat) c["prompt_token_ids"] = job.req.prompt;
      }
      choices.push_back(c);
    }
  }
  json out = {{"id", call.id},
              {"object", call.chat ? "chat.completion" : "text_completion"},
              {"created", call.created},
              {"model", call.model},
              {"choices", choices},
              {"usage", openai_usage(jobs)}};
  if (call.return_token_ids && call.chat && !jobs.empty()) out["prompt_token_ids"] = jobs[0]->req.prompt;
  return out;
}

}  // namespace epmoe
