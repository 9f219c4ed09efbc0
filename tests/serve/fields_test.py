"""No request field is silently ignored, and the endpoints and fixes of issue 38 (ctest serve.fields, httpx).

  * every field of sglang's GenerateReqInput and SamplingParams (on /generate) and of the OpenAI
    CompletionRequest / ChatCompletionRequest (OpenAI's parameters and sglang's extensions), each
    sent with a value that would change the output, is either implemented (200, and its effect
    where one is observable) or refused (400 whose error names that field); a 200 for a field that
    is not in the implemented list would be a field ignored, and fails. Unknown fields: 400 by name.
    The no-op values clients send as defaults (frequency_penalty 0, tools [], ...) are accepted;
  * /tokenize and /detokenize round trip text through the bundled tokenizer (and /tokenize of
    messages is the prompt /v1/chat/completions runs); GET /v1/models/{id}; CORS preflight under
    --api-key; a negative seed refused, the largest one replayed; matched_stop;
    return_text_in_logprobs;
  * every log-prob is printed as the shortest decimal that reads back as its fp32 (checked on the
    response text itself, thousands of numbers);
  * a streamed /v1/completions (and chat) with logprobs never sends a chunk of empty logprob
    arrays, on 1 and 2 ranks.
"""
import json
import os
import struct
import sys

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

check = h.Checks()
PROMPT = [15, 200, 31, 7, 1200, 99]

