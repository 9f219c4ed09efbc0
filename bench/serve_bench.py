#!/usr/bin/python3
"""serve_bench: closed-loop load generator for OpenAI-compatible streaming /v1/completions servers
(epmoe serve, llama-server, vLLM, sglang), with an "identical" column: does a request's output
under load equal, bit for bit, the same request's output when it runs alone?

Debian's /usr/bin/python3 with the standard library and aiohttp (python3-aiohttp) only.

  serve_bench.py run   --url http://127.0.0.1:PORT --label NAME [--levels 1,8,32,128] ...
  serve_bench.py table RESULT.json|DIR ... [--ratio LABEL_A LABEL_B]

run
  For each concurrency level C (default 1, 8, 32, 128) it sends R requests (default max(2C, 16))
  with C of them in flight at all times (closed loop: the next request starts as soon as one
  finishes; no arrival-rate pacing). Each request is a streaming POST /v1/completions:
      {"prompt": [random token ids], "max_tokens": N, "temperature": T, "ignore_eos": true,
       "stream": true, "stream_options": {"include_usage": true}}
  plus "seed" (per request, fixed) when T > 0 and "logprobs": 1 when asked (--logprobs or
  --check-alone). Prompts have random lengths in [--prompt-len-min, --prompt-len-max] and ids in
  [--vocab-min, --vocab-max); they come from a fixed seed per level (--seed + C), so two servers
  (or two runs) get the same prompts. One sequential warm-up request (its own prompt) precedes
  each level and is not measured.

  Per request: TTFT (send -> first token chunk), inter-token latencies (gaps between consecutive
  token chunks), E2E (send -> end of stream), output tokens (usage.completion_tokens; a request
  whose count is not N, or that has no usage, fails unless --allow-short / --allow-no-usage).
  A request also fails on a connection error, a non-200 status, an "error" object in the stream,
  no token chunk, no "data: [DONE]", or a timeout (--timeout per request; --level-deadline and
  --deadline bound a level and the whole run: requests still running then are cancelled and
  counted as failed, later levels are skipped). Failures are counted, never fatal.

  Per level: request throughput, input (prompt) and output tokens/s over the level's duration
  (first send to last finish), TTFT / ITL / E2E (and TPOT) mean, median and p99, failures by
  kind, and the machine's state: before the level loadavg, CPU busy over 2 s (--quiet-wait: wait
  for a quiet machine first) and read bandwidth from --bw-probe, which prints "read X GB/s"
  (decode speed on a CPU follows memory bandwidth, which on shared VMs moves between runs, so
  every level records it); during the level, with --server-pid, the CPU seconds of the server, of
  this client and of everything else (a large "others" share marks a disturbed measurement).

  --check-alone K: after each level, replay K of that level's requests (spread evenly over it) one
  at a time: same prompt, same parameters, logprobs 1. Each replay's output is compared with the
  same request's output under load: the token ids (from logprobs.content[].id, llama-server's
  shape, or "token_id:N" strings or choice.token_ids; otherwise the token strings of
  logprobs.tokens, as epmoe and the OpenAI legacy shape send, and the basis is recorded) and every
  per-token log-prob (logprobs.token_logprobs, or content[].logprob) as fp32 bits
  (struct.pack('<f', x)). "identical" is the share of the K with the same tokens and the same
  bits; "same tokens" ignores the log-probs. The load requests ask for logprobs too when this is
  on, which can cost a server time (llama-server: a softmax over the whole vocabulary per token),
  so throughput figures with and without it are not comparable; the JSON records which.
  (llama-server streams no log-prob for a token it holds back as incomplete UTF-8, so its lists
  can be shorter than N; both sides of a comparison are from the same server, so this only
  matters when the held-back tokens differ, which then shows as a difference.)

  Results: printed per level, then as a table, and written to --out (JSON: configuration,
  per-level summary, identical check and every request's record), rewritten after each level so
  a cut-short run keeps what it measured.

table
  Markdown table over one or several result files (or directories, searched for *.json): one row
  per label and concurrency; with --ratio A B (or when there are exactly two labels) a second
  table of A / B per concurrency: output tok/s, request/s, TTFT, ITL and E2E medians (a time
  ratio < 1 means A is faster), and each side's identical share. Several runs of one label and
  concurrency are each shown; their medians enter the ratios.
"""

import argparse
import asyncio
import glob
import json
import math
import os
import random
import statistics
import struct
import subprocess
import sys
import time

TOOL = "epmoe-serve-bench"


# ------------------------------------------------------------------------------------------ stats

