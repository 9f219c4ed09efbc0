#!/usr/bin/env python3
"""Checks the on-policy guarantee of `epmoe generate --json --logprobs` on any device: every line's
output_logprobs are the fp32 bits that `epmoe score --temperature T` computes teacher-forced on
prompt + output. Used by scripts/gpu-test.sh (GPUs); tests/cli/rollout_test.cc does the same on CPUs.

  rollout-check.py JSONL TEMPERATURE EPMOE_SCORE_PREFIX...
  e.g. rollout-check.py out.jsonl 0.9 .gpu/bin/epmoe score --device cuda --model DIR
Exit 0 when every token matches, 1 otherwise."""
import array, json, os, struct, subprocess, sys, tempfile


def load_f32(path, name):
    """One F32 tensor of a safetensors file, as floats (the format is 8 bytes of header length, the
    JSON header, then the data)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    info = json.loads(data[8:8 + n])[name]
    assert info["dtype"] == "F32", info
    a, b = info["data_offsets"]
    v = array.array("f")
    v.frombytes(data[8 + n + a:8 + n + b])
    return v

lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
temperature = sys.argv[2]
prefix = sys.argv[3:]
bad = checked = 0
for n, j in enumerate(lines):
    seq = j["prompt_ids"] + j["output_ids"]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "s.safetensors")
        subprocess.run(prefix + ["--temperature", temperature, "--ids", ",".join(map(str, seq)), "--out", out],
                       check=True, capture_output=True)
        scored = load_f32(out, "token_logprobs")
    P = len(j["prompt_ids"])
    for k, v in enumerate(j["output_logprobs"]):
        want = struct.pack("<f", float(v))           # the printed value, read back as fp32
        got = struct.pack("<f", float(scored[P + k]))
        checked += 1
        if want != got:
            bad += 1
            print(f"line {n} token {k}: generate {v!r}, score {float(scored[P + k])!r}")
print(f"rollout-check: {checked - bad}/{checked} log-probs equal to the teacher-forced score bits")
sys.exit(1 if bad or not checked else 0)
