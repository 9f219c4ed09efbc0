"""The on-policy guarantee over HTTP (tests/serve, ctest serve.guarantee).

A request's output ids and output_token_logprobs are the same bits
  * alone and among 32 concurrent requests (continuous batching, chunked prefill, prefix reuse),
  * on 1 rank and on 3 ranks (mpirun) with every all-to-all backend,
and re-scoring prompt + output through /generate (max_new_tokens 0, return_logprob,
logprob_start_len 0) gives, in input_token_logprobs, the same bits as the first call's
output_token_logprobs. Every log-prob in the JSON is written with at most 9 significant digits and
reads back as the fp32 the engine computed (checked on the raw text).
"""
import json
import os
import random
import struct
import sys
import threading
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

MODEL = os.path.join(h.DATA, "qwen3moe-tiny")  # vocabulary 320, eos 2, 8 experts
# (On a GPU machine: EPMOE_SERVE_DEVICE=cuda EPMOE_SERVE_RANKS=2 EPMOE_SERVE_BACKENDS=none,alltoall,lowlatency.)
BACKENDS = os.environ.get("EPMOE_SERVE_BACKENDS", "none,alltoall,lowlatency,onesided,fused").split(",")
RANKS = int(os.environ.get("EPMOE_SERVE_RANKS", "3"))
check = h.Checks()


def f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def f32_bits(values):
    return [struct.pack("<f", float(v)) for v in values]


def shortest_f32_text_ok(text):
    """The decimal is the shortest one (at most 9 significant digits) that reads back as its fp32."""
    v = f32(text)
    for d in range(1, 10):
        if f32("%.*g" % (d, v)) == v:
            return float(text) == float("%.*g" % (d, v))
    return False


def post_raw(url, body):
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read().decode()


def make_requests():
    rng = random.Random(1234)
    reqs = []
    for i in range(32):
        plen = rng.randint(1, 41)
        prompt = [rng.randrange(3, 320) for _ in range(plen)]
        if i % 4 == 1 and reqs:  # a shared prefix with an earlier request (prefix cache hits)
            prompt = reqs[-1]["input_ids"][:16] + prompt
        sp = {"max_new_tokens": rng.randint(4, 14), "temperature": 0.0 if i % 5 == 0 else 0.8,
              "sampling_seed": 1000 + i}
        if i % 7 == 3:
            sp["top_k"] = 20
        if i % 6 == 2:
            sp["top_p"] = 0.9
        if i % 3 == 0:
            sp["ignore_eos"] = True
        reqs.append({"input_ids": prompt, "sampling_params": sp, "return_logprob": True,
                     "rid": "g%d" % i})
    return reqs


def result(raw):
    """(output ids, fp32 bits of the output log-probs, raw decimal texts) of one response."""
    d = json.loads(raw, parse_float=lambda s: s)
    texts = [x[0] for x in d["meta_info"]["output_token_logprobs"]]
    ids = [x[1] for x in d["meta_info"]["output_token_logprobs"]]
    check(ids == d["output_ids"], "output_token_logprobs ids are output_ids (%s)" % d["meta_info"]["id"])
    return d["output_ids"], f32_bits(texts), texts, d


def run_concurrently(url, reqs):
    out = [None] * len(reqs)
    errors = []

    def one(i):
        try:
            out[i] = post_raw(url, reqs[i])
        except Exception as e:  # reported below
            errors.append("request %d: %s" % (i, e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, "32 concurrent requests answered (%s)" % "; ".join(errors[:3]))
    return out


def main():
    reqs = make_requests()
    # ---- 1 rank: alone, then 32 at once, then re-scored ----
    with h.Server(MODEL, ranks=1, args=["--max-batch-tokens", "64"]) as s:
        alone = [result(post_raw(s.url, r)) for r in reqs]
        for ids, _, texts, d in alone:
            check(all(shortest_f32_text_ok(t) for t in texts), "log-probs of %s are shortest fp32 decimals"
                  % d["meta_info"]["id"])
        together = [result(raw) for raw in run_concurrently(s.url, reqs)]
        same = sum(a[0] == b[0] and a[1] == b[1] for a, b in zip(alone, together))
        check(same == len(reqs), "1 rank: %d/%d requests bit-identical alone and among 32" % (same, len(reqs)))
        # Re-scoring prompt + output: input_token_logprobs from the prompt's end are the output's bits.
        rescored = 0
        for r, (ids, bits, _, d) in zip(reqs, alone):
            body = {"input_ids": r["input_ids"] + ids, "return_logprob": True, "logprob_start_len": 0,
                    "sampling_params": {"max_new_tokens": 0, "temperature": r["sampling_params"]["temperature"]}}
            dd = json.loads(post_raw(s.url, body), parse_float=lambda x: x)
            inp = dd["meta_info"]["input_token_logprobs"]
            P = len(r["input_ids"])
            ok = len(inp) == P + len(ids) and inp[0][0] is None and [x[1] for x in inp] == r["input_ids"] + ids
            ok = ok and f32_bits([x[0] for x in inp[P:]]) == bits and dd["output_ids"] == []
            rescored += ok
        check(rescored == len(reqs), "re-scoring prompt + output gives the output's log-prob bits (%d/%d)"
              % (rescored, len(reqs)))
        m = s.wait_idle()
        check(m["epmoe_cached_tokens_total"] > 0, "the prefix cache was hit (cached tokens %d)"
              % m["epmoe_cached_tokens_total"])
    # ---- R ranks (3), every backend: 32 at once, the same bits as 1 rank alone ----
    for backend in BACKENDS:
        with h.Server(MODEL, ranks=RANKS, args=["--moe-a2a-backend", backend, "--max-batch-tokens", "64"]) as s:
            together = [result(raw) for raw in run_concurrently(s.url, reqs)]
            same = sum(a[0] == b[0] and a[1] == b[1] for a, b in zip(alone, together))
            check(same == len(reqs), "%d ranks, %s: %d/%d requests bit-identical to 1 rank alone"
                  % (RANKS, backend, same, len(reqs)))
            if backend == "alltoall":
                r, (ids, bits, _, _) = reqs[5], alone[5]
                body = {"input_ids": r["input_ids"] + ids, "return_logprob": True, "logprob_start_len": 0,
                        "sampling_params": {"max_new_tokens": 0, "temperature": r["sampling_params"]["temperature"]}}
                inp = json.loads(post_raw(s.url, body), parse_float=lambda x: x)["meta_info"]["input_token_logprobs"]
                check(f32_bits([x[0] for x in inp[len(r["input_ids"]):]]) == bits,
                      "%d ranks, alltoall: re-scoring gives the 1-rank output bits" % RANKS)
            s.wait_idle()
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
