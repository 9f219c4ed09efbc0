"""Penalties, logit_bias and min_new_tokens in `epmoe serve` (tests/serve, ctest serve.sampling_fields;
httpx). They change what the draws see (engine/sampling.h: process_logits), never the log-probs
reported, and keep the sampling guarantee. Checked with the text model:
  * logit_bias +100 forces a token, -100 bans one (/generate and /v1/completions);
  * min_new_tokens / min_tokens: with eos forced by its bias, the sample still runs its minimum;
  * frequency / presence / repetition penalties change a greedy continuation that repeats itself,
    and reduce its repetitions;
  * the log-probs reported are the model's: re-scoring prompt + output gives the same bits;
  * the same bits alone and among 16 concurrent requests, on 1 rank and on 3 (alltoall);
  * token_ids_logprob and input_top_logprobs at every position, agreeing with the other log-probs;
  * return_sampling_mask: per token the ids its draw could pick -- greedy: the token; top_k: the k
    most likely (the top-N list); top_k + top_p: the shortest prefix of them reaching top_p; a
    forced token alone -- holding the drawn token; refused without a bound on the support;
  * bad values are refused naming the field.
"""
import collections
import concurrent.futures
import json
import math
import os
import struct
import sys

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

check = h.Checks()
EOS = 2  # the text model's <|im_end|>


def gen(url, body):
    r = httpx.post(url + "/generate", json=body, timeout=300)
    check(r.status_code == 200, "200 for %s (%s)" % (body.get("sampling_params"), r.text[:200]))
    return r.json()


def bits(d):
    return [struct.pack("<f", x[0]) for x in d["meta_info"]["output_token_logprobs"]]