# ---- the upstream request schemas, field by field, each with an effective (non-default) value ----
# sglang python/sglang/srt/managers/io_struct.py GenerateReqInput (+ epmoe's return_routed_expert_weights).
GENERATE = {
    "rid": "fields-r1", "session_id": "s", "text": "Hello there", "input_ids": PROMPT,
    "input_embeds": [[0.1, 0.2]], "image_data": "http://x/i.png", "video_data": "http://x/v.mp4",
    "audio_data": "http://x/a.wav", "mm_hashes": ["ab"], "mm_content_hashes": ["sha256:" + "0" * 64],
    "use_audio_in_video": True, "video_config": {"fps": 1}, "sampling_params": {"max_new_tokens": 3},
    "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2, "token_ids_logprob": [5, 6],
    "return_sampling_mask": True, "return_text_in_logprobs": True, "return_flat_raw_top_logprobs": True,
    "return_flat_raw_top_logprobs_b64": True, "stream": True, "log_metrics": False, "return_hidden_states": True,
    "return_routed_experts": True, "routed_experts_start_len": 1, "return_indexer_topk": True,
    "modalities": ["image"], "session_params": {"id": "s"}, "lora_path": "adapter", "lora_id": "a",
    "custom_logit_processor": "proc", "positional_embed_overrides": {"a": 1}, "bootstrap_host": "h",
    "bootstrap_port": 1, "bootstrap_room": 1, "bootstrap_pair_key": "k", "decode_tp_size": 2, "routed_dp_rank": 1,
    "data_parallel_rank": 1, "disagg_prefill_dp_rank": 1, "kv_router_hint": {"a": "b"}, "routing_key": "k",
    "conversation_id": "c", "http_worker_ipc": "ipc", "background": True, "require_reasoning": True,
    "max_thinking_tokens": 5, "priority": 1, "extra_key": "k", "no_logs": True, "custom_labels": {"a": "b"},
    "return_bytes": True, "return_entropy": True, "return_prompt_token_ids": True,
    "external_trace_header": {"a": "b"}, "received_time": 1.5, "need_wait_for_mm_inputs": True,
    "num_items_assigned": {"image": [1]}, "encoder_urls": ["u"], "max_dynamic_patch": 2, "min_dynamic_patch": 1,
    "image_max_dynamic_patch": 2, "video_max_dynamic_patch": 2, "images_config": {"a": 1},
    "multi_item_delimiter_indices": [1], "cache_salt": "s", "return_routed_expert_weights": True,
}
# sglang python/sglang/srt/sampling/sampling_params.py SamplingParams (the API fields).
SAMPLING = {
    "max_new_tokens": 3, "stop": "zz", "stop_token_ids": [5], "stop_regex": "a+", "temperature": 0.5,
    "top_p": 0.9, "top_k": 5, "min_p": 0.1, "frequency_penalty": 0.5, "presence_penalty": 0.5,
    "repetition_penalty": 1.2, "min_new_tokens": 2, "n": 2, "json_schema": '{"type": "object"}', "regex": "a+",
    "ebnf": 'root ::= "a"', "structural_tag": '{"a": 1}', "ignore_eos": True, "skip_special_tokens": False,
    "spaces_between_special_tokens": False, "no_stop_trim": True, "custom_params": {"a": 1},
    "stream_interval": 2, "logit_bias": {"5": 10.0}, "sampling_seed": 7,
}
# OpenAI's /v1/completions parameters and sglang's CompletionRequest extensions
# (python/sglang/srt/entrypoints/openai/protocol.py).
COMPLETION = {
    "model": None, "prompt": PROMPT, "best_of": 2, "echo": True, "frequency_penalty": 0.5,
    "logit_bias": {"5": 10.0}, "logprobs": 2, "max_tokens": 3, "n": 2, "presence_penalty": 0.5, "seed": 3,
    "stop": "zz", "stream": True, "stream_options": {"include_usage": True}, "suffix": "s", "temperature": 0.5,
    "top_p": 0.9, "user": "u", "return_hidden_states": True, "return_routed_experts": True,
    "routed_experts_start_len": 1, "return_cached_tokens_details": True, "return_token_ids": True, "top_k": 5,
    "min_p": 0.1, "min_tokens": 2, "json_schema": '{"type": "object"}', "regex": "a+", "ebnf": 'root ::= "a"',
    "repetition_penalty": 1.2, "stop_token_ids": [5], "stop_regex": "a+", "no_stop_trim": True, "ignore_eos": True,
    "skip_special_tokens": False, "lora_path": "adapter", "session_id": "s", "session_params": {"id": "s"},
    "response_format": {"type": "json_object"}, "custom_params": {"a": 1}, "custom_logit_processor": "proc",
    "images_config": {"a": 1}, "bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 1,
    "routed_dp_rank": 1, "disagg_prefill_dp_rank": 1, "data_parallel_rank": 1, "rid": "fields-c1",
    "extra_key": "k", "cache_salt": "s", "ngram_corpus_id": "n", "priority": 1, "custom_labels": {"a": "b"},
}
MESSAGES = [{"role": "user", "content": "Say something."}]
# OpenAI's /v1/chat/completions parameters and sglang's ChatCompletionRequest extensions.
CHAT = {
    "messages": MESSAGES, "model": None, "frequency_penalty": 0.5, "logit_bias": {"5": 10.0}, "logprobs": True,
    "top_logprobs": 2, "max_tokens": 3, "max_completion_tokens": 3, "n": 2, "presence_penalty": 0.5,
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    "seed": 3, "stop": "zz", "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.5,
    "top_p": 0.9, "user": "u", "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "required", "parallel_tool_calls": False, "return_hidden_states": True,
    "return_routed_experts": True, "routed_experts_start_len": 1, "return_cached_tokens_details": True,
    "return_prompt_token_ids": True, "return_token_ids": True, "return_meta_info": True, "reasoning_effort": "low",
    "task": "action", "top_k": 5, "min_p": 0.1, "min_tokens": 2, "regex": "a+", "ebnf": 'root ::= "a"',
    "repetition_penalty": 1.2, "stop_token_ids": [5], "stop_regex": "a+", "no_stop_trim": True, "ignore_eos": True,
    "continue_final_message": True, "skip_special_tokens": False, "lora_path": "adapter", "session_id": "s",
    "session_params": {"id": "s"}, "separate_reasoning": False, "stream_reasoning": False,
    "chat_template_kwargs": {"enable_thinking": False}, "max_dynamic_patch": 2, "min_dynamic_patch": 1,
    "use_audio_in_video": True, "images_config": {"a": 1}, "custom_logit_processor": "proc",
    "custom_params": {"a": 1}, "input_ids": [1, 2], "rid": "fields-ch1", "extra_key": "k", "cache_salt": "s",
    "ngram_corpus_id": "n", "priority": 1, "bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 1,
    "routed_dp_rank": 1, "disagg_prefill_dp_rank": 1, "data_parallel_rank": 1, "reasoning": {"effort": "low"},
    # OpenAI's own, not in sglang's model
    "audio": {"voice": "alloy", "format": "wav"}, "function_call": {"name": "f"},
    "functions": [{"name": "f"}], "metadata": {"a": "b"}, "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"}, "prompt_cache_key": "k", "safety_identifier": "s",
    "service_tier": "flex", "store": True, "verbosity": "low", "web_search_options": {"search_context_size": "low"},
}
# OpenAI's /v1/responses parameters (the Responses API).
RESPONSES = {
    "input": "Say something.", "model": None, "instructions": "Be brief.", "max_output_tokens": 3,
    "temperature": 0.5, "top_p": 0.9, "stream": True, "metadata": {"a": "b"}, "user": "u", "safety_identifier": "s",
    "prompt_cache_key": "k", "parallel_tool_calls": False, "store": False, "truncation": "auto",
    "previous_response_id": "resp_x", "conversation": "conv_x", "tools": [{"type": "function", "name": "f"}],
    "tool_choice": "required", "max_tool_calls": 2, "reasoning": {"effort": "low"},
    "text": {"format": {"type": "json_object"}}, "include": ["message.output_text.logprobs"], "top_logprobs": 2,
    "background": True, "prompt": {"id": "pmpt_x"}, "service_tier": "flex",
    "stream_options": {"include_obfuscation": False},
}
# What epmoe implements (or accepts because it has no effect here: docs/serve.md says why). A 200 for
# any other field means it was ignored. Some implemented fields are refused in some contexts.
IMPLEMENTED_GENERATE = {"rid", "text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len",
                        "top_logprobs_num", "return_text_in_logprobs", "stream", "routed_experts_start_len",
                        "return_routed_experts", "return_routed_expert_weights", "no_logs", "token_ids_logprob",
                        "return_sampling_mask"}