def percentile(xs, q):
    """Linear interpolation between order statistics (numpy.percentile's default)."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stats_ms(xs):
    if not xs:
        return {"mean": None, "median": None, "p99": None, "n": 0}
    return {"mean": 1e3 * statistics.fmean(xs), "median": 1e3 * statistics.median(xs),
            "p99": 1e3 * percentile(xs, 99), "n": len(xs)}


# --------------------------------------------------------------------------- machine state probes

def cpu_busy(seconds=1.0):
    """Fraction of all CPUs busy over `seconds` (from /proc/stat)."""
    def read():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    try:
        t1, i1 = read()
        time.sleep(seconds)
        t2, i2 = read()
        return round(1.0 - (i2 - i1) / max(1, t2 - t1), 3)
    except OSError:
        return None


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return None


def read_bandwidth(probe):
    """Run the bandwidth probe (prints 'read X GB/s'); X, or None."""
    if not probe:
        return None
    try:
        out = subprocess.run([probe], capture_output=True, text=True, timeout=120).stdout
        return float(out.split()[1])
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def cpu_snapshot(server_pid):
    """CPU seconds so far: whole machine busy (all CPUs), the server process, this process."""
    tck = os.sysconf("SC_CLK_TCK")
    snap = {"t": time.perf_counter(), "client": time.process_time(), "machine": None, "server": None}
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
        snap["machine"] = (sum(v) - v[3] - v[4]) / tck
    except OSError:
        pass
    if server_pid:
        try:
            with open(f"/proc/{server_pid}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            snap["server"] = (int(st[11]) + int(st[12])) / tck  # utime + stime
        except (OSError, IndexError, ValueError):
            pass
    return snap


def cpu_during(a, b):
    """Where the machine's CPU time went between two snapshots. `other` is what neither the
    server nor this client used (someone else's build, ...): a level with a large other_share was
    measured on a disturbed machine."""
    wall = b["t"] - a["t"]
    ncpu = os.cpu_count() or 1
    out = {"wall_s": wall, "ncpu": ncpu, "client_cpu_s": b["client"] - a["client"]}
    if a["machine"] is not None and b["machine"] is not None:
        out["machine_busy_cpu_s"] = b["machine"] - a["machine"]
    if a["server"] is not None and b["server"] is not None:
        out["server_cpu_s"] = b["server"] - a["server"]
        if "machine_busy_cpu_s" in out:
            other = out["machine_busy_cpu_s"] - out["server_cpu_s"] - out["client_cpu_s"]
            out["other_cpu_s"] = max(0.0, other)
            out["other_share"] = max(0.0, other) / (ncpu * wall) if wall > 0 else None
    return out


def machine_state(probe, quiet_wait=0.0, quiet_busy=0.3):
    """The machine before a level: waits (up to quiet_wait s) for CPU busy < quiet_busy over 2 s
    (the server is idle then: what is busy is someone else's work), then records loadavg, busy and
    the read bandwidth."""
    t0 = time.perf_counter()
    busy = cpu_busy(2.0)
    while quiet_wait > 0 and busy is not None and busy >= quiet_busy \
            and time.perf_counter() - t0 < quiet_wait:
        busy = cpu_busy(2.0)
    waited = time.perf_counter() - t0 - 2.0
    if quiet_wait > 0 and busy is not None and busy >= quiet_busy:
        print(f"machine still busy ({busy}) after {quiet_wait:g} s; running anyway", file=sys.stderr)
    return {"loadavg": loadavg(), "busy_before": busy, "quiet_wait_s": round(max(0.0, waited), 1),
            "read_gbps_before": read_bandwidth(probe)}


# ------------------------------------------------------------------------------------- requests

def make_prompts(n, seed, lo, hi, vmin, vmax):
    rng = random.Random(seed)
    return [[rng.randrange(vmin, vmax) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def fp32_bits(x):
    """The fp32 bits of a JSON number (as a hex string); None stays None."""
    if x is None:
        return None
    try:
        return struct.pack("<f", float(x)).hex()
    except (OverflowError, TypeError, ValueError):
        return "d:" + struct.pack("<d", float(x)).hex()


def parse_logprobs(ch, acc):
    """Append a chunk's per-token entries (ids, token strings, log-probs) to acc; return their count."""
    lp = ch.get("logprobs")
    n = 0
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):  # llama-server / chat shape
        for e in lp["content"]:
            acc["ids"].append(e.get("id"))
            acc["tokens"].append(e.get("token"))
            acc["lps"].append(e.get("logprob"))
            n += 1
    elif isinstance(lp, dict) and isinstance(lp.get("token_logprobs"), list):  # OpenAI legacy shape
        toks = lp.get("tokens") or []
        for k, x in enumerate(lp["token_logprobs"]):
            t = toks[k] if k < len(toks) else None
            tid = None
            if isinstance(t, str) and t.startswith("token_id:"):  # vLLM return_tokens_as_token_ids
                try:
                    tid = int(t[9:])
                except ValueError:
                    pass
            acc["ids"].append(tid)
            acc["tokens"].append(t)
            acc["lps"].append(x)
            n += 1
    tids = ch.get("token_ids")  # vLLM return_token_ids
    if isinstance(tids, list) and tids:
        acc["chunk_ids"].extend(tids)
    return n


def new_record(index, prompt, seed):
    return {"index": index, "prompt_len": len(prompt), "seed": seed, "ok": False, "error": None,
            "ttft": None, "e2e": None, "itl": [], "n_events": 0, "output_tokens": None,
            "prompt_tokens": None, "finish_reason": None, "usage": None, "text": None,
            "lp": None, "t_send": None}


async def one_request(session, args, url, prompt, index, seed, want_logprobs):
    """One streaming completion; a record (seconds). Never raises except on cancellation."""
    import aiohttp
    body = {"prompt": prompt, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "stream": True, "stream_options": {"include_usage": True}}
    if args.model:
        body["model"] = args.model
    if not args.no_ignore_eos:
        body["ignore_eos"] = True
    if args.temperature > 0:
        body["seed"] = seed
    if want_logprobs:
        body["logprobs"] = 1
    body.update(args.extra_body)
    data = json.dumps(body)
    rec = new_record(index, prompt, seed)
    acc = {"ids": [], "tokens": [], "lps": [], "chunk_ids": []}
    text = []
    last = None
    done = False
    t0 = time.perf_counter()
    rec["t_send"] = t0

    def handle(line, now):
        nonlocal last, done
        line = line.strip()
        if not line.startswith(b"data:"):
            return None  # SSE comments, event names, blank separators
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            return None
        try:
            obj = json.loads(payload)
        except ValueError:
            return f"bad JSON in stream: {payload[:200]!r}"
        if not isinstance(obj, dict):
            return f"unexpected stream item: {payload[:200]!r}"
        if obj.get("error") is not None:
            e = obj["error"]
            return "stream error: " + (e.get("message", "") if isinstance(e, dict) else str(e))[:300]
        if obj.get("usage"):
            rec["usage"] = obj["usage"]
        if obj.get("timings"):  # llama-server's own prompt/decode timings (final chunk)
            rec["timings"] = obj["timings"]
        choices = obj.get("choices") or []
        if not choices:
            return None  # the usage-only chunk
        ch = choices[0]
        fr = ch.get("finish_reason")
        if fr is not None:
            rec["finish_reason"] = fr
        t = ch.get("text") or ""
        text.append(t)
        n_lp = parse_logprobs(ch, acc)
        if fr is None or t or n_lp:  # a chunk that carries (or stands for) sampled tokens
            rec["n_events"] += 1
            if last is None:
                rec["ttft"] = now - t0
            else:
                rec["itl"].append(now - last)
            last = now
        return None

    try:
        timeout = aiohttp.ClientTimeout(total=args.timeout)
        async with session.post(url, data=data, timeout=timeout,
                                headers={"Content-Type": "application/json",
                                         "Accept": "text/event-stream"}) as resp:
            if resp.status != 200:
                msg = (await resp.content.read(600)).decode(errors="replace")
                rec["error"] = f"HTTP {resp.status}: {msg}"
                rec["e2e"] = time.perf_counter() - t0
                return rec
            buf = b""
            async for chunk in resp.content.iter_any():
                now = time.perf_counter()
                buf += chunk
                while not done and rec["error"] is None:
                    k = buf.find(b"\n")
                    if k < 0:
                        break
                    line, buf = buf[:k], buf[k + 1:]
                    rec["error"] = handle(line, now)
                if done or rec["error"] is not None:
                    break
            if not done and rec["error"] is None and buf.strip():
                rec["error"] = handle(buf, time.perf_counter())
        rec["e2e"] = time.perf_counter() - t0
    except asyncio.TimeoutError:
        rec["error"] = f"timeout after {args.timeout:g} s"
        rec["e2e"] = time.perf_counter() - t0
        return rec
    except aiohttp.ClientError as e:
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
        rec["e2e"] = time.perf_counter() - t0
        return rec

    rec["text"] = "".join(text)
    if want_logprobs:
        ids = acc["ids"]
        if acc["chunk_ids"] and (not ids or any(i is None for i in ids)):
            ids = acc["chunk_ids"]
        rec["lp"] = {"ids": ids, "tokens": acc["tokens"], "logprobs": acc["lps"]}
    if rec["error"] is not None:
        return rec
    if not done:
        rec["error"] = "stream ended without data: [DONE]"
        return rec
    if rec["n_events"] == 0:
        rec["error"] = "no token chunk"
        return rec
    u = rec["usage"] or {}
    if u.get("completion_tokens") is None:
        if not args.allow_no_usage:
            rec["error"] = "no usage.completion_tokens in the stream"
            return rec
        rec["output_tokens"] = len(acc["lps"]) if want_logprobs else rec["n_events"]
    else:
        rec["output_tokens"] = u["completion_tokens"]
    rec["prompt_tokens"] = u.get("prompt_tokens") or len(prompt)
    if not args.allow_short and rec["output_tokens"] != args.max_tokens:
        rec["error"] = f"output tokens {rec['output_tokens']} != max_tokens {args.max_tokens}"
        return rec
    rec["ok"] = True
    return rec


async def closed_loop(session, args, url, prompts, seeds, concurrency, want_logprobs, deadline):
    """Keep `concurrency` requests in flight until all are sent; cancel what runs past `deadline`."""
    n = len(prompts)
    recs = [None] * n
    nxt = 0
    inflight = set()

    async def worker():
        nonlocal nxt
        while nxt < n and time.perf_counter() < deadline:
            i = nxt
            nxt += 1
            inflight.add(i)
            recs[i] = await one_request(session, args, url, prompts[i], i, seeds[i], want_logprobs)
            inflight.discard(i)
            if args.verbose:
                r = recs[i]
                print(f"  req {i}: prompt {r['prompt_len']} ttft {(r['ttft'] or 0) * 1e3:.0f} ms "
                      f"e2e {(r['e2e'] or 0):.2f} s out {r['output_tokens']} chunks {r['n_events']} "
                      f"{'ok' if r['ok'] else r['error']}", file=sys.stderr)

    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, n))]
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - t0))
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    for i in range(n):
        if recs[i] is None:
            recs[i] = new_record(i, prompts[i], seeds[i])
            recs[i]["error"] = ("cancelled at the deadline (in flight)" if i in inflight
                                else "not sent: deadline reached")
    return recs, t0, time.perf_counter()


