"""The sglang clients of two RL frameworks, slime (THUDM/slime) and AReaL (inclusionAI/AReaL), against
`epmoe serve`: their payloads and their parsing, as their rollout code sends and reads them.

slime: httpx (slime/utils/http_utils.py::_post), POST /generate with input_ids or text,
sampling_params as GenerateState builds them, return_logprob True; reads
meta_info["output_token_logprobs"] ([0] log-prob, [1] token id) and meta_info["finish_reason"]["type"];
/abort_request {"abort_all": true}; weight sync pause -> flush_cache -> update_weights_from_disk
(model_path, weight_version) -> continue.
AReaL: aiohttp (areal/infra/utils/http.py::arequest_with_retry), POST /generate with input_ids and
SGLangBackend's sampling params, the agenerate loop that resubmits an aborted request's partial output,
/pause_generation and /continue_generation around /update_weights_from_disk.

Also: list requests, re-scoring (logprob_start_len 0, max_new_tokens 0), top_logprobs_num, n > 1 with
sampling_seed, abort by rid, pause (mode abort), a weight update (other weights, weight_version v2),
a refused update (other shapes), and the slime payloads against 2 ranks with --moe-a2a-backend alltoall.
The model is random: the checks are on structure and on real values (counts, id ranges, log-prob bits).
One line per check; exit status 1 when any failed. Run with Debian's /usr/bin/python3 (httpx, aiohttp).
"""
import asyncio
import json
import math
import os
import re
import struct
import sys
import time

import aiohttp
import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_harness import WORK, Server, second_weights, synth_once, text_model  # noqa: E402

VOCAB = 3000
CONTEXT = 4096  # max_position_embeddings of the harness's text model
PAD_ID, EOS_ID = 0, 2  # <|endoftext|>, <|im_end|>
TIMEOUT = 120

FAILURES = []
CHECKS = [0]


def check(name, ok, detail=""):
    CHECKS[0] += 1
    if ok:
        print("ok   " + name, flush=True)
    else:
        FAILURES.append(name)
        print("FAIL %s%s" % (name, ": " + str(detail)[:600] if detail != "" else ""), flush=True)
    return bool(ok)


def section(name):
    """Runs an async section; an exception is one failure (the next section still runs)."""
    def wrap(fn):
        async def run(*a, **k):
            try:
                return await fn(*a, **k)
            except Exception as e:  # noqa: BLE001 -- reported as a failed check
                check("%s (no exception)" % name, False, "%s: %s" % (type(e).__name__, e))
                return None
        return run
    return wrap


def f32(x):
    return struct.pack("<f", x)


def same_bits(a, b):
    """Two lists of log-probs equal as fp32 (the JSON carries the shortest decimal of each fp32)."""
    return len(a) == len(b) and all(f32(x) == f32(y) for x, y in zip(a, b))


def is_logprob(x):
    return isinstance(x, float) and math.isfinite(x) and x <= 0


# ------------------------------------------------------------------ slime
class Slime:
    """slime's HTTP side. /generate as slime/rollout/sglang_rollout.py::generate posts it (through
    slime/utils/http_utils.py::_post: httpx.AsyncClient, json=payload, raise_for_status, json.loads);
    control calls as slime/backends/sglang_utils/sglang_engine.py's SGLangEngine makes them."""

    def __init__(self, url):
        self.url = url
        # http_utils.init_http_client: AsyncClient with a connection limit (and no timeout there; bounded here).
        self.client = httpx.AsyncClient(limits=httpx.Limits(max_connections=64), timeout=httpx.Timeout(TIMEOUT),
                                        trust_env=False)
        self.sync = httpx.Client(timeout=TIMEOUT, trust_env=False)

    async def close(self):
        await self.client.aclose()
        self.sync.close()

    async def post(self, path, payload):
        response = await self.client.post(self.url + path, json=payload or {})
        response.raise_for_status()
        return json.loads(await response.aread())

    @staticmethod
    def sampling_params(max_new_tokens, temperature=1.0, top_p=1.0, top_k=-1, stop=None, stop_token_ids=None,
                        seed=None):
        # sglang_rollout.py::GenerateState.__init__ (rollout_* arguments; rollout_stop and
        # rollout_stop_token_ids default to None), plus sampling_seed as generate_and_rm_group adds it
        # under --sglang-enable-deterministic-inference (rollout_seed + index in the group).
        sp = dict(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens, stop=stop,
                  stop_token_ids=stop_token_ids, skip_special_tokens=True, no_stop_trim=True,
                  spaces_between_special_tokens=False)
        if seed is not None:
            sp["sampling_seed"] = seed
        return sp

    async def generate(self, sampling_params, input_ids=None, text=None, **extra):
        # sglang_rollout.py::generate: {"sampling_params", "return_logprob": True} + "input_ids" (or
        # "text" when the prompt goes to sglang as text, as for multimodal prompts).
        payload = {"sampling_params": sampling_params, "return_logprob": True}
        if text is not None:
            payload["text"] = text
        else:
            payload["input_ids"] = input_ids
        payload.update(extra)
        output = await self.post("/generate", payload)
        return output

    @staticmethod
    def parse(output):
        # sglang_rollout.py::generate and Sample.append_response_tokens/_apply_meta_info.
        meta = output["meta_info"]
        if "output_token_logprobs" in meta:
            tokens = [item[1] for item in meta["output_token_logprobs"]]
            log_probs = [item[0] for item in meta["output_token_logprobs"]]
        else:
            tokens, log_probs = [], []
        status = {"length": "TRUNCATED", "abort": "ABORTED", "stop": "COMPLETED"}[meta["finish_reason"]["type"]]
        return tokens, log_probs, status

    # SGLangEngine: pause_generation / continue_generation post json={}; flush_cache GETs until 200;
    # update_weights_from_disk posts {"model_path", "weight_version"?}; _make_request raises on an HTTP error.
    def pause_generation(self):
        r = self.sync.post(self.url + "/pause_generation", json={})
        r.raise_for_status()
        return r

    def continue_generation(self):
        r = self.sync.post(self.url + "/continue_generation", json={})
        r.raise_for_status()
        return r

    def flush_cache(self):
        for _ in range(60):
            r = self.sync.get(self.url + "/flush_cache")
            if r.status_code == 200:
                return r
            time.sleep(1)
        raise TimeoutError("Timeout while flushing cache.")

    def update_weights_from_disk(self, model_path, weight_version=None):
        payload = {"model_path": model_path}
        if weight_version is not None:
            payload["weight_version"] = weight_version
        r = self.sync.post(self.url + "/update_weights_from_disk", json=payload or {})
        r.raise_for_status()
        return r.json()

    def get_weight_version(self):
        # SGLangEngine.get_weight_version: /model_info (newer sglang), else the legacy /get_weight_version.
        for endpoint in ("/model_info", "/get_weight_version"):
            r = self.sync.get(self.url + endpoint)
            if r.status_code == 200:
                return r.json()["weight_version"]
        raise RuntimeError("no weight_version endpoint")

    async def abort_all(self):
        # slime/backends/sglang_utils/server_control.py::_abort_server_once.
        return await self.post("/abort_request", {"abort_all": True})