IMPLEMENTED_SAMPLING = {"max_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p", "n",
                        "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
                        "sampling_seed", "frequency_penalty", "presence_penalty", "repetition_penalty",
                        "min_new_tokens", "logit_bias"}
IMPLEMENTED_OPENAI = {"model", "n", "seed", "stop", "stream", "stream_options", "temperature", "top_p", "top_k",
                      "min_p", "stop_token_ids", "no_stop_trim", "ignore_eos", "skip_special_tokens",
                      "return_token_ids", "rid", "user", "safety_identifier", "prompt_cache_key",
                      "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "min_tokens",
                      "return_routed_experts", "routed_experts_start_len", "return_routed_expert_weights"}
IMPLEMENTED_COMPLETION = IMPLEMENTED_OPENAI | {"prompt", "max_tokens", "logprobs", "best_of"}
IMPLEMENTED_CHAT = IMPLEMENTED_OPENAI | {"messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs",
                                         "separate_reasoning", "stream_reasoning", "parallel_tool_calls"}
IMPLEMENTED_RESPONSES = {"input", "model", "instructions", "max_output_tokens", "temperature", "top_p", "stream",
                         "metadata", "user", "safety_identifier", "prompt_cache_key", "parallel_tool_calls", "store"}
# Refused in this test's context although implemented: routing replay needs the server flag, best_of
# must equal n, token_ids_logprob needs return_logprob (tests/serve/sampling_fields_test.py has it).
CONTEXT_REFUSED = {"return_routed_experts", "return_routed_expert_weights", "best_of", "token_ids_logprob"}


