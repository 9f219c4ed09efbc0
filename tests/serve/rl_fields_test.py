"""The fields RL frameworks read besides /generate (tests/serve, ctest serve.rl_fields), with httpx.

  * vLLM's return_token_ids on /v1/completions and /v1/chat/completions: each choice's token_ids
    are the ids /generate produces for the same request, prompt_token_ids the prompt's (the
    ChatML ids for chat); streamed, the chunks' token_ids add up to them and prompt_token_ids
    comes once;
  * GET /v1/loads (and /get_loads): sglang's load report, 0 requests when idle, the running
    request counted while it runs, 0 again after abort_all.
"""
import json
import os
import sys
import threading
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

check = h.Checks()


def stream_chunks(url, path, body):
    # (Lines split at b"\n" only, as SSE does: token text may hold other line breaks, e.g. U+0085,
    # that str.splitlines -- and so httpx's iter_lines -- would split at.)
    with httpx.stream("POST", url + path, json=dict(body, stream=True), timeout=120) as r:
        raw = b"".join(r.iter_bytes())
    return [json.loads(line[6:]) for line in raw.decode().split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


def main():
    with h.Server() as s:  # the text model (tokenizer, ChatML)
        url = s.url
        prompt = [15, 200, 31, 7, 1200, 99]
        gen = httpx.post(url + "/generate", json={"input_ids": prompt, "sampling_params": {
            "max_new_tokens": 8, "temperature": 0.7, "sampling_seed": 3, "ignore_eos": True}}, timeout=60).json()
        body = {"prompt": prompt, "max_tokens": 8, "temperature": 0.7, "seed": 3, "ignore_eos": True,
                "return_token_ids": True}
        c = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
        check(c["token_ids"] == gen["output_ids"], "completions: token_ids are /generate's output_ids")
        check(c["prompt_token_ids"] == prompt, "completions: prompt_token_ids are the prompt")
        plain = httpx.post(url + "/v1/completions", json=dict(body, return_token_ids=False), timeout=60).json()
        check("token_ids" not in plain["choices"][0], "completions without return_token_ids: no token_ids")
        chunks = stream_chunks(url, "/v1/completions", body)
        ids = [i for ch in chunks for x in ch["choices"] for i in x.get("token_ids", [])]
        prompts = [x["prompt_token_ids"] for ch in chunks for x in ch["choices"] if "prompt_token_ids" in x]
        check(ids == c["token_ids"] and prompts == [prompt],
              "completions streamed: the chunks' token_ids add up, prompt_token_ids once")

        messages = [{"role": "user", "content": "Say something."}]
        chat_body = {"messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
                     "return_token_ids": True}
        chat = httpx.post(url + "/v1/chat/completions", json=chat_body, timeout=60).json()
        pids, tids = chat.get("prompt_token_ids"), chat["choices"][0].get("token_ids")
        check(bool(pids) and tids is not None and len(tids) == 6, "chat: prompt_token_ids and 6 token_ids")
        again = httpx.post(url + "/v1/completions", json={"prompt": pids, "max_tokens": 6, "temperature": 0,
                                                           "ignore_eos": True, "return_token_ids": True},
                           timeout=60).json()["choices"][0]
        check(again["token_ids"] == tids, "chat: the ChatML prompt_token_ids as a completion give the same ids")
        chunks = stream_chunks(url, "/v1/chat/completions", chat_body)
        ids = [i for ch in chunks for x in ch["choices"] for i in x.get("token_ids", [])]
        check(ids == tids and [ch["prompt_token_ids"] for ch in chunks if "prompt_token_ids" in ch] == [pids],
              "chat streamed: token_ids add up, prompt_token_ids once")

        # /v1/loads: idle, one long request running, after abort_all.
        for path in ("/v1/loads", "/get_loads"):
            loads = httpx.get(url + path, timeout=10).json()["loads"]
            check(len(loads) == 1 and loads[0]["num_reqs"] == 0 and loads[0]["num_tokens"] == 0,
                  "%s idle: one rank, no requests, no KV tokens in use" % path)
        t = threading.Thread(target=lambda: httpx.post(url + "/generate", json={"input_ids": prompt, "sampling_params": {
            "max_new_tokens": 4000, "ignore_eos": True}}, timeout=120))
        t.start()
        seen = None
        deadline = time.time() + 30
        while time.time() < deadline and not seen:
            ld = httpx.get(url + "/v1/loads", timeout=10).json()["loads"][0]
            if ld["num_running_reqs"] >= 1 and ld["num_tokens"] > 0:
                seen = ld
            time.sleep(0.05)
        check(seen is not None and seen["num_reqs"] >= 1 and 0 < seen["token_usage"] <= 1,
              "/v1/loads while a request runs: counted, its KV tokens in use (%s)" % seen)
        httpx.post(url + "/abort_request", json={"abort_all": True}, timeout=10)
        t.join(60)
        s.wait_idle()
        ld = httpx.get(url + "/v1/loads", timeout=10).json()["loads"][0]
        check(ld["num_reqs"] == 0, "/v1/loads after abort_all: no requests")
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
