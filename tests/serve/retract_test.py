"""/pause_generation mode "retract" (tests/serve, ctest serve.retract), with httpx.

Requests running when the server is paused with retract give their KV blocks back and wait outside
the scheduler; on /continue_generation each unfinished sample continues from its tokens so far.
Checked on 1 rank and on 3 ranks (alltoall):
  * while retracted no KV block is held and the requests count as waiting (/v1/loads);
  * after continue every request's tokens and log-prob bits are those of the same request run
    alone, never paused -- greedy and sampled, n = 1 and n = 2, with and without penalties (which
    count the tokens generated before the pause), samples that finished before it keeping their
    result;
  * an update of the weights while retracted does not wait for them (it answers), and continue
    then finishes them.
"""
import concurrent.futures
import os
import re
import struct
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402

MODEL = os.path.join(h.DATA, "qwen3moe-tiny")
check = h.Checks()


# Long enough to be running when the pause comes (the tiny model decodes fast); under the
# sanitizers (scripts/test-sanitize.sh sets ASAN_OPTIONS) everything is ~10x slower, so shorter.
BASE = 400 if "ASAN_OPTIONS" in os.environ else 3000


def requests():
    out = []
    for i in range(6):
        sp = {"max_new_tokens": BASE + BASE // 20 * i, "ignore_eos": True, "sampling_seed": 50 + i,
              "temperature": 0.0 if i % 3 == 0 else 0.8}
        if i in (2, 5):
            sp["n"] = 2
        if i == 4:
            sp["max_new_tokens"] = 3  # finished before the pause
        # Penalties count the sample's output: a continued sample must still count the tokens it
        # generated before the pause (they are now in its prompt) to draw what it would have drawn.
        if i == 1:
            sp.update(frequency_penalty=0.7, presence_penalty=0.3)
        if i == 2:
            sp.update(frequency_penalty=0.5, repetition_penalty=1.3)
        out.append({"input_ids": [(13 * i + 7 * j) % 300 + 5 for j in range(4 + 3 * i)], "return_logprob": True,
                    "sampling_params": sp})
    return out


def result(d):
    items = d if isinstance(d, list) else [d]
    return [(x["output_ids"], [struct.pack("<f", t[0]) for t in x["meta_info"]["output_token_logprobs"]],
             x["meta_info"]["finish_reason"]["type"]) for x in items]


def loads(url):
    """/v1/loads summed over the ranks (one entry per rank: each serves its own requests)."""
    entries = httpx.get(url + "/v1/loads", timeout=10).json()["loads"]
    return {k: sum(e[k] for e in entries) for k in ("num_running_reqs", "num_waiting_reqs", "num_tokens")}


def run(url, reqs, during=None):
    """Every request at once; `during(url)` runs once they are all generating."""
    # One client (one connection pool) for the batch, as an RL framework holds one.
    with httpx.Client(timeout=300, trust_env=False, limits=httpx.Limits(max_connections=len(reqs))) as c, \
            concurrent.futures.ThreadPoolExecutor(len(reqs)) as ex:
        futs = [ex.submit(lambda b: c.post(url + "/generate", json=b).json(), b) for b in reqs]
        if during:
            deadline = time.time() + 30
            while time.time() < deadline:
                ld = loads(url)
                if ld["num_running_reqs"] >= 4:
                    break
                time.sleep(0.01)
            during(url)
        return [result(f.result()) for f in futs]


def main():
    reqs = requests()
    v2 = h.second_weights(MODEL)
    with h.Server(MODEL) as s:
        alone = [result(httpx.post(s.url + "/generate", json=b, timeout=300).json()) for b in reqs]

    for ranks in (1, 3):
        tag = "%d rank(s)" % ranks
        args = ["--max-batch-tokens", "16"] + (["--moe-a2a-backend", "alltoall"] if ranks > 1 else [])
        with h.Server(MODEL, ranks=ranks, args=args) as s:
            # The tiny model finishes these in about a second: a round whose pause came after most
            # of them ended (the reply counts the samples retracted) is run again, up to 5 times.
            for attempt in range(5):
                seen = {}

                def pause_continue(url):
                    r = httpx.post(url + "/pause_generation", json={"mode": "retract"}, timeout=60)
                    seen["loads"] = loads(url)
                    seen["pause"] = (r.status_code, r.json().get("message", ""))
                    httpx.post(url + "/continue_generation", timeout=60)

                got = run(s.url, reqs, pause_continue)
                m = re.search(r"(\d+) sample\(s\) retracted", seen.get("pause", (0, ""))[1])
                if m and int(m.group(1)) >= 4:
                    break
            ld = seen.get("loads", {})
            check(seen.get("pause", (0,))[0] == 200 and m and int(m.group(1)) >= 4 and ld.get("num_tokens") == 0 and
                  ld.get("num_running_reqs") == 0 and ld.get("num_waiting_reqs", 0) >= 4,
                  "%s: retracted (%s) -- no KV tokens in use, the requests waiting (%s)"
                  % (tag, seen.get("pause"), ld))
            check(got == alone, "%s: after continue every request == alone, never paused (tokens, log-prob bits)" % tag)
            check(s.wait_idle()['epmoe_kv_blocks{state="used"}'] == 0, "%s: idle afterwards, no block held" % tag)

            # An update while retracted answers (the retracted requests are not in flight), and
            # continue finishes them.
            upd = {}

            def pause_update_continue(url):
                httpx.post(url + "/pause_generation", json={"mode": "retract"}, timeout=60)
                r = httpx.post(url + "/update_weights_from_disk", json={"model_path": v2, "weight_version": "v2"},
                               timeout=60)
                upd["status"] = r.status_code
                httpx.post(url + "/continue_generation", timeout=60)

            after = run(s.url, reqs, pause_update_continue)
            check(upd.get("status") == 200, "%s: update_weights_from_disk while retracted answers 200" % tag)
            check(len(after) == len(reqs) and all(len(r) >= 1 and len(r[0][0]) > 0 for r in after),
                  "%s: after the update and continue every request finished" % tag)
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