def sse(text):
    return [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ") and line != "data: [DONE]"]


def post(url, path, body, **kw):
    return httpx.post(url + path, json=body, timeout=120, **kw)


def judge(route, name, body, r, implemented, effect=None):
    """The verdict on one field: implemented (200 + effect) or refused (400 naming it)."""
    param = None
    if r.status_code == 400:
        try:
            err = r.json()["error"]
            param, message = err.get("param"), err.get("message", "")
        except Exception:
            message = r.text
        leaf = name.split(".")[-1]
        named = param == name and leaf in message
        ok = named and (leaf not in implemented or leaf in CONTEXT_REFUSED)
        check(ok, "%s %s: refused, 400 naming it (%s)" % (route, name, message[:110]))
        return
    if r.status_code != 200:
        check(False, "%s %s: HTTP %d %s" % (route, name, r.status_code, r.text[:200]))
        return
    leaf = name.split(".")[-1]
    if leaf not in implemented:
        check(False, "%s %s: accepted (200) but not implemented -- silently ignored" % (route, name))
        return
    detail = effect(r) if effect else None
    check(detail is None or detail is True, "%s %s: implemented (200)%s" % (
        route, name, "" if detail in (None, True) else ": " + str(detail)))


def generate_effects(s):
    """Observable effects of the implemented /generate fields, each a function of the response."""
    def meta(r):
        out = r.json()
        return (out[0] if isinstance(out, list) else out)["meta_info"]
    return {
        "rid": lambda r: meta(r)["id"] == "fields-r1" or "meta_info.id %s" % meta(r)["id"],
        "return_logprob": lambda r: len(meta(r)["output_token_logprobs"]) == meta(r)["completion_tokens"],
        "top_logprobs_num": lambda r: True,  # (needs return_logprob: tested with it below)
        # (greedy here: each token's support is the token; tests/serve/sampling_fields_test.py samples)
        "return_sampling_mask": lambda r: meta(r)["sampling_mask"] == [[t] for t in r.json()["output_ids"]] or
        "sampling_mask %s" % meta(r).get("sampling_mask"),
        "stream": lambda r: r.text.startswith("data: ") and r.text.rstrip().endswith("data: [DONE]"),
        "sampling_params.max_new_tokens": lambda r: meta(r)["completion_tokens"] == 3 or meta(r)["finish_reason"][
            "type"] == "stop",
        "sampling_params.n": lambda r: isinstance(r.json(), list) and len(r.json()) == 2,
        "sampling_params.sampling_seed": lambda r: meta(r)["sampling_seed"] == 7,
        "sampling_params.no_stop_trim": lambda r: True,
    }


def schema_fields(url, model_name):
    base_sp = {"max_new_tokens": 4, "temperature": 0}
    effects = generate_effects(None)
    for name, value in GENERATE.items():
        body = {"input_ids": PROMPT, "sampling_params": dict(base_sp)}
        if name == "text":
            body = {"text": value, "sampling_params": dict(base_sp)}
        elif name == "sampling_params":
            body["sampling_params"] = dict(base_sp, **value)
        else:
            body[name] = value
        judge("/generate", name, body, post(url, "/generate", body), IMPLEMENTED_GENERATE, effects.get(name))
    for name, value in SAMPLING.items():
        body = {"input_ids": PROMPT, "sampling_params": dict(base_sp, **{name: value})}
        judge("/generate", "sampling_params." + name, body, post(url, "/generate", body), IMPLEMENTED_SAMPLING,
              effects.get("sampling_params." + name))
    comp_effects = {
        "n": lambda r: len(r.json()["choices"]) == 2,
        "logprobs": lambda r: all(len(t) == 2 for t in r.json()["choices"][0]["logprobs"]["top_logprobs"]),
        "max_tokens": lambda r: r.json()["usage"]["completion_tokens"] <= 3,
        "stream": lambda r: r.text.rstrip().endswith("data: [DONE]"),
        "return_token_ids": lambda r: r.json()["choices"][0]["token_ids"] is not None,
    }
    for name, value in COMPLETION.items():
        body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
        body[name] = model_name if name == "model" else value
        judge("/v1/completions", name, body, post(url, "/v1/completions", body), IMPLEMENTED_COMPLETION,
              comp_effects.get(name))
    chat_effects = {
        "n": lambda r: len(r.json()["choices"]) == 2,
        "max_completion_tokens": lambda r: r.json()["usage"]["completion_tokens"] <= 3,
        "logprobs": lambda r: len(r.json()["choices"][0]["logprobs"]["content"]) ==
        r.json()["usage"]["completion_tokens"],
    }
    for name, value in CHAT.items():
        body = {"messages": MESSAGES, "max_tokens": 4, "temperature": 0}
        body[name] = model_name if name == "model" else value
        if name == "top_logprobs":
            body["logprobs"] = True
        judge("/v1/chat/completions", name, body, post(url, "/v1/chat/completions", body), IMPLEMENTED_CHAT,
              chat_effects.get(name))

    resp_effects = {
        "max_output_tokens": lambda r: r.json()["usage"]["output_tokens"] <= 3,
        "instructions": lambda r: r.json()["instructions"] == "Be brief.",
        "metadata": lambda r: r.json()["metadata"] == {"a": "b"},
        "stream": lambda r: r.text.startswith("event: response.created"),
    }
    for name, value in RESPONSES.items():
        body = {"input": "Say something.", "max_output_tokens": 4, "temperature": 0}
        body[name] = model_name if name == "model" else value
        judge("/v1/responses", name, body, post(url, "/v1/responses", body), IMPLEMENTED_RESPONSES,
              resp_effects.get(name))

    # Unknown fields, at each level: refused by name.
    for path, body, field in [
            ("/generate", {"input_ids": PROMPT, "max_token": 3}, "max_token"),
            ("/generate", {"input_ids": PROMPT, "sampling_params": {"max_token": 3}}, "sampling_params.max_token"),
            ("/v1/completions", {"prompt": PROMPT, "max_new_tokens": 3}, "max_new_tokens"),
            ("/v1/chat/completions", {"messages": MESSAGES, "stream_options": {"include_usag": True}},
             "stream_options.include_usag"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "name": "bob"}]},
             "messages[0].name")]:
        r = post(url, path, body)
        check(r.status_code == 400 and r.json()["error"]["param"] == field,
              "%s: unknown or unsupported %s refused by name (%s)" % (path, field, r.text[:120]))
    # The no-op values clients send as defaults are accepted (AReaL's frequency_penalty 0, ...).
    for path, body in [
            ("/generate", {"input_ids": PROMPT, "image_data": None, "return_hidden_states": False,
                           "sampling_params": {"max_new_tokens": 2, "frequency_penalty": 0.0, "presence_penalty": 0,
                                               "repetition_penalty": 1.0, "min_new_tokens": 0, "logit_bias": {},
                                               "regex": None}}),
            ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "echo": False, "logit_bias": {},
                                 "response_format": {"type": "text"}}),
            ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, "tools": [], "tool_choice": "none",
                                      "response_format": {"type": "text"}, "store": False,
                                      "service_tier": "auto"})]:
        r = post(url, path, body)
        check(r.status_code == 200, "%s: no-op values of refused fields accepted (%s)" % (path, r.text[:160]))
    r = post(url, "/v1/chat/completions", {"messages": MESSAGES, "response_format": {"type": "bogus"}})
    check(r.status_code == 400 and r.json()["error"]["param"] == "response_format",
          "an invalid response_format is refused, naming it")


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def shortest_fp32_digits(x):
    """The fewest significant digits of a decimal that reads back as fp32 x."""
    for p in range(1, 10):
        if f32(float("%.*e" % (p - 1, x))) == x:
            return p
    return 9