def summarize(recs, t0, t1):
    ok = [r for r in recs if r["ok"]]
    sent = [r for r in recs if r["t_send"] is not None and r["e2e"] is not None]
    cut = sum(1 for r in recs if (r["error"] or "").startswith(("cancelled at the deadline", "not sent")))
    if sent and not cut:
        dur = max(r["t_send"] + r["e2e"] for r in sent) - min(r["t_send"] for r in sent)
    else:  # cut short by the deadline: the level lasted until then
        dur = t1 - t0
    out_tok = sum(r["output_tokens"] for r in ok)
    in_tok = sum(r["prompt_tokens"] for r in ok)
    errors = {}
    for r in recs:
        if not r["ok"]:
            key = (r["error"] or "?")[:160]
            errors[key] = errors.get(key, 0) + 1
    tpot = [(r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1]
    return {
        "completed": len(ok), "failed": len(recs) - len(ok), "errors": errors,
        "cut_short_by_deadline": cut,
        "duration_s": dur,
        "request_throughput": len(ok) / dur if dur > 0 else None,
        "input_throughput": in_tok / dur if dur > 0 else None,
        "output_throughput": out_tok / dur if dur > 0 else None,
        "total_prompt_tokens": in_tok, "total_output_tokens": out_tok,
        "token_chunks": sum(r["n_events"] for r in ok),
        "ttft_ms": stats_ms([r["ttft"] for r in ok]),
        "itl_ms": stats_ms([x for r in ok for x in r["itl"]]),
        "tpot_ms": stats_ms(tpot),
        "e2e_ms": stats_ms([r["e2e"] for r in ok]),
    }


# ------------------------------------------------------------------------------- identical check

def compare(load, alone):
    """Compare one request's output under load with its replay alone."""
    a, b = load["lp"] or {}, alone["lp"] or {}
    ia, ib = a.get("ids") or [], b.get("ids") or []
    if ia and ib and all(i is not None for i in ia + ib):
        basis, ta, tb = "ids", ia, ib
    else:
        basis, ta, tb = "token strings", a.get("tokens") or [], b.get("tokens") or []
    la, lb = a.get("logprobs") or [], b.get("logprobs") or []
    ba, bb = [fp32_bits(x) for x in la], [fp32_bits(x) for x in lb]
    first_tok = next((k for k in range(min(len(ta), len(tb))) if ta[k] != tb[k]),
                     None if len(ta) == len(tb) else min(len(ta), len(tb)))
    first_lp = next((k for k in range(min(len(ba), len(bb))) if ba[k] != bb[k]),
                    None if len(ba) == len(bb) else min(len(ba), len(bb)))
    upto = first_tok if first_tok is not None else min(len(la), len(lb))
    diffs = [abs(float(la[k]) - float(lb[k])) for k in range(min(upto, len(la), len(lb)))
             if la[k] is not None and lb[k] is not None]
    tokens_same = first_tok is None and len(ta) > 0
    return {"index": load["index"], "basis": basis, "n_tokens": [len(ta), len(tb)],
            "n_logprobs": [len(la), len(lb)],
            "tokens_identical": tokens_same,
            "logprob_bits_identical": first_lp is None and len(ba) > 0,
            "identical": tokens_same and first_lp is None and len(ba) > 0,
            "text_identical": load.get("text") == alone.get("text"),
            "first_token_diff": first_tok, "first_logprob_bits_diff": first_lp,
            "max_abs_logprob_diff": max(diffs) if diffs else None}


async def check_alone(session, args, url, prompts, seeds, recs, k, deadline):
    """Replay k of the level's successful requests one at a time and compare."""
    ok = [r for r in recs if r["ok"]]
    if k <= 0 or not ok:
        return None
    k = min(k, len(ok))
    pick = [ok[(j * len(ok)) // k] for j in range(k)]  # spread over the level (waves, slots)
    rows, replays = [], []
    for r in pick:
        if time.perf_counter() > deadline:
            break
        i = r["index"]
        a = await one_request(session, args, url, prompts[i], i, seeds[i], True)
        a.pop("t_send", None)
        replays.append(a)
        if not a["ok"]:
            rows.append({"index": i, "replay_error": a["error"], "identical": False,
                         "tokens_identical": False})
            continue
        rows.append(compare(r, a))
    n = len(rows)
    cmp_ok = [x for x in rows if "replay_error" not in x]
    return {
        "k": n, "replay_failed": n - len(cmp_ok),
        "identical": sum(x["identical"] for x in rows),
        "tokens_identical": sum(x["tokens_identical"] for x in rows),
        "share_identical": sum(x["identical"] for x in rows) / n if n else None,
        "share_tokens_identical": sum(x["tokens_identical"] for x in rows) / n if n else None,
        "basis": sorted({x["basis"] for x in cmp_ok}),
        "max_abs_logprob_diff": max((x["max_abs_logprob_diff"] or 0.0 for x in cmp_ok), default=None),
        "rows": rows, "replays": replays,
    }


# ----------------------------------------------------------------------------------------- run

def fmt(v, nd=1):
    return "-" if v is None else f"{v:.{nd}f}"


def print_level(lv):
    s, m = lv["summary"], lv["meta"]
    print(f"==== {lv['label']}: concurrency {lv['concurrency']}, {lv['requests']} requests, "
          f"max_tokens {lv['max_tokens']}, prompts {lv['prompt_len'][0]}-{lv['prompt_len'][1]}, "
          f"temperature {lv['temperature']}, logprobs {lv['logprobs']} ====")
    print(f"machine before    : load {m.get('loadavg')}, busy {m.get('busy_before')} (waited "
          f"{m.get('quiet_wait_s')} s), "
          f"read {m.get('read_gbps_before')} GB/s")
    cd = m.get("cpu_during") or {}
    if cd:
        print(f"CPU during level  : server {fmt(cd.get('server_cpu_s'))} s, client "
              f"{fmt(cd.get('client_cpu_s'))} s, others {fmt(cd.get('other_cpu_s'))} s "
              f"({fmt(100 * cd['other_share'] if cd.get('other_share') is not None else None, 0)}% "
              f"of {cd['ncpu']} CPUs x {cd['wall_s']:.1f} s)")
    print(f"completed / failed: {s['completed']} / {s['failed']}")
    for e, c in s["errors"].items():
        print(f"   {c} x {e}")
    print(f"duration          : {s['duration_s']:.2f} s")
    print(f"requests/s        : {fmt(s['request_throughput'], 3)}")
    print(f"input tok/s       : {fmt(s['input_throughput'])}")
    print(f"output tok/s      : {fmt(s['output_throughput'])}")
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        x = s[key]
        print(f"{name:5s} ms mean/median/p99: {fmt(x['mean'])} / {fmt(x['median'])} / {fmt(x['p99'])}"
              f" (n={x['n']})")
    ic = lv.get("identical")
    if ic:
        print(f"alone vs under load: {ic['identical']}/{ic['k']} identical (tokens and fp32 log-prob "
              f"bits), {ic['tokens_identical']}/{ic['k']} same tokens; basis {ic['basis']}; "
              f"max |d logprob| {fmt(ic['max_abs_logprob_diff'], 6)}; replays failed "
              f"{ic['replay_failed']}")
        for x in ic["rows"]:
            if not x["identical"]:
                print(f"   req {x['index']}: " + (x.get("replay_error") or
                      f"first token diff at {x['first_token_diff']}, first log-prob bits diff at "
                      f"{x['first_logprob_bits_diff']}, max |d| {fmt(x['max_abs_logprob_diff'], 6)}, "
                      f"tokens {x['n_tokens']}, logprobs {x['n_logprobs']}"))
    sys.stdout.flush()


def parse_levels(s):
    return [int(x) for x in s.replace(",", " ").split()]


async def run_async(args):
    import aiohttp
    base = args.url.rstrip("/")
    url = base + args.endpoint
    levels = parse_levels(args.levels)
    reqs = parse_levels(args.requests) if args.requests else []
    want_lp = args.logprobs or args.check_alone > 0
    t_start = time.perf_counter()
    run_deadline = t_start + args.deadline
    out = {"tool": TOOL, "label": args.label, "url": url, "started_unix": time.time(),
           "config": {k: v for k, v in vars(args).items() if k not in ("func", "meta")},
           "meta": args.meta, "levels": []}
    # A fresh connection per request (force_close): keep-alive connections would pin
    # thread-per-connection servers' HTTP threads between requests. No connection limit: level 128
    # must have 128 requests open.
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn) as session:
        for li, c in enumerate(levels):
            n = reqs[li] if li < len(reqs) else (reqs[-1] if len(reqs) == 1 else max(2 * c, 16))
            now = time.perf_counter()
            if now >= run_deadline:
                print(f"level c={c} skipped: run deadline ({args.deadline:g} s) reached", flush=True)
                out["levels"].append({"label": args.label, "concurrency": c, "skipped": "deadline"})
                continue
            seed = args.seed + c
            prompts = make_prompts(n, seed, args.prompt_len_min, args.prompt_len_max,
                                   args.vocab_min, args.vocab_max)
            seeds = [args.sampling_seed + i for i in range(n)]
            meta = dict(args.meta)
            meta.update(machine_state(args.bw_probe, args.quiet_wait, args.quiet_busy))
            warm = []
            if args.warmup:
                wp = make_prompts(args.warmup, seed + 7919 * 1000, args.prompt_len_min,
                                  args.prompt_len_max, args.vocab_min, args.vocab_max)
                for j, p in enumerate(wp):
                    w = await one_request(session, args, url, p, -1 - j, args.sampling_seed - 1 - j, want_lp)
                    w.pop("t_send", None)
                    warm.append(w)
                    print(f"warm-up: {'ok' if w['ok'] else w['error']}, ttft {fmt((w['ttft'] or 0) * 1e3)}"
                          f" ms, e2e {fmt(w['e2e'], 2)} s", file=sys.stderr, flush=True)
            level_deadline = min(run_deadline, time.perf_counter() + args.level_deadline)
            wall0 = time.time()
            snap0 = cpu_snapshot(args.server_pid)
            recs, t0, t1 = await closed_loop(session, args, url, prompts, seeds, c, want_lp,
                                             level_deadline)
            meta["cpu_during"] = cpu_during(snap0, cpu_snapshot(args.server_pid))
            summary = summarize(recs, t0, t1)
            ident = None
            if args.check_alone > 0:
                ident = await check_alone(session, args, url, prompts, seeds, recs, args.check_alone,
                                          min(run_deadline, time.perf_counter() + args.level_deadline))
            for r in recs:
                r["t_send"] = None if r["t_send"] is None else r["t_send"] - t0
            if args.bw_after:
                meta["read_gbps_after"] = read_bandwidth(args.bw_probe)
            lv = {"label": args.label, "concurrency": c, "requests": n, "seed": seed,
                  "max_tokens": args.max_tokens, "temperature": args.temperature,
                  "prompt_len": [args.prompt_len_min, args.prompt_len_max], "logprobs": want_lp,
                  "started_unix": wall0, "meta": meta, "summary": summary, "identical": ident,
                  "warmup": warm, "records": recs}
            out["levels"].append(lv)
            print_level(lv)
            if args.out:
                tmp = args.out + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(out, f, indent=1)
                os.replace(tmp, args.out)
    out["client_cpu_s"] = time.process_time()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.out}")
    return out


def cmd_run(args):
    if args.prompt_len_min < 1 or args.prompt_len_max < args.prompt_len_min:
        sys.exit("bad prompt length range")
    if args.vocab_max <= args.vocab_min:
        sys.exit("bad vocabulary range")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    out = asyncio.run(run_async(args))
    print()
    print_table([(args.out or "-", lv) for lv in out["levels"] if "summary" in lv])
    failed = sum(lv["summary"]["failed"] for lv in out["levels"] if "summary" in lv)
    return 0 if failed == 0 else 3


# --------------------------------------------------------------------------------------- table

def load_levels(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "**", "*.json"), recursive=True))
        else:
            files.append(p)
    rows = []
    for f in files:
        try:
            with open(f) as fh:
                j = json.load(fh)
        except (OSError, ValueError):
            continue
        if not isinstance(j, dict) or j.get("tool") != TOOL:
            continue
        for lv in j.get("levels", []):
            if "summary" in lv:
                rows.append((f, lv))
    return rows


