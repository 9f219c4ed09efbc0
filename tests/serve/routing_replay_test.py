"""Routing replay over HTTP (tests/serve, ctest serve.routing_replay), with httpx as the client.

sglang's return_routed_experts (slime, miles, AReaL, verl read it): meta_info.routed_experts is the
base64 of int32 [seq_len - 1, MoE layers, top_k], the experts every fed token was routed to.
Checked here, on the tiny Qwen3-MoE (3 MoE layers, 8 experts, top-2):
  * the shape, and every id an expert; with return_routed_expert_weights the fp32 weights, each
    token's summing to 1 (norm_topk_prob);
  * a re-score of prompt + output (max_new_tokens 0) reports the rollout's routing bit for bit
    for every token the rollout fed, and the rollout's log-probs bit for bit;
  * alone == among 8 concurrent requests, and on 3 ranks (mpirun, alltoall and onesided) == 1 rank;
  * routed_experts_start_len k skips the first k tokens; n = 2 samples share the prompt's routing;
  * /v1/completions (also streamed): each choice's routed_experts == /generate's for the same ids;
  * without --enable-return-routed-experts the field is refused with a 400 naming it.
"""
import base64
import concurrent.futures
import json
import os
import struct
import sys

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

MODEL = os.path.join(h.DATA, "qwen3moe-tiny")
with open(os.path.join(MODEL, "config.json")) as f:
    CFG = json.load(f)
LAYERS, K, E = CFG["num_hidden_layers"], CFG["num_experts_per_tok"], CFG["num_experts"]  # every layer MoE
check = h.Checks()