def significant_digits(text):
    mant = text.split("e")[0].split("E")[0].lstrip("-").replace(".", "")
    mant = mant.lstrip("0").rstrip("0")
    return max(1, len(mant))


class Num(str):
    pass


def logprob_printing(url):
    """Log-probs as printed: each the shortest decimal that reads back as its fp32."""
    texts = []
    for seed in range(6):
        r = post(url, "/generate", {"input_ids": [seed + 3, 40 + seed, 7], "return_logprob": True,
                                    "logprob_start_len": 0, "top_logprobs_num": 20,
                                    "sampling_params": {"max_new_tokens": 24, "temperature": 0.9,
                                                        "sampling_seed": seed, "ignore_eos": True}})
        texts.append(r.text)
    numbers = []
    for t in texts:
        meta = json.loads(t, parse_float=Num)["meta_info"]
        for e in meta["output_token_logprobs"] + meta["input_token_logprobs"]:
            if e[0] is not None:
                numbers.append(e[0])
        for step in meta["output_top_logprobs"]:
            numbers += [e[0] for e in step]
    # (each number read as fp32 -- what it stands for -- then the fewest digits that read back as it)
    bad = [s for s in numbers if significant_digits(s) != shortest_fp32_digits(f32(float(s)))]
    check(len(numbers) > 3000 and not bad, "%d log-probs printed, each the shortest decimal of its fp32 (%s)" % (
        len(numbers), bad[:5]))
    chat = post(url, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 16, "logprobs": True,
                                              "top_logprobs": 5, "temperature": 0.8, "seed": 1})
    c = json.loads(chat.text, parse_float=Num)["choices"][0]["logprobs"]["content"]
    nums = [e["logprob"] for e in c] + [a["logprob"] for e in c for a in e["top_logprobs"]]
    check(nums and all(significant_digits(s) == shortest_fp32_digits(f32(float(s))) for s in nums),
          "chat log-probs shortest too (%d)" % len(nums))