# ------------------------------------------------------------------ AReaL
class AReaL:
    """AReaL's RemoteSGLangEngine: areal/engine/sglang_remote.py::SGLangBackend builds the payloads,
    areal/infra/remote_inf_engine.py::RemoteInfEngine.agenerate loops over them, and
    areal/infra/utils/http.py::arequest_with_retry sends them with aiohttp."""

    def __init__(self, url):
        self.url = url
        self.paused = asyncio.Event()  # WorkflowExecutor.is_paused()
        self.calls = []                 # (finish type, tokens) of every /generate call, for the checks

    async def request(self, session, endpoint, payload, method="POST", max_retries=1):
        timeo = aiohttp.ClientTimeout(total=TIMEOUT, sock_connect=TIMEOUT, connect=TIMEOUT)
        last = None
        for _ in range(max_retries):
            try:
                ctx = session.get(self.url + endpoint, timeout=timeo) if method == "GET" else \
                    session.post(self.url + endpoint, json=payload, timeout=timeo)
                async with ctx as response:
                    response.raise_for_status()
                    ctype = response.content_type or ""
                    if ctype == "application/json":
                        return await response.json()
                    if ctype.startswith("text/"):
                        return await response.text()
                    return await response.read()
            except (asyncio.TimeoutError, aiohttp.ClientError) as e:
                last = e
        raise RuntimeError("Failed after %d retries: %r" % (max_retries, last))

    @staticmethod
    def generation_request(input_ids, max_new_tokens, greedy=False, temperature=1.0, top_p=1.0, top_k=int(1e8),
                           ignore_eos=False, stop=None, stop_token_ids=()):
        # SGLangBackend.build_generation_request with GenerationHyperparameters' defaults (stop_token_ids
        # [] by default; workflows add pad and eos with new_with_stop_and_pad_token_ids).
        sample_params = {
            "top_p": top_p,
            "top_k": top_k,
            "max_new_tokens": max_new_tokens,
            "temperature": 0.0 if greedy else temperature,
            "stop_token_ids": list(stop_token_ids),
            "ignore_eos": ignore_eos,
            "skip_special_tokens": True,
            "frequency_penalty": 0.0,
        }
        if stop:
            sample_params["stop"] = stop
        return {"input_ids": list(input_ids), "image_data": None, "sampling_params": sample_params,
                "return_logprob": True, "stream": False}

    @staticmethod
    def parse(response):
        # SGLangBackend.parse_generation_response.
        meta_info = response["meta_info"]
        finish_reason = meta_info["finish_reason"]
        stop_reason = finish_reason["type"]
        stop_message = finish_reason.get("message", "")
        if stop_reason == "abort" and stop_message.startswith("Abort before prefill"):
            return [], [], stop_reason
        output_tokens = [x[1] for x in meta_info["output_token_logprobs"]]
        output_logprobs = [x[0] for x in meta_info["output_token_logprobs"]]
        return output_tokens, output_logprobs, stop_reason

    async def agenerate(self, session, input_ids, max_new_tokens, **gconfig):
        # RemoteInfEngine.agenerate: until stop/length, resubmit prompt + what came back so far.
        input_ids = list(input_ids)
        tokens, logprobs, versions = [], [], []
        stop_reason = None
        while stop_reason not in ("stop", "tool_calls", "length") and len(tokens) < max_new_tokens:
            while self.paused.is_set():
                await asyncio.sleep(0.05)  # AReaL sleeps 0.5 s; shorter here to keep the test quick
            payload = self.generation_request(input_ids, max_new_tokens - len(tokens), **gconfig)
            result = await self.request(session, "/generate", payload)
            out, lps, stop_reason = self.parse(result)
            self.calls.append((stop_reason, len(out), result["meta_info"].get("weight_version")))
            tokens += out
            logprobs += lps
            versions += [result["meta_info"].get("weight_version")] * len(out)
            input_ids += out
        if stop_reason == "abort":
            stop_reason = "length"
        return tokens, logprobs, versions, stop_reason

    async def pause_generation(self, session):
        # RemoteInfEngine.pause_generation: SGLangBackend.get_pause_request -> POST /pause_generation {}.
        return await self.request(session, "/pause_generation", {})

    async def continue_generation(self, session):
        return await self.request(session, "/continue_generation", {})

    async def update_weights_from_disk(self, session, path):
        # SGLangBackend.build_disk_weight_update_requests (full model): no weight_version.
        return await self.request(session, "/update_weights_from_disk",
                                  {"model_path": str(path), "abort_all_requests": True})


