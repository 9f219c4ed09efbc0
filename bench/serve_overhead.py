"""Where one sequence's token goes in `epmoe serve`: the client's inter-token latency beside the
engine's step and the model's forward (from /metrics), one request at a time.

For each mode (greedy; greedy with `logprobs` 0, 1 and 5: the chosen token's log-prob, then also
the 1 or 5 most likely alternatives), REQS streaming /v1/completions requests of
TOKENS output tokens on a prompt of PROMPT random ids, one after another. Prints per mode: ITL
median and p90 (client, between token chunks), and over the same requests the engine's seconds per
step and the forward's (epmoe_step_seconds_total / epmoe_forward_seconds_total / epmoe_steps_total
deltas, prefill steps included, so slightly above a decode step). ITL - step is the time outside
the engine's step: the serving loop, the HTTP stream, the client. Printed, never asserted.

  python3 bench/serve_overhead.py --epmoe BIN --model DIR [--serve-args "--device cuda"] [--reqs 6]
"""
import argparse
import json
import os
import random
import re
import shlex
import statistics
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_process import start_serve  # noqa: E402


def metrics(url):
    text = httpx.get(url + "/metrics", timeout=30).text
    out = {}
    for name in ("epmoe_steps_total", "epmoe_step_seconds_total", "epmoe_forward_seconds_total"):
        m = re.search(r"^%s(?:\{[^}]*\})? ([0-9.eE+-]+)$" % name, text, re.M)
        out[name] = float(m.group(1)) if m else float("nan")
    return out


def one(url, model, prompt, tokens, logprobs=None):
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    if logprobs is not None:
        body["logprobs"] = logprobs
    arrivals = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            line = line.strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                d = json.loads(line[6:])
                if d.get("choices") and d["choices"][0].get("text") is not None:
                    arrivals.append(time.perf_counter())
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epmoe", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--serve-args", default="")
    ap.add_argument("--reqs", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    a = ap.parse_args()
    proc, url = start_serve([a.epmoe, "serve", "--model", a.model, "--port", "0"] + shlex.split(a.serve_args))
    try:
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        vocab = httpx.get(url + "/model_info", timeout=30).json()["vocab_size"]
        rng = random.Random(1)

        def prompt():
            return [rng.randrange(vocab // 8, vocab - 1) for _ in range(a.prompt)]
        one(url, model, prompt(), 8)  # warm-up (graphs)
        print("| mode | ITL median ms | ITL p90 ms | engine step ms | forward ms | ITL - step ms |")
        print("|---|---|---|---|---|---|")
        for logprobs in (None, 0, 1, 5):
            m0 = metrics(url)
            gaps = []
            for _ in range(a.reqs):
                gaps += one(url, model, prompt(), a.tokens, logprobs)
            m1 = metrics(url)
            if not gaps:
                sys.exit("serve_overhead: no tokens came back")
            steps = m1["epmoe_steps_total"] - m0["epmoe_steps_total"]
            step = (m1["epmoe_step_seconds_total"] - m0["epmoe_step_seconds_total"]) / steps * 1e3
            fwd = (m1["epmoe_forward_seconds_total"] - m0["epmoe_forward_seconds_total"]) / steps * 1e3
            gaps.sort()
            itl = statistics.median(gaps) * 1e3
            print("| %s | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
                "greedy" if logprobs is None else "greedy, logprobs %d" % logprobs, itl, gaps[int(0.9 * (len(gaps) - 1))] * 1e3, step, fwd,
                itl - step), flush=True)
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