def endpoints(url, model_name):
    text = "Hello, world: caf\u00e9 \u2603!"
    t = post(url, "/tokenize", {"prompt": text}).json()
    check(isinstance(t["tokens"], list) and t["count"] == len(t["tokens"]) > 0 and t["max_model_len"] > 0,
          "/tokenize: tokens, count, max_model_len (%s)" % t)
    d = post(url, "/detokenize", {"tokens": t["tokens"]}).json()
    check(d.get("text") == text, "/detokenize(/tokenize(text)) == text (%r)" % d)
    tb = post(url, "/tokenize", {"prompt": ["a b", "c d e"]}).json()
    db = post(url, "/detokenize", {"tokens": tb["tokens"]}).json()
    check(db.get("text") == ["a b", "c d e"] and tb["count"] == [len(x) for x in tb["tokens"]],
          "/tokenize and /detokenize of lists")
    # The ids of the same text as a prompt: /generate runs exactly these.
    g = post(url, "/generate", {"text": text, "sampling_params": {"max_new_tokens": 1}}).json()
    check(g["meta_info"]["prompt_tokens"] == t["count"], "/tokenize counts the prompt /generate runs")
    chat = post(url, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "return_token_ids": True}).json()
    tm = post(url, "/tokenize", {"messages": MESSAGES}).json()
    check(tm["tokens"] == chat["prompt_token_ids"], "/tokenize of messages == the chat route's prompt ids")
    r = post(url, "/detokenize", {"tokens": [1, 10 ** 6]})
    check(r.status_code == 400 and r.json()["error"]["param"] == "tokens", "/detokenize: an id outside the "
          "vocabulary is refused")
    r = post(url, "/tokenize", {"prompt": "x", "add_special_tokens": False})
    check(r.status_code == 400 and r.json()["error"]["param"] == "add_special_tokens",
          "/tokenize add_special_tokens false refused by name")

    r = httpx.get(url + "/v1/models/" + model_name, timeout=10)
    lst = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]
    check(r.status_code == 200 and r.json() == lst, "GET /v1/models/{id}: the card /v1/models lists")
    r = httpx.get(url + "/v1/models/no-such-model", timeout=10)
    err = r.json().get("error", {})
    check(r.status_code == 404 and err.get("code") == "model_not_found" and "no-such-model" in err.get("message", ""),
          "GET /v1/models/{unknown}: 404 with OpenAI's error (%s)" % r.text[:160])

    # Seeds: a negative one refused by name; the largest one (as reported seeds can be) replays.
    r = post(url, "/generate", {"input_ids": PROMPT, "sampling_params": {"sampling_seed": -3}})
    check(r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.sampling_seed",
          "/generate: negative sampling_seed refused by name (%s)" % r.text[:120])
    r = post(url, "/v1/completions", {"prompt": PROMPT, "seed": -1})
    check(r.status_code == 400 and r.json()["error"]["param"] == "seed", "/v1/completions: negative seed refused")
    big = 2 ** 64 - 1
    body = {"input_ids": PROMPT, "return_logprob": True, "sampling_params": {
        "sampling_seed": big, "max_new_tokens": 6, "temperature": 1.0, "ignore_eos": True}}
    a, b = post(url, "/generate", body).json(), post(url, "/generate", body).json()
    check(a["meta_info"]["sampling_seed"] == big and a["output_ids"] == b["output_ids"],
          "sampling_seed 2^64-1 is accepted, reported and replays")
    fresh = post(url, "/generate", dict(body, sampling_params=dict(body["sampling_params"], sampling_seed=None))).json()
    seed = fresh["meta_info"]["sampling_seed"]
    again = post(url, "/generate", dict(body, sampling_params=dict(body["sampling_params"], sampling_seed=seed))).json()
    check(again["output_ids"] == fresh["output_ids"], "a reported fresh seed (%d) replays" % seed)

    # return_text_in_logprobs: each entry's text is the token's own text (/detokenize of the one id).
    r = post(url, "/generate", {"input_ids": PROMPT, "return_logprob": True, "logprob_start_len": 2,
                                "top_logprobs_num": 2, "return_text_in_logprobs": True,
                                "sampling_params": {"max_new_tokens": 5, "temperature": 0}}).json()
    m = r["meta_info"]
    entries = m["output_token_logprobs"] + m["input_token_logprobs"] + [e for s in m["output_top_logprobs"] for e in s]
    texts = {e[1]: e[2] for e in entries}
    want = {i: post(url, "/detokenize", {"tokens": [i], "skip_special_tokens": False}).json()["text"] for i in texts}
    check(texts == want and len(m["input_token_logprobs"]) == len(PROMPT) - 2,
          "return_text_in_logprobs: [logprob, id, text] with each token's text")
    plain = post(url, "/generate", {"input_ids": PROMPT, "return_logprob": True,
                                    "sampling_params": {"max_new_tokens": 2}}).json()
    check(all(e[2] is None for e in plain["meta_info"]["output_token_logprobs"]), "without it the text is null")

    # matched_stop on OpenAI choices: the stop string, or the stop id, that ended the sample.
    greedy = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                                           "return_token_ids": True}).json()["choices"][0]
    check(greedy["finish_reason"] == "length" and greedy["matched_stop"] is None, "length: matched_stop null")
    stop_id = greedy["token_ids"][3]
    c = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                                      "stop_token_ids": [stop_id]}).json()["choices"][0]
    check(c["finish_reason"] == "stop" and c["matched_stop"] == stop_id, "stop id: matched_stop is the id (%s)" % c)
    txt = greedy["text"]
    stop = txt[len(txt) // 2:len(txt) // 2 + 2] if len(txt) > 4 else None
    if stop and stop.strip():
        c = post(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                                          "stop": [stop]}).json()["choices"][0]
        check(c["finish_reason"] == "stop" and c["matched_stop"] == stop, "stop string: matched_stop is the string")