# ------------------------------------------------------------------ helpers
async def metrics(client, url):
    r = await client.get(url + "/metrics")
    out = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, value = line.rsplit(" ", 1)
        key = re.sub(r'model="[^"]*",?', "", key).replace("{}", "")  # as serve_harness.Server.metrics
        out[key] = float(value)
    return out


async def wait_running(client, url, sequences, min_new_tokens, since, timeout=15):
    """Until `sequences` run and at least min_new_tokens more were generated than `since` had."""
    deadline = time.time() + timeout
    while True:
        m = await metrics(client, url)
        if m["epmoe_running_sequences"] >= sequences and \
                m["epmoe_generation_tokens_total"] - since["epmoe_generation_tokens_total"] >= min_new_tokens:
            return m
        if time.time() > deadline:
            raise AssertionError("requests not running within %d s: %s" % (timeout, m))
        await asyncio.sleep(0.02)


async def wait_idle(client, url, timeout=15):
    deadline = time.time() + timeout
    while True:
        m = await metrics(client, url)
        if m["epmoe_running_sequences"] == 0 and m["epmoe_queue_requests"] == 0 and \
                m['epmoe_kv_blocks{state="used"}'] == 0:
            return m
        if time.time() > deadline:
            raise AssertionError("not idle within %d s: %s" % (timeout, m))
        await asyncio.sleep(0.05)


def check_output(tag, out, prompt_len, max_new_tokens, ignore_eos=False):
    """The structure every slime / AReaL reader relies on, with its real values."""
    meta = out["meta_info"]
    tokens, lps, status = Slime.parse(out)
    n = meta["completion_tokens"]
    ok = tokens == out["output_ids"] and len(lps) == n == len(tokens)
    check("%s: output_token_logprobs ids == output_ids, one per completion token" % tag, ok,
          "%d logprobs, %d ids, completion_tokens %d" % (len(lps), len(out["output_ids"]), n))
    check("%s: ids in [0, %d), log-probs negative finite" % (tag, VOCAB),
          all(isinstance(t, int) and 0 <= t < VOCAB for t in tokens) and all(is_logprob(x) for x in lps),
          json.dumps(meta["output_token_logprobs"][:4]))
    check("%s: prompt_tokens == %d" % (tag, prompt_len), meta["prompt_tokens"] == prompt_len, meta["prompt_tokens"])
    fr = meta["finish_reason"]
    if fr["type"] == "length":
        ok = n == max_new_tokens and fr.get("length") == n
    elif fr["type"] == "stop":
        ok = not ignore_eos and n <= max_new_tokens and n > 0 and tokens[-1] == fr.get("matched")
    else:
        ok = False
    check("%s: finish_reason %s consistent (length at max_new_tokens, stop on a stop id)" % (tag, fr["type"]),
          ok, json.dumps(fr) + " with %d tokens" % n)
    return tokens, lps


# ------------------------------------------------------------------ 1 rank
R = {}  # results kept for the comparisons with other weights and with 2 ranks

PROMPT_TEXT = "In a distant valley, the river carried stories of old kings"
LIST_PROMPTS = [[5, 17, 300, 2999], [1000, 2, 45, 46, 47, 48, 49], [7] * 12]
GREEDY_IDS = [42, 314, 1592, 653, 589, 793, 238]


@section("health")
async def health(slime, areal):
    # AReaL RemoteInfEngine waits for GET /health == 200 before anything; slime's
    # SGLangEngine.health_generate GETs /health_generate and raises on an error status.
    r = await slime.client.get(slime.url + "/health")
    check("AReaL check_health: GET /health 200", r.status_code == 200, r.status_code)
    r = await slime.client.get(slime.url + "/health_generate")
    check("slime health_generate: GET /health_generate 200", r.status_code == 200, "%d %s" % (r.status_code, r.text))
    m = await metrics(slime.client, slime.url)
    check("health_generate's probe is not counted as a request", m["epmoe_requests_received_total"] == 0,
          m["epmoe_requests_received_total"])