def decode(b64, fmt):
    raw = base64.b64decode(b64)
    return list(struct.unpack("<%d%s" % (len(raw) // 4, fmt), raw))


def generate(url, body):
    r = httpx.post(url + "/generate", json=body, timeout=120)
    return r.status_code, r.json()


def rollout(url, prompt, seed, new=9, extra=None):
    body = {"input_ids": prompt, "return_logprob": True, "return_routed_experts": True,
            "return_routed_expert_weights": True,
            "sampling_params": {"max_new_tokens": new, "temperature": 0.9, "sampling_seed": seed, "ignore_eos": True}}
    body.update(extra or {})
    st, d = generate(url, body)
    assert st == 200, d
    return d


def routing(d):
    m = d["meta_info"]
    return decode(m["routed_experts"], "i"), decode(m["routed_expert_weights"], "I")  # weights as raw bits


def main():
    prompts = [[(7 * i + 3 * j) % 300 + 5 for j in range(5 + 3 * i)] for i in range(8)]
    with h.Server(MODEL, args=["--enable-return-routed-experts", "--max-batch-tokens", "16"]) as s:
        one = rollout(s.url, prompts[0], 11)
        ids, wbits = routing(one)
        P, N = len(prompts[0]), len(one["output_ids"])
        check(len(ids) == (P + N - 1) * LAYERS * K,
              "routed_experts is int32 [seq_len - 1, %d layers, top-%d]: %d values for %d + %d tokens"
              % (LAYERS, K, len(ids), P, N))
        check(all(0 <= e < E for e in ids), "every routed id is an expert")
        weights = [struct.unpack("<f", struct.pack("<I", b))[0] for b in wbits]
        sums = [sum(weights[t * K:(t + 1) * K]) for t in range(len(weights) // K)]
        check(all(abs(x - 1) < 1e-5 for x in sums), "each token's top-k weights sum to 1 (norm_topk_prob)")

        # Re-score prompt + output: every fed token's routing and the log-probs, bit for bit.
        st, rs = generate(s.url, {"input_ids": prompts[0] + one["output_ids"], "return_logprob": True,
                                  "logprob_start_len": 0, "return_routed_experts": True,
                                  "return_routed_expert_weights": True,
                                  "sampling_params": {"max_new_tokens": 0, "temperature": 0.9}})
        rids, rw = routing(rs)
        n = (P + N - 1) * LAYERS * K
        check(st == 200 and rids[:n] == ids and rw[:n] == wbits,
              "re-score of prompt + output: the rollout's routing, ids and weight bits")
        lp_roll = [struct.pack("<f", x[0]) for x in one["meta_info"]["output_token_logprobs"]]
        lp_score = [struct.pack("<f", x[0]) for x in rs["meta_info"]["input_token_logprobs"][P:]]
        check(lp_roll == lp_score, "re-score of prompt + output: the rollout's log-probs, bit for bit")

        # Alone == among 8 at once (continuous batching, chunked prefill of 16 tokens a step).
        alone = [routing(rollout(s.url, p, 100 + i)) for i, p in enumerate(prompts)]
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            together = list(ex.map(lambda a: routing(rollout(s.url, a[1], 100 + a[0])), enumerate(prompts)))
        check(alone == together, "8 requests at once: each one's routing == alone (ids and weight bits)")

        # routed_experts_start_len skips tokens; two samples share the prompt's routing.
        skip = rollout(s.url, prompts[0], 11, extra={"routed_experts_start_len": 4})
        check(routing(skip)[0] == ids[4 * LAYERS * K:], "routed_experts_start_len 4: the first 4 tokens left out")
        st, two = generate(s.url, {"input_ids": prompts[3], "return_routed_experts": True,
                                   "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "n": 2,
                                                       "sampling_seed": 5, "ignore_eos": True}})
        a, b = (decode(x["meta_info"]["routed_experts"], "i") for x in two)
        p3 = len(prompts[3]) * LAYERS * K
        check(st == 200 and a[:p3] == b[:p3] and len(a) == len(b) == (len(prompts[3]) + 5) * LAYERS * K,
              "n = 2: both samples report the prompt's routing, then their own")

        # The OpenAI routes: a completion's choice carries the routing /generate reports for the
        # same ids (greedy), and a stream's last chunk of the choice carries it too.
        g = rollout(s.url, prompts[1], 7, extra={"sampling_params": {"max_new_tokens": 5, "temperature": 0,
                                                                      "ignore_eos": True}})
        body = {"prompt": prompts[1], "max_tokens": 5, "temperature": 0, "ignore_eos": True,
                "return_routed_experts": True, "return_routed_expert_weights": True}
        c = httpx.post(s.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
        check(c.get("routed_experts") == g["meta_info"]["routed_experts"] and
              c.get("routed_expert_weights") == g["meta_info"]["routed_expert_weights"],
              "/v1/completions: the choice's routed_experts (and weights) == /generate's for the same ids")
        last = None
        with httpx.stream("POST", s.url + "/v1/completions", json=dict(body, stream=True), timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    ch = json.loads(line[6:])["choices"]
                    if ch and ch[0].get("finish_reason"):
                        last = ch[0]
        check(last is not None and last.get("routed_experts") == c["routed_experts"],
              "/v1/completions streamed: the last chunk carries the choice's routed_experts")

    # 3 ranks: every request's routing is the one rank's, bit for bit.
    for backend in ("alltoall", "onesided"):
        with h.Server(MODEL, ranks=3, args=["--enable-return-routed-experts", "--moe-a2a-backend", backend]) as s:
            with concurrent.futures.ThreadPoolExecutor(8) as ex:
                got = list(ex.map(lambda a: routing(rollout(s.url, a[1], 100 + a[0])), enumerate(prompts)))
            check(got == alone, "3 ranks, %s: every request's routing == 1 rank's (ids and weight bits)" % backend)

    # Not enabled: refused, naming the field.
    with h.Server(MODEL) as s:
        st, d = generate(s.url, {"input_ids": prompts[0], "return_routed_experts": True})
        check(st == 400 and d.get("error", {}).get("param") == "return_routed_experts",
              "without --enable-return-routed-experts: 400 naming return_routed_experts (%s)" % st)
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