def main():
    model = h.text_model()
    prompt = "the cat sat on the mat and then"
    base = {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}
    with h.Server(model) as s:
        url = s.url
        plain = gen(url, {"text": prompt, "sampling_params": base, "return_logprob": True})
        ids = plain["output_ids"]
        counts = collections.Counter(ids)
        top, top_n = counts.most_common(1)[0]
        check(top_n >= 3, "the plain greedy continuation repeats a token (%d x %d): the penalties have work" % (top, top_n))

        forced = gen(url, {"text": prompt, "sampling_params": dict(base, max_new_tokens=8, logit_bias={"7": 100})})
        check(forced["output_ids"] == [7] * 8, "logit_bias +100 forces token 7: %s" % forced["output_ids"])
        banned = gen(url, {"text": prompt, "sampling_params": dict(base, logit_bias={str(top): -100})})
        check(top not in banned["output_ids"], "logit_bias -100 bans token %d" % top)
        r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 6, "temperature": 0,
                                                       "logit_bias": {"9": 100}, "return_token_ids": True},
                       timeout=60).json()
        check(r["choices"][0]["token_ids"] == [9] * 6, "/v1/completions logit_bias forces token 9: %s" % r["choices"])

        # eos forced by its bias: without a minimum the sample ends at once; with one it runs it.
        sp = {"max_new_tokens": 20, "temperature": 0, "logit_bias": {str(EOS): 100}}
        d = gen(url, {"text": prompt, "sampling_params": sp})
        check(d["output_ids"] == [EOS], "eos forced: one token (%s)" % d["output_ids"])
        d = gen(url, {"text": prompt, "sampling_params": dict(sp, min_new_tokens=5)})
        check(len(d["output_ids"]) == 6 and EOS not in d["output_ids"][:5] and d["output_ids"][5] == EOS and
              d["meta_info"]["finish_reason"]["type"] == "stop",
              "min_new_tokens 5: five tokens, then eos (%s)" % d["output_ids"])
        r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 20, "temperature": 0,
                                                       "logit_bias": {str(EOS): 100}, "min_tokens": 3,
                                                       "return_token_ids": True}, timeout=60).json()
        check(len(r["choices"][0]["token_ids"]) == 4, "/v1/completions min_tokens 3: %s" % r["choices"][0]["token_ids"])

        # Penalties: a repetitive greedy continuation changes and repeats less.
        for name, value in (("frequency_penalty", 1.5), ("presence_penalty", 1.5), ("repetition_penalty", 1.8)):
            d = gen(url, {"text": prompt, "sampling_params": dict(base, **{name: value}), "return_logprob": True})
            worst = max(collections.Counter(d["output_ids"]).values())
            check(d["output_ids"] != ids and worst < top_n,
                  "%s %s: another continuation, at most %d of one token (plain: %d)" % (name, value, worst, top_n))
            # The log-probs are the model's: re-scoring prompt + output gives the reported bits.
            P = d["meta_info"]["prompt_tokens"]
            pids = httpx.post(url + "/tokenize", json={"prompt": prompt}, timeout=30).json()["tokens"]
            rs = gen(url, {"input_ids": pids + d["output_ids"], "return_logprob": True, "logprob_start_len": 0,
                           "sampling_params": {"max_new_tokens": 0, "temperature": 0}})
            got = [struct.pack("<f", x[0]) for x in rs["meta_info"]["input_token_logprobs"][P:]]
            check(got == bits(d), "%s: the reported log-probs are the model's (re-scored: the same bits)" % name)

        # token_ids_logprob and the prompt's top-N: the ids asked for at every output and prompt
        # position, the same numbers as the top-N / the token's own log-prob where they meet.
        pids = httpx.post(url + "/tokenize", json={"prompt": prompt}, timeout=30).json()["tokens"]
        want = [5, 7, 11]
        d = gen(url, {"input_ids": pids, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 3,
                      "token_ids_logprob": want, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
        mi = d["meta_info"]
        outs, ins, tops = mi["output_token_ids_logprobs"], mi["input_token_ids_logprobs"], mi["input_top_logprobs"]
        check(len(outs) == 6 and all([t[1] for t in step] == want for step in outs),
              "output_token_ids_logprobs: the 3 ids at each of 6 tokens")
        check(len(ins) == len(pids) and ins[0] is None and all([t[1] for t in step] == want for step in ins[1:]),
              "input_token_ids_logprobs: the 3 ids at each prompt position, null first")
        check(len(tops) == len(pids) and tops[0] is None and all(len(t) == 3 for t in tops[1:]),
              "input_top_logprobs: 3 alternatives at each prompt position, null first")
        agree = True
        for k in range(1, len(pids)):  # where a top-N id is one asked for, the same number
            for lp, tid, _ in tops[k]:
                for lp2, tid2, _ in ins[k]:
                    agree &= tid != tid2 or lp == lp2
            agree &= tops[k][0][0] >= max(t[0] for t in ins[k])
        for step, tok in zip(outs, mi["output_token_logprobs"]):
            for lp, tid, _ in step:
                agree &= tid != tok[1] or lp == tok[0]
        check(agree, "the asked ids' log-probs agree with the top-N and the drawn tokens'")
        r = httpx.post(url + "/generate", json={"input_ids": pids, "token_ids_logprob": [5]}, timeout=30)
        check(r.status_code == 400 and "token_ids_logprob" in r.text, "token_ids_logprob without return_logprob: 400")

        # The sampling mask: what each draw could have picked.
        d = gen(url, {"input_ids": pids, "return_sampling_mask": True,
                      "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
        check(d["meta_info"]["sampling_mask"] == [[t] for t in d["output_ids"]],
              "sampling mask, greedy: the token itself at each of 6 steps")
        d = gen(url, {"input_ids": pids, "return_sampling_mask": True, "return_logprob": True, "top_logprobs_num": 5,
                      "sampling_params": {"max_new_tokens": 8, "temperature": 0.9, "top_k": 5, "sampling_seed": 4}})
        masks, tops = d["meta_info"]["sampling_mask"], d["meta_info"]["output_top_logprobs"]
        check(len(masks) == 8 and all(m == sorted(t[1] for t in top) and tok in m
                                      for m, top, tok in zip(masks, tops, d["output_ids"])),
              "sampling mask, top_k 5: the 5 most likely ids (the top-5 list), the drawn token among them")
        # The OpenAI routes (vLLM's per-choice sampling_mask): the same masks for the same draw, streamed
        # on the choice's last chunk.
        body = {"prompt": pids, "max_tokens": 8, "temperature": 0.9, "top_k": 5, "seed": 4,
                "return_sampling_mask": True, "return_token_ids": True}
        c = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
        check(c["sampling_mask"] == masks and c["token_ids"] == d["output_ids"],
              "/v1/completions sampling_mask == /generate's for the same draw")
        with httpx.stream("POST", url + "/v1/completions", json=dict(body, stream=True), timeout=60) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        streamed = [ch["choices"][0]["sampling_mask"] for ch in chunks
                    if ch.get("choices") and "sampling_mask" in ch["choices"][0]]
        check(streamed == [masks], "streamed: the masks once, on the last chunk of the choice")
        d = gen(url, {"input_ids": pids, "return_sampling_mask": True, "return_logprob": True, "top_logprobs_num": 20,
                      "sampling_params": {"max_new_tokens": 8, "temperature": 0.05, "top_k": 20, "top_p": 0.5,
                                          "sampling_seed": 5}})
        masks, tops = d["meta_info"]["sampling_mask"], d["meta_info"]["output_top_logprobs"]
        ok, sizes = len(masks) == 8, []
        for m, top, tok in zip(masks, tops, d["output_ids"]):
            n = len(m)
            sizes.append(n)
            mass = [math.exp(t[0]) for t in top]  # (log-probs at the request's temperature, as the masks)
            ok &= tok in m and sorted(t[1] for t in top[:n]) == m
            ok &= n == 20 or (sum(mass[:n]) >= 0.5 - 1e-5 and sum(mass[:n - 1]) < 0.5 + 1e-5)
        check(ok and min(sizes) < 20, "sampling mask, top_k 20 + top_p 0.5: the shortest prefix of the top 20 "
                                      "reaching 0.5 (sizes %s), the drawn token in it" % sizes)
        d = gen(url, {"input_ids": pids, "return_sampling_mask": True,
                      "sampling_params": {"max_new_tokens": 3, "temperature": 0.7, "top_k": 50, "top_p": 0.9,
                                          "logit_bias": {"7": 100}}})
        check(d["meta_info"]["sampling_mask"] == [[7]] * 3, "sampling mask with token 7 forced by its bias, top_p 0.9: "
                                                            "[7] (the row the draw saw): %s" % d["meta_info"]["sampling_mask"])
        r = httpx.post(url + "/generate", json={"input_ids": pids, "return_sampling_mask": True,
                                                "sampling_params": {"temperature": 0.8}}, timeout=30)
        check(r.status_code == 400 and "return_sampling_mask" in r.text and "top_k" in r.text,
              "return_sampling_mask sampled without top_k: 400 naming it (%s)" % r.text[:160])

        # Refusals name the field.
        for sp, field in (({"frequency_penalty": 3}, "frequency_penalty"), ({"repetition_penalty": 0}, "repetition_penalty"),
                          ({"logit_bias": {"x": 1}}, "logit_bias"), ({"logit_bias": {"5": 101}}, "logit_bias"),
                          ({"logit_bias": {"99999": 1}}, "logit_bias"),
                          ({"min_new_tokens": 9, "max_new_tokens": 4}, "min_new_tokens")):
            r = httpx.post(url + "/generate", json={"text": prompt, "sampling_params": sp}, timeout=30)
            check(r.status_code == 400 and field in r.text, "%s refused naming %s: %s" % (sp, field, r.text[:160]))

    # The sampling guarantee with penalties: alone == among others, 1 rank == 3 ranks.
    reqs = []
    for i in range(16):
        sp = {"max_new_tokens": 12 + i % 5, "temperature": 0.0 if i % 3 == 0 else 0.9, "sampling_seed": 900 + i,
              "ignore_eos": i % 2 == 0, "frequency_penalty": 0.1 * (i % 7), "presence_penalty": -0.2 * (i % 3),
              "repetition_penalty": 1.0 + 0.1 * (i % 4), "min_new_tokens": i % 6,
              "logit_bias": {str(3 + i): 2.5, str(EOS): 1.0}}
        if i % 4 == 1:
            sp["n"] = 2
        body = {"text": "the %s %s" % (["cat", "mat", "dog"][i % 3], "ran " * (i % 5)), "sampling_params": sp,
                "return_logprob": True}
        if i % 4 == 2:  # and the sampling mask (top_k bounds it)
            sp["top_k"] = 6 + i % 3
            body["return_sampling_mask"] = True
        reqs.append(body)

    def results(d):
        return [(x["output_ids"], bits(x), x["meta_info"].get("sampling_mask"))
                for x in (d if isinstance(d, list) else [d])]

    with h.Server(model) as s:
        alone = [results(gen(s.url, b)) for b in reqs]
    for ranks in (1, 3):
        args = ["--moe-a2a-backend", "alltoall"] if ranks > 1 else []
        with h.Server(model, ranks=ranks, args=args) as s:
            with concurrent.futures.ThreadPoolExecutor(len(reqs)) as ex:
                together = [results(f.result()) for f in [ex.submit(gen, s.url, b) for b in reqs]]
            same = sum(a == b for a, b in zip(alone, together))
            check(same == len(reqs), "%d rank(s), 16 at once with penalties: %d/%d == alone" % (ranks, same, len(reqs)))
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