def cors():
    with h.Server(api_key="k38") as s:
        r = httpx.request("OPTIONS", s.url + "/v1/chat/completions", timeout=10, headers={
            "Origin": "http://page.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        hd = r.headers
        check(r.status_code == 204 and hd.get("access-control-allow-origin") == "*" and
              "POST" in hd.get("access-control-allow-methods", "") and
              "authorization" in hd.get("access-control-allow-headers", "").lower(),
              "CORS preflight without the key: 204 with Allow-Origin/Methods/Headers (%d %s)" % (
                  r.status_code, dict(hd)))
        r = httpx.post(s.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}, timeout=30,
                       headers={"Origin": "http://page.example"})
        check(r.status_code == 401 and r.headers.get("access-control-allow-origin") == "*",
              "the key still guards real requests (401, readable by the page)")
        r = httpx.post(s.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 1}, timeout=30,
                       headers={"Origin": "http://page.example", "Authorization": "Bearer k38"})
        check(r.status_code == 200 and r.headers.get("access-control-allow-origin") == "*",
              "a normal response carries Access-Control-Allow-Origin")


def streams_end_with_tokens(url, ranks):
    """Streamed log-probs: no chunk of empty logprob arrays; the last chunk of each choice has tokens."""
    empties, mismatched, total = [], [], 0
    cases = []
    for i in range(10):
        cases.append({"prompt": [3 + i, 50, 9 + i], "max_tokens": 3 + i % 5, "logprobs": 1 + i % 2,
                      "temperature": 0.8, "seed": i, "n": 1 + i % 2, "ignore_eos": i % 3 == 0})
    cases.append({"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 6, "logprobs": 0, "temperature": 0})
    for body in cases:
        with httpx.stream("POST", url + "/v1/completions", json=dict(body, stream=True), timeout=120) as r:
            raw = b"".join(r.iter_bytes()).decode()
        ref = post(url, "/v1/completions", body).json()
        per = {}
        for ch in sse(raw):
            for c in ch["choices"]:
                total += 1
                lp = c["logprobs"]
                if lp is not None and not lp["tokens"]:
                    empties.append((body["prompt"], c))
                if lp is not None:
                    per.setdefault(c["index"], []).extend(lp["token_logprobs"])
                if c["finish_reason"] is not None and lp is None and c["finish_reason"] != "abort":
                    empties.append(("a finish chunk without its tokens", c))
        for c in ref["choices"]:
            if per.get(c["index"], []) != c["logprobs"]["token_logprobs"]:
                mismatched.append(c["index"])
    check(not empties and not mismatched and total > 0,
          "%d ranks: %d streamed completion chunks, none with empty logprob arrays, the log-probs adding up to "
          "the non-streamed ones (%s %s)" % (ranks, total, empties[:2], mismatched[:4]))
    with httpx.stream("POST", url + "/v1/chat/completions", json={
            "messages": MESSAGES, "max_tokens": 5, "logprobs": True, "top_logprobs": 1, "stream": True,
            "temperature": 0}, timeout=120) as r:
        chunks = sse(b"".join(r.iter_bytes()).decode())
    bad = [c for ch in chunks for c in ch["choices"] if c["logprobs"] is not None and not c["logprobs"]["content"]]
    last = [c for ch in chunks for c in ch["choices"] if c["finish_reason"]]
    check(not bad and len(last) == 1 and last[0]["logprobs"] and last[0]["logprobs"]["content"],
          "%d ranks: chat stream, no empty logprob content; the finish chunk carries the last token" % ranks)


def main():
    with h.Server() as s:
        name = httpx.get(s.url + "/v1/models", timeout=10).json()["data"][0]["id"]
        schema_fields(s.url, name)
        endpoints(s.url, name)
        logprob_printing(s.url)
        streams_end_with_tokens(s.url, 1)
    with h.Server(ranks=2) as s:
        streams_end_with_tokens(s.url, 2)
    cors()
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