@section("slime generate")
async def slime_generate(slime):
    # Text prompt (slime sends text for prompts sglang tokenizes itself), a seeded sample.
    sp = Slime.sampling_params(24, seed=11)
    a = await slime.generate(sp, text=PROMPT_TEXT)
    prompt_len = a["meta_info"]["prompt_tokens"]
    check("slime text: prompt_tokens > 0", prompt_len > 0, prompt_len)
    toks, lps = check_output("slime text", a, prompt_len, 24)
    check("slime text: meta_info sampling_seed 11, weight_version default",
          a["meta_info"]["sampling_seed"] == 11 and a["meta_info"]["weight_version"] == "default",
          json.dumps({k: a["meta_info"].get(k) for k in ("sampling_seed", "weight_version")}))
    check("slime text: text is a string", isinstance(a["text"], str))
    # The ids sglang made of the text (re-scoring echoes them), then the same request as input_ids.
    s = await slime.generate(Slime.sampling_params(0), text=PROMPT_TEXT, logprob_start_len=0)
    ids = [x[1] for x in s["meta_info"]["input_token_logprobs"]]
    check("slime text: the re-scored prompt has prompt_tokens ids", len(ids) == prompt_len, len(ids))
    b = await slime.generate(sp, input_ids=ids)
    check("slime input_ids == text: same output ids and log-prob bits",
          b["output_ids"] == a["output_ids"] and same_bits(Slime.parse(b)[1], lps))
    R["prompt"], R["sample"], R["sample_lps"] = ids, toks, lps

    # A group as generate_and_rm_group sends it (one request per sample, seeds rollout_seed + i,
    # concurrently), then the same group as one request with n = 4: sample j draws with seed + j.
    base = 1000
    group = await asyncio.gather(*[slime.generate(Slime.sampling_params(16, seed=base + i), input_ids=ids)
                                   for i in range(4)])
    for i, g in enumerate(group):
        check_output("slime group[%d]" % i, g, len(ids), 16)
    check("slime group: 4 different samples", len({tuple(g["output_ids"]) for g in group}) == 4)
    n4 = await slime.post("/generate", {"input_ids": ids, "sampling_params": dict(Slime.sampling_params(16, seed=base),
                                                                                   n=4), "return_logprob": True})
    if check("slime n=4: a list of 4 results", isinstance(n4, list) and len(n4) == 4, type(n4).__name__):
        for j, (x, g) in enumerate(zip(n4, group)):
            check("slime n=4: sample %d has sampling_seed %d and the ids/bits of seed %d alone" % (j, base + j, base + j),
                  x["meta_info"]["sampling_seed"] == base + j and x["output_ids"] == g["output_ids"] and
                  same_bits(Slime.parse(x)[1], Slime.parse(g)[1]),
                  "seed %s, ids %s vs %s" % (x["meta_info"]["sampling_seed"], x["output_ids"][:6], g["output_ids"][:6]))
        check("slime n=4: distinct meta_info ids", len({x["meta_info"]["id"] for x in n4}) == 4)
    R["group"] = [g["output_ids"] for g in group]

    # stop_token_ids: a token from the middle of a sample ends the same seeded sample at its first
    # occurrence (the stop id is the last output id, finish_reason stop matched it).
    ref = group[0]["output_ids"]
    stop_tok = ref[len(ref) // 2]
    first = ref.index(stop_tok)
    c = await slime.generate(Slime.sampling_params(16, seed=base, stop_token_ids=[stop_tok]), input_ids=ids)
    check("slime stop_token_ids: output == the sample up to its first %d, inclusive" % stop_tok,
          c["output_ids"] == ref[:first + 1], "%s vs %s" % (c["output_ids"], ref[:first + 1]))
    check("slime stop_token_ids: finish_reason {type stop, matched %d}, status COMPLETED" % stop_tok,
          c["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_tok} and Slime.parse(c)[2] == "COMPLETED",
          json.dumps(c["meta_info"]["finish_reason"]))

    # Greedy (temperature 0) kept for the weight-update comparisons.
    g = await slime.generate(Slime.sampling_params(12, temperature=0.0), input_ids=GREEDY_IDS)
    R["greedy"] = check_output("slime greedy", g, len(GREEDY_IDS), 12)
    check("slime greedy: no sampling_seed reported", g["meta_info"]["sampling_seed"] is None,
          g["meta_info"]["sampling_seed"])


@section("list request")
async def list_request(slime):
    sp = Slime.sampling_params(6, temperature=0.0)
    out = await slime.post("/generate", {"input_ids": LIST_PROMPTS, "sampling_params": sp, "return_logprob": True})
    if not check("list: input_ids as a list of lists -> a list of %d results" % len(LIST_PROMPTS),
                 isinstance(out, list) and len(out) == len(LIST_PROMPTS), json.dumps(out)[:200]):
        return
    for i, (p, o) in enumerate(zip(LIST_PROMPTS, out)):
        check_output("list[%d]" % i, o, len(p), 6)
        alone = await slime.generate(sp, input_ids=p)
        check("list[%d]: == the prompt alone (ids and bits)" % i,
              o["output_ids"] == alone["output_ids"] and same_bits(Slime.parse(o)[1], Slime.parse(alone)[1]))
    # Per-prompt sampling_params (a list, one per prompt) and text prompts as a list.
    out = await slime.post("/generate", {"text": ["one two", "three four five"], "return_logprob": True,
                                         "sampling_params": [Slime.sampling_params(2, temperature=0.0),
                                                             Slime.sampling_params(5, temperature=0.0)]})
    check("list: text list with per-prompt sampling_params -> 2 and 5 tokens",
          isinstance(out, list) and [o["meta_info"]["completion_tokens"] for o in out] == [2, 5],
          json.dumps(out)[:300])


@section("re-scoring")
async def rescoring(slime):
    prompt, sample, lps = R["prompt"], R["sample"], R["sample_lps"]
    full = prompt + sample
    # max_new_tokens 0, logprob_start_len 0: every position's log-prob; the first has none.
    r = await slime.generate(Slime.sampling_params(0), input_ids=full, logprob_start_len=0)
    meta = r["meta_info"]
    inp = meta["input_token_logprobs"]
    check("re-score: no output (max_new_tokens 0), finish length",
          r["output_ids"] == [] and meta["completion_tokens"] == 0 and meta["finish_reason"]["type"] == "length",
          json.dumps(meta["finish_reason"]))
    check("re-score: input_token_logprobs has P = %d entries" % len(full), len(inp) == len(full), len(inp))
    check("re-score: entry 0 is [None, first id, None]", inp and inp[0][0] is None and inp[0][1] == full[0],
          json.dumps(inp[:2]))
    check("re-score: entries carry the prompt's ids in order", [x[1] for x in inp] == full)
    check("re-score: entries 1.. negative finite", all(is_logprob(x[0]) for x in inp[1:]), json.dumps(inp[:4]))
    tail = [x[0] for x in inp[len(prompt):]]
    check("re-score: the output's positions == the first call's output_token_logprobs (fp32 bits)",
          same_bits(tail, lps), "%s vs %s" % (tail[:4], lps[:4]))
    # logprob_start_len = len(prompt): only the output's positions.
    r2 = await slime.generate(Slime.sampling_params(0), input_ids=full, logprob_start_len=len(prompt))
    inp2 = r2["meta_info"]["input_token_logprobs"]
    check("re-score from len(prompt): %d entries with the same bits" % len(sample),
          len(inp2) == len(sample) and same_bits([x[0] for x in inp2], lps), json.dumps(inp2[:3]))

    # top_logprobs_num with greedy: the chosen token is the first alternative, with the same bits.
    t = await slime.generate(Slime.sampling_params(8, temperature=0.0), input_ids=GREEDY_IDS, top_logprobs_num=3)
    tops = t["meta_info"].get("output_top_logprobs")
    out = t["meta_info"]["output_token_logprobs"]
    ok = isinstance(tops, list) and len(tops) == len(out) == 8
    check("top_logprobs_num 3: one list per output token", ok, json.dumps(tops)[:200])
    if ok:
        shape = all(len(s) == 3 and all(is_logprob(a[0]) and 0 <= a[1] < VOCAB for a in s) and
                    s[0][0] >= s[1][0] >= s[2][0] and len({a[1] for a in s}) == 3 for s in tops)
        check("top_logprobs_num 3: 3 distinct ids per step, sorted", shape, json.dumps(tops[0]))
        check("top_logprobs_num 3 (greedy): chosen id and bits == first alternative",
              all(s[0][1] == o[1] and f32(s[0][0]) == f32(o[0]) for s, o in zip(tops, out)),
              "%s vs %s" % (tops[0][0], out[0]))
        check("top_logprobs_num (greedy): same ids/bits as without it",
              t["output_ids"] == R["greedy"][0][:8] and same_bits([o[0] for o in out], R["greedy"][1][:8]))


@section("abort by rid")
async def abort_by_rid(slime, url):
    before = await metrics(slime.client, url)
    ids = [9, 8, 7, 6]
    max_new = CONTEXT - len(ids)
    sp = dict(Slime.sampling_params(max_new, seed=5), ignore_eos=True)
    task = asyncio.ensure_future(slime.generate(sp, input_ids=ids, rid="rl-abort-me"))
    await wait_running(slime.client, url, 1, 16, before)
    # slime/agent/adapters/common.py aborts one request: POST /abort_request {"rid": rid}.
    ack = await slime.post("/abort_request", {"rid": "rl-abort-me"})
    check("abort rid: {success: true}", ack.get("success") is True, json.dumps(ack))
    out = await asyncio.wait_for(task, TIMEOUT)
    meta = out["meta_info"]
    tokens, lps, status = Slime.parse(out)
    n = meta["completion_tokens"]
    check("abort rid: finish_reason type abort, status ABORTED", meta["finish_reason"]["type"] == "abort" and
          status == "ABORTED", json.dumps(meta["finish_reason"]))
    check("abort rid: a partial output (0 < %d < %d), one log-prob per token" % (n, max_new),
          0 < n < max_new and len(lps) == n == len(out["output_ids"]) and tokens == out["output_ids"])
    check("abort rid: meta_info.id is the rid", meta["id"] == "rl-abort-me", meta["id"])
    # The partial output is the start of the seeded sample: asking for exactly n tokens gives it again.
    again = await slime.generate(dict(sp, max_new_tokens=n), input_ids=ids)
    check("abort rid: partial == the first %d tokens of the same seeded sample (ids and bits)" % n,
          again["output_ids"] == tokens and same_bits(Slime.parse(again)[1], lps))
    m = await wait_idle(slime.client, url)
    check("abort rid: aborted count +1, no KV block used",
          m['epmoe_requests_total{outcome="aborted"}'] == before['epmoe_requests_total{outcome="aborted"}'] + 1,
          "%s -> %s" % (before['epmoe_requests_total{outcome="aborted"}'], m['epmoe_requests_total{outcome="aborted"}']))


@section("slime abort_all")
async def slime_abort_all(slime, url):
    before = await metrics(slime.client, url)
    prompts = [[100 + i, 200 + i, 300 + i] for i in range(3)]
    sp = dict(Slime.sampling_params(CONTEXT - 8), ignore_eos=True)
    tasks = [asyncio.ensure_future(slime.generate(sp, input_ids=p)) for p in prompts]
    await wait_running(slime.client, url, 3, 24, before)
    ack = await slime.abort_all()
    check("abort_all: {success: true}", ack.get("success") is True, json.dumps(ack))
    outs = await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT)
    for i, o in enumerate(outs):
        tokens, lps, status = Slime.parse(o)
        check("abort_all[%d]: status ABORTED with a partial output (%d tokens, log-probs aligned)" % (i, len(tokens)),
              status == "ABORTED" and 0 < len(tokens) < CONTEXT - 8 and len(lps) == len(tokens) ==
              o["meta_info"]["completion_tokens"], json.dumps(o["meta_info"]["finish_reason"]))
    m = await wait_idle(slime.client, url)
    check("abort_all: 3 more aborted, nothing running, no KV block used",
          m['epmoe_requests_total{outcome="aborted"}'] == before['epmoe_requests_total{outcome="aborted"}'] + 3)


@section("AReaL pause / continue")
async def areal_pause_continue(areal, slime, url):
    ids = [77, 1234, 2345, 56, 999]
    max_new = 3000  # ~2 s on this model: the pause lands well inside it
    async with aiohttp.ClientSession() as session:
        # Uninterrupted, greedy: the reference.
        ref = await areal.agenerate(session, ids, max_new, greedy=True, ignore_eos=True)
        check("AReaL: uninterrupted greedy run reaches length %d" % max_new, ref[3] == "length" and
              len(ref[0]) == max_new and len(ref[1]) == max_new, "%s, %d tokens" % (ref[3], len(ref[0])))
        # The same, paused mid-way (mode abort: the request comes back "abort" with its partial output),
        # a request sent while paused waits, then continue: agenerate resubmits prompt + partial output.
        areal.calls.clear()
        before = await metrics(slime.client, url)
        task = asyncio.ensure_future(areal.agenerate(session, ids, max_new, greedy=True, ignore_eos=True))
        await wait_running(slime.client, url, 1, 32, before)
        areal.paused.set()
        ack = await areal.pause_generation(session)
        check("pause_generation {}: success", isinstance(ack, dict) and ack.get("success") is True, ack)
        # The pause is acknowledged: what the server reports from now on says so.
        m = await metrics(slime.client, url)
        info = (await slime.client.get(url + "/server_info")).json()
        check("paused: right after the acknowledgement, /metrics epmoe_paused 1 and /server_info paused true",
              m["epmoe_paused"] == 1 and info.get("paused") is True,
              "epmoe_paused %s, server_info paused %s" % (m["epmoe_paused"], info.get("paused")))
        small = AReaL.generation_request([5, 6], 3, greedy=True, stop_token_ids=[PAD_ID, EOS_ID])
        waiting = asyncio.ensure_future(areal.request(session, "/generate", small))
        await asyncio.sleep(0.5)
        check("paused: a new request waits (not answered within 0.5 s)", not waiting.done())
        check("paused: the in-flight request came back 'abort' with a partial output",
              len(areal.calls) == 1 and areal.calls[0][0] == "abort" and 0 < areal.calls[0][1] < max_new,
              areal.calls)
        ack = await areal.continue_generation(session)
        check("continue_generation {}: success", isinstance(ack, dict) and ack.get("success") is True, ack)
        info = (await slime.client.get(url + "/server_info")).json()
        check("continued: right after the acknowledgement, /server_info paused false", info.get("paused") is False,
              info.get("paused"))
        areal.paused.clear()
        w = await asyncio.wait_for(waiting, TIMEOUT)
        check("continued: the request sent while paused is answered (3 tokens)",
              w["meta_info"]["completion_tokens"] == 3 and w["meta_info"]["finish_reason"]["type"] == "length",
              json.dumps(w["meta_info"]["finish_reason"]))
        got = await asyncio.wait_for(task, TIMEOUT)
        check("AReaL resubmitted: %d calls, the last to 'length'" % len(areal.calls),
              len(areal.calls) >= 2 and areal.calls[-1][0] == "length", areal.calls)
        check("AReaL resubmitted: %d tokens, stop_reason length" % len(got[0]),
              len(got[0]) == max_new and got[3] == "length", got[3])
        check("AReaL resubmitted: tokens == the uninterrupted run", got[0] == ref[0],
              next((i for i, (x, y) in enumerate(zip(got[0], ref[0])) if x != y), None))
        check("AReaL resubmitted: log-prob bits == the uninterrupted run (prefill of the partial == decode)",
              same_bits(got[1], ref[1]))


@section("slime weight sync")
async def slime_weight_sync(slime, url, v2):
    before = await metrics(slime.client, url)
    # A rollout in flight when the trainer syncs: pause_generation (mode abort) returns it aborted.
    inflight = asyncio.ensure_future(slime.generate(dict(Slime.sampling_params(CONTEXT - 8), ignore_eos=True),
                                                    input_ids=[3, 4, 5]))
    await wait_running(slime.client, url, 1, 16, before)
    # slime/ray/actor_group.py (disk update): pause -> flush_cache -> update_weights_from_disk -> continue.
    await asyncio.to_thread(slime.pause_generation)
    o = await asyncio.wait_for(inflight, TIMEOUT)
    check("weight sync: the in-flight rollout came back ABORTED on the old weights",
          Slime.parse(o)[2] == "ABORTED" and o["meta_info"]["weight_version"] == "default",
          json.dumps({k: o["meta_info"][k] for k in ("finish_reason", "weight_version")}))
    await asyncio.to_thread(slime.flush_cache)
    r = await asyncio.to_thread(slime.update_weights_from_disk, v2, "v2")
    check("update_weights_from_disk v2: success, weight_version v2",
          r.get("success") is True and r.get("weight_version") == "v2", json.dumps(r))
    version = await asyncio.to_thread(slime.get_weight_version)
    check("get_weight_version (slime): v2", version == "v2", version)
    await asyncio.to_thread(slime.continue_generation)
    g = await slime.generate(Slime.sampling_params(12, temperature=0.0), input_ids=GREEDY_IDS)
    toks, lps = check_output("v2 greedy", g, len(GREEDY_IDS), 12)
    check("v2: meta_info.weight_version v2", g["meta_info"]["weight_version"] == "v2", g["meta_info"]["weight_version"])
    check("v2: the same greedy request gives other log-probs (other weights)",
          not same_bits(lps, R["greedy"][1]), lps[:3])
    info = (await slime.client.get(url + "/model_info")).json()
    check("v2: /model_info weight_version v2", info.get("weight_version") == "v2", json.dumps(info))
    sinfo = (await slime.client.get(url + "/server_info")).json()
    check("v2: /server_info weight_version v2, not paused",
          sinfo.get("weight_version") == "v2" and sinfo.get("paused") is False, json.dumps(sinfo))
    R["v2_greedy"] = (toks, lps)


def odd_checkpoint(model):
    """The model's architecture with 16 experts instead of 8 (a checkpoint the server must refuse)."""
    cfg = json.load(open(os.path.join(model, "config.json")))
    assert cfg["num_experts"] == 8, cfg["num_experts"]
    cfg["num_experts"] = 16
    return synth_once(os.path.join(WORK, "text_model_16_experts"), cfg)


@section("refused update")
async def refused_update(slime, url, odd):
    await asyncio.to_thread(slime.pause_generation)
    r = await slime.client.post(url + "/update_weights_from_disk", json={"model_path": odd, "weight_version": "odd"})
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    msg = json.dumps(body)
    check("refused update (16 experts): HTTP 400", r.status_code == 400, "%d %s" % (r.status_code, r.text[:300]))
    check("refused update: success false, the message names num_experts (16 vs 8)",
          body.get("success") is False and "num_experts" in msg and "16" in msg and "8" in msg, msg)
    # slime's _make_request raises on it (raise_for_status).
    try:
        await asyncio.to_thread(slime.update_weights_from_disk, odd, "odd")
        raised = False
    except httpx.HTTPStatusError as e:
        raised = e.response.status_code == 400
    check("refused update: slime's update_weights_from_disk raises HTTPStatusError 400", raised)
    r = await slime.client.post(url + "/update_weights_from_disk", json={"model_path": "/nonexistent/epmoe-ckpt"})
    check("refused update (no such folder): HTTP 400 naming the path",
          r.status_code == 400 and "/nonexistent/epmoe-ckpt" in r.text, "%d %s" % (r.status_code, r.text[:300]))
    await asyncio.to_thread(slime.continue_generation)
    g = await slime.generate(Slime.sampling_params(12, temperature=0.0), input_ids=GREEDY_IDS)
    check("after the refusals: still serving the v2 weights (same ids and bits), weight_version v2",
          g["output_ids"] == R["v2_greedy"][0] and same_bits(Slime.parse(g)[1], R["v2_greedy"][1]) and
          g["meta_info"]["weight_version"] == "v2", g["meta_info"]["weight_version"])


@section("AReaL weight update")
async def areal_weight_update(areal, slime, url, model):
    async with aiohttp.ClientSession() as session:
        ids = [11, 12, 13, 14]
        before = await metrics(slime.client, url)
        areal.calls.clear()
        task = asyncio.ensure_future(areal.agenerate(session, ids, 3000, greedy=True, ignore_eos=True))
        await wait_running(slime.client, url, 1, 16, before)
        # RemoteInfEngine: pause_generation -> update_weights_from_disk (no weight_version) -> continue.
        areal.paused.set()
        await areal.pause_generation(session)
        r = await areal.update_weights_from_disk(session, model)
        check("AReaL update back to the first weights: success, weight_version kept (v2: none given)",
              isinstance(r, dict) and r.get("success") is True and r.get("weight_version") == "v2", json.dumps(r))
        await areal.continue_generation(session)
        areal.paused.clear()
        got = await asyncio.wait_for(task, TIMEOUT)
        check("AReaL across the update: aborted (v2), resubmitted (v2 kept), %d tokens, length" % len(got[0]),
              len(areal.calls) >= 2 and areal.calls[0][0] == "abort" and len(got[0]) == 3000 and got[3] == "length",
              areal.calls)
        # The first weights again: the very first greedy request's ids and bits.
        req = AReaL.generation_request(GREEDY_IDS, 12, greedy=True, stop_token_ids=[PAD_ID, EOS_ID])
        res = await areal.request(session, "/generate", req)
        out, lps, reason = AReaL.parse(res)
        check("AReaL after the update: greedy == the first weights' greedy (ids and bits)",
              out == R["greedy"][0] and same_bits(lps, R["greedy"][1]), "%s vs %s" % (out[:5], R["greedy"][0][:5]))


async def one_rank(model, v2, odd):
    with Server(model) as s:
        print("# 1 rank: %s" % s.url, flush=True)
        slime, areal = Slime(s.url), AReaL(s.url)
        try:
            await health(slime, areal)
            await slime_generate(slime)
            await list_request(slime)
            await rescoring(slime)
            await abort_by_rid(slime, s.url)
            await slime_abort_all(slime, s.url)
            await areal_pause_continue(areal, slime, s.url)
            await slime_weight_sync(slime, s.url, v2)
            await refused_update(slime, s.url, odd)
            await areal_weight_update(areal, slime, s.url, model)
            await wait_idle(slime.client, s.url)
        finally:
            await slime.close()
        check("1 rank: the server is alive at the end", s.alive())


# ------------------------------------------------------------------ 2 ranks, alltoall
@section("2 ranks")
async def two_ranks_body(slime, v2):
    # slime's core payloads: the same bits as 1 rank (expert parallelism, deterministic combine).
    sp = Slime.sampling_params(24, seed=11)
    a = await slime.generate(sp, text=PROMPT_TEXT)
    toks, lps = check_output("2 ranks text", a, len(R["prompt"]), 24)
    check("2 ranks: seeded sample == 1 rank (ids and fp32 bits)", toks == R["sample"] and same_bits(lps, R["sample_lps"]))
    group = await asyncio.gather(*[slime.generate(Slime.sampling_params(16, seed=1000 + i), input_ids=R["prompt"])
                                   for i in range(4)])
    check("2 ranks: the seeded group == 1 rank", [g["output_ids"] for g in group] == R["group"])
    g = await slime.generate(Slime.sampling_params(12, temperature=0.0), input_ids=GREEDY_IDS)
    check("2 ranks: greedy == 1 rank (ids and bits)",
          g["output_ids"] == R["greedy"][0] and same_bits(Slime.parse(g)[1], R["greedy"][1]))
    # slime's weight sync on every rank.
    await asyncio.to_thread(slime.pause_generation)
    await asyncio.to_thread(slime.flush_cache)
    r = await asyncio.to_thread(slime.update_weights_from_disk, v2, "v2")
    check("2 ranks: update_weights_from_disk v2 succeeds", r.get("success") is True, json.dumps(r))
    await asyncio.to_thread(slime.continue_generation)
    g = await slime.generate(Slime.sampling_params(12, temperature=0.0), input_ids=GREEDY_IDS)
    check("2 ranks v2: greedy == 1 rank v2 (ids and bits), weight_version v2",
          "v2_greedy" in R and g["output_ids"] == R["v2_greedy"][0] and
          same_bits(Slime.parse(g)[1], R["v2_greedy"][1]) and g["meta_info"]["weight_version"] == "v2")


async def two_ranks(model, v2):
    with Server(model, ranks=2, args=["--moe-a2a-backend", "alltoall"]) as s:
        print("# 2 ranks (alltoall): %s" % s.url, flush=True)
        slime = Slime(s.url)
        try:
            await two_ranks_body(slime, v2)
            await wait_idle(slime.client, s.url)
        finally:
            await slime.close()
        check("2 ranks: the server is alive at the end", s.alive())


def main():
    t0 = time.time()
    model = text_model()
    v2 = second_weights(model)
    odd = odd_checkpoint(model)
    for name, run in (("1 rank", lambda: one_rank(model, v2, odd)), ("2 ranks", lambda: two_ranks(model, v2))):
        try:
            asyncio.run(run())
        except Exception as e:  # noqa: BLE001 -- a server that did not start or stop cleanly
            check("%s: server ran and stopped cleanly" % name, False, "%s: %s" % (type(e).__name__, e))
    print("%d/%d checks passed in %.1f s" % (CHECKS[0] - len(FAILURES), CHECKS[0], time.time() - t0), flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
