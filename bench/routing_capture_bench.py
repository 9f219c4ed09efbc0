"""What recording the routed experts costs a rollout: `epmoe serve --enable-return-routed-experts` on
MODEL under a closed loop of /generate requests at concurrency 1 and 32 (random prompts of 64-128
ids, 32 greedy tokens, ignore_eos), every request with and without return_routed_experts, the two
interleaved level by level. Prints output tok/s of each and their ratio. (A request that records
its routing computes its whole prompt -- no prefix reuse -- which these random prompts never get
anyway.) Printed, never asserted.

  python3 bench/routing_capture_bench.py --epmoe build/epmoe --model DIR [--levels 1,32] [--requests 64]
      [--serve-args '--device cuda']
"""
import argparse
import concurrent.futures
import os
import random
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_process import start_serve  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epmoe", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--levels", default="1,32")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--serve-args", default="", help="more flags for epmoe serve, e.g. '--device cuda'")
    a = ap.parse_args()
    proc, url = start_serve([a.epmoe, "serve", "--model", a.model, "--port", "0",
                             "--enable-return-routed-experts", "--no-prefix-cache"] + a.serve_args.split())
    try:
        vocab = httpx.get(url + "/model_info", timeout=60).json()["vocab_size"]
        for level in [int(x) for x in a.levels.split(",")]:
            n = max(a.requests, 2 * level)
            rng = random.Random(level)
            prompts = [[rng.randrange(vocab) for _ in range(rng.randint(64, 128))] for _ in range(n)]
            rates = {False: [], True: []}
            for _ in range(a.rounds):
                for capture in (False, True):
                    def one(p):
                        body = {"input_ids": p, "sampling_params": {"max_new_tokens": a.tokens, "temperature": 0,
                                                                     "ignore_eos": True}}
                        if capture:
                            body["return_routed_experts"] = True
                        d = httpx.post(url + "/generate", json=body, timeout=3600).json()
                        assert "output_ids" in d, d
                        assert len(d["output_ids"]) == a.tokens and (not capture or "routed_experts" in d["meta_info"])
                    t0 = time.time()
                    with concurrent.futures.ThreadPoolExecutor(level) as ex:
                        list(ex.map(one, prompts))
                    rates[capture].append(n * a.tokens / (time.time() - t0))
            off, on = sorted(rates[False]), sorted(rates[True])
            print("concurrency %d, %d requests x %d tokens, %d rounds: output tok/s without %s, with %s; "
                  "with / without (medians) %.3f" % (level, n, a.tokens, a.rounds, ["%.1f" % r for r in off],
                                                     ["%.1f" % r for r in on], on[len(on) // 2] / off[len(off) // 2]))
            sys.stdout.flush()
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