def ident_cell(lv):
    ic = lv.get("identical")
    if not ic or not ic["k"]:
        return "-"
    return f"{ic['identical']}/{ic['k']} ({100.0 * ic['share_identical']:.0f}%)"


def other_cell(m):
    x = (m.get("cpu_during") or {}).get("other_share")
    return "-" if x is None else f"{100 * x:.0f}%"


def print_table(rows, ratio=None):
    rows = sorted(rows, key=lambda r: (r[1]["label"] or "", r[1]["concurrency"], r[1]["started_unix"]))
    print("| label | conc | ok/failed | req/s | input tok/s | output tok/s | TTFT mean / median / p99 ms "
          "| ITL mean / median / p99 ms | E2E mean / median / p99 s | identical alone | read GB/s before "
          "| others' CPU during |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for _, lv in rows:  # noqa: B007
        s, m = lv["summary"], lv.get("meta", {})
        t, i, e = s["ttft_ms"], s["itl_ms"], s["e2e_ms"]
        sec = lambda v: None if v is None else v / 1e3  # noqa: E731
        cut = " (cut short)" if s.get("cut_short_by_deadline") else ""
        print(f"| {lv['label']} | {lv['concurrency']} | {s['completed']}/{s['failed']}{cut} "
              f"| {fmt(s['request_throughput'], 3)} | {fmt(s['input_throughput'])} "
              f"| {fmt(s['output_throughput'])} | {fmt(t['mean'], 0)} / {fmt(t['median'], 0)} / "
              f"{fmt(t['p99'], 0)} | {fmt(i['mean'])} / {fmt(i['median'])} / {fmt(i['p99'])} "
              f"| {fmt(sec(e['mean']), 2)} / {fmt(sec(e['median']), 2)} / {fmt(sec(e['p99']), 2)} "
              f"| {ident_cell(lv)} | {fmt(m.get('read_gbps_before'))} | {other_cell(m)} |")
    labels = []
    for _, lv in rows:
        if lv["label"] not in labels:
            labels.append(lv["label"])
    if ratio is None and len(labels) == 2:
        ratio = labels
    if not ratio:
        return
    a, b = ratio

    def med(lab, c, get):
        xs = [get(lv) for _, lv in rows if lv["label"] == lab and lv["concurrency"] == c
              and not lv["summary"].get("cut_short_by_deadline")]
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    def r(x, y):
        return "-" if x is None or y is None or y == 0 else f"{x / y:.2f}"

    concs = sorted({lv["concurrency"] for _, lv in rows if lv["label"] == a}
                   & {lv["concurrency"] for _, lv in rows if lv["label"] == b})
    print()
    print(f"{a} / {b} (medians over runs not cut short; throughput > 1 and time < 1 favour {a})")
    print()
    print(f"| conc | output tok/s {a} / {b} | ratio | req/s ratio | TTFT median ratio | ITL median ratio "
          f"| E2E median ratio | identical {a} | identical {b} | read GB/s {a} / {b} |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in concs:
        g = {
            "out": lambda lv: lv["summary"]["output_throughput"],
            "req": lambda lv: lv["summary"]["request_throughput"],
            "ttft": lambda lv: lv["summary"]["ttft_ms"]["median"],
            "itl": lambda lv: lv["summary"]["itl_ms"]["median"],
            "e2e": lambda lv: lv["summary"]["e2e_ms"]["median"],
            "bw": lambda lv: lv.get("meta", {}).get("read_gbps_before"),
        }
        va = {k: med(a, c, f) for k, f in g.items()}
        vb = {k: med(b, c, f) for k, f in g.items()}
        ia = next((ident_cell(lv) for _, lv in rows if lv["label"] == a and lv["concurrency"] == c), "-")
        ib = next((ident_cell(lv) for _, lv in rows if lv["label"] == b and lv["concurrency"] == c), "-")
        print(f"| {c} | {fmt(va['out'])} / {fmt(vb['out'])} | {r(va['out'], vb['out'])} "
              f"| {r(va['req'], vb['req'])} | {r(va['ttft'], vb['ttft'])} | {r(va['itl'], vb['itl'])} "
              f"| {r(va['e2e'], vb['e2e'])} | {ia} | {ib} | {fmt(va['bw'])} / {fmt(vb['bw'])} |")


def cmd_table(args):
    rows = load_levels(args.paths)
    if not rows:
        sys.exit("no serve_bench results found in " + " ".join(args.paths))
    if args.labels:
        keep = set(args.labels.split(","))
        rows = [r for r in rows if r[1]["label"] in keep]
    print_table(rows, args.ratio)
    return 0


# ---------------------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(prog="serve_bench.py", description=__doc__.split("\n\n")[0],
                                 epilog="serve_bench.py run --help and serve_bench.py table --help "
                                        "for the options; the module docstring for the details.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="drive a server through the concurrency levels",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL")
    r.add_argument("--endpoint", default="/v1/completions")
    r.add_argument("--label", default="server", help="name of this server/run in tables")
    r.add_argument("--model", default=None, help='"model" field, if the server wants one')
    r.add_argument("--levels", default="1,8,32,128", help="concurrency levels")
    r.add_argument("--requests", default=None,
                   help="requests per level (one number for all, or a list matching --levels); "
                        "default max(2 x concurrency, 16)")
    r.add_argument("--max-tokens", type=int, default=32, help="N: output tokens per request")
    r.add_argument("--prompt-len-min", type=int, default=64)
    r.add_argument("--prompt-len-max", type=int, default=256)
    r.add_argument("--vocab-min", type=int, default=0, help="prompt ids are >= this")
    r.add_argument("--vocab-max", type=int, default=151000, help="prompt ids are < this")
    r.add_argument("--seed", type=int, default=1000, help="prompt seed of level C is this + C")
    r.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    r.add_argument("--sampling-seed", type=int, default=1234,
                   help='with temperature > 0, request i of a level sends "seed": this + i')
    r.add_argument("--logprobs", action="store_true", help='send "logprobs": 1 with every request')
    r.add_argument("--check-alone", type=int, default=0, metavar="K",
                   help="after each level, replay K of its requests alone and compare bits "
                        "(implies --logprobs)")
    r.add_argument("--warmup", type=int, default=1, help="sequential unmeasured requests per level")
    r.add_argument("--no-ignore-eos", action="store_true", help='do not send "ignore_eos": true')
    r.add_argument("--allow-short", action="store_true",
                   help="do not fail requests whose output token count is not N")
    r.add_argument("--allow-no-usage", action="store_true",
                   help="count tokens from the stream when the server sends no usage")
    r.add_argument("--extra-body", type=json.loads, default={},
                   help="JSON object merged into every request body (e.g. server-specific fields)")
    r.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    r.add_argument("--level-deadline", type=float, default=1200.0,
                   help="seconds per level (and again for its --check-alone replays)")
    r.add_argument("--deadline", type=float, default=3600.0, help="seconds for the whole run")
    r.add_argument("--bw-probe", default=None,
                   help="bandwidth probe executable (prints 'read X GB/s'), run before each level")
    r.add_argument("--quiet-wait", type=float, default=0.0,
                   help="before each level wait up to this many seconds for CPU busy < --quiet-busy")
    r.add_argument("--quiet-busy", type=float, default=0.3, help="busy fraction (all CPUs) deemed quiet")
    r.add_argument("--bw-after", action="store_true", help="run the probe after each level too")
    r.add_argument("--server-pid", type=int, default=None,
                   help="the server's pid: its CPU time during each level is recorded, and the "
                        "rest of the machine's (other processes) as a disturbance measure")
    r.add_argument("--meta", type=json.loads, default={}, help="JSON object stored with each level")
    r.add_argument("--out", default=None, help="result JSON")
    r.add_argument("--verbose", "-v", action="store_true", help="one line per request on stderr")
    r.set_defaults(func=cmd_run)

    t = sub.add_parser("table", help="markdown table over result files/directories")
    t.add_argument("paths", nargs="+")
    t.add_argument("--ratio", nargs=2, metavar=("LABEL_A", "LABEL_B"), default=None,
                   help="print A / B per concurrency (default: the two labels, if exactly two)")
    t.add_argument("--labels", default=None, help="comma-separated labels to keep")
    t.set_defaults(func=cmd_table)

    args = ap.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
