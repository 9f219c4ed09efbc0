"""Weight sync from a trainer process without disk (tests/serve, ctest serve.weight_sync).

The client here is a trainer of our own (httpx): it sends its weights as safetensors bytes in
buckets to POST /update_weights_from_safetensors (?commit=false stages a bucket, the last one
commits, ?weight_version names the weights). On 1 rank and on 3 ranks (mpirun, alltoall):
  * a request running when the update is committed finishes on the old weights (its tokens and
    log-prob bits are the old model's, its weight_version the old one);
  * after the update every request gives, bit for bit, what a server started on the new
    checkpoint gives, and weight_version is the new one (/get_weight_version, meta_info);
  * sending the old weights back restores the old outputs bit for bit;
  * a bucket with a tensor of another shape, a name the model does not have, or a truncated body
    is refused with a 400 naming it, drops what was staged, and the old weights keep serving.
"""
import os
import struct
import sys
import threading

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import safetensors_bytes  # noqa: E402
import serve_harness as h  # noqa: E402

MODEL = os.path.join(h.DATA, "qwen3moe-tiny")
check = h.Checks()
PROMPTS = [[5, 17, 42, 99, 3], [7, 7, 200, 13], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]


def read_tensors(folder):
    """{name: (dtype, shape, raw bytes)} of every safetensors file of a checkpoint folder."""
    return safetensors_bytes.read_tensors(folder, skip_prefix="golden")


def bucket(tensors):
    """A safetensors file's bytes for {name: (dtype, shape, raw)} (header padded to 8 bytes)."""
    return safetensors_bytes.safetensors_bytes(tensors)


def send(url, tensors, parts, version):
    """The tensors in `parts` buckets, the last one committing; the replies."""
    names = sorted(tensors)
    replies = []
    for i in range(parts):
        chunk = {n: tensors[n] for n in names[i::parts]}
        params = {"commit": "true" if i == parts - 1 else "false", "weight_version": version}
        r = httpx.post(url + "/update_weights_from_safetensors", params=params, content=bucket(chunk), timeout=120)
        replies.append((r.status_code, r.json()))
    return replies


def outputs(url, new=8):
    """Greedy ids and log-prob bits of PROMPTS, and the weight_version that ran them."""
    out = []
    for p in PROMPTS:
        d = httpx.post(url + "/generate", json={"input_ids": p, "return_logprob": True, "sampling_params": {
            "max_new_tokens": new, "temperature": 0, "ignore_eos": True}}, timeout=120).json()
        out.append((d["output_ids"], [struct.pack("<f", x[0]) for x in d["meta_info"]["output_token_logprobs"]],
                    d["meta_info"]["weight_version"]))
    return out


def bits(outs):
    return [(ids, lps) for ids, lps, _ in outs]


def main():
    v2 = h.second_weights(MODEL)
    old, new = read_tensors(MODEL), read_tensors(v2)
    check(sorted(old) == sorted(new), "the two checkpoints hold the same tensors (%d)" % len(old))
    long_req = {"input_ids": PROMPTS[0], "return_logprob": True,
                "sampling_params": {"max_new_tokens": 600, "temperature": 0, "ignore_eos": True}}
    with h.Server(MODEL) as s:
        ref_old = outputs(s.url)
        ref_long = httpx.post(s.url + "/generate", json=long_req, timeout=120).json()
    with h.Server(v2) as s:
        ref_new = outputs(s.url)
    check(bits(ref_old) != bits(ref_new), "the two checkpoints give different outputs (the test can tell them apart)")

    for ranks in (1, 3):
        args = ["--moe-a2a-backend", "alltoall"] if ranks > 1 else []
        with h.Server(MODEL, ranks=ranks, args=args) as s:
            tag = "%d rank(s)" % ranks
            check(bits(outputs(s.url)) == bits(ref_old), "%s: the old weights' outputs before the update" % tag)
            # A long request in flight while the update is sent: it finishes on the old weights.
            got = {}
            t = threading.Thread(target=lambda: got.update(
                httpx.post(s.url + "/generate", json=long_req, timeout=120).json()))
            t.start()
            while httpx.get(s.url + "/v1/loads", timeout=10).json()["loads"][0]["num_reqs"] == 0 and t.is_alive():
                pass
            replies = send(s.url, new, 3, "v2")
            t.join(120)
            check(all(st == 200 for st, _ in replies) and replies[-1][1]["weight_version"] == "v2",
                  "%s: 3 buckets sent, the last one committed: 200, weight_version v2 (%s)" % (tag, replies[-1]))
            check(got.get("output_ids") == ref_long["output_ids"] and
                  got["meta_info"]["output_token_logprobs"] == ref_long["meta_info"]["output_token_logprobs"] and
                  got["meta_info"]["weight_version"] == "default",
                  "%s: the request in flight finished on the old weights (tokens, log-probs, weight_version)" % tag)
            after = outputs(s.url)
            check(bits(after) == bits(ref_new) and all(v == "v2" for _, _, v in after),
                  "%s: after the update, the new checkpoint's outputs bit for bit, weight_version v2" % tag)
            check(httpx.get(s.url + "/get_weight_version", timeout=10).json()["weight_version"] == "v2",
                  "%s: /get_weight_version is v2" % tag)

            # Refused: another shape, an unknown name, a truncated body; nothing changes.
            name = sorted(new)[0]
            dtype, shape, raw = new[name]
            bad_shape = {name: (dtype, [shape[0] * 2] + shape[1:], raw + raw)}
            st1, d1 = send(s.url, bad_shape, 1, "v3")[0]
            check(st1 == 400 and name in d1["error"]["message"] and d1["error"]["param"] == "body",
                  "%s: a tensor of another shape is refused naming it (%s)" % (tag, d1.get("error", {}).get("message")))
            httpx.post(s.url + "/update_weights_from_safetensors", params={"commit": "false"},
                       content=bucket({n: old[n] for n in sorted(old)[:3]}), timeout=60)  # staged, then dropped:
            st2, d2 = send(s.url, {"model.no_such_tensor": ("F32", [2], b"\0" * 8)}, 1, "v3")[0]
            check(st2 == 400 and "no_such_tensor" in d2["error"]["message"] and "dropped" in d2["error"]["message"],
                  "%s: an unknown tensor is refused naming it, the staged bucket dropped" % tag)
            r3 = httpx.post(s.url + "/update_weights_from_safetensors", content=bucket(new)[:100], timeout=60)
            check(r3.status_code == 400, "%s: a truncated body is refused (%d)" % (tag, r3.status_code))
            still = outputs(s.url)
            check(bits(still) == bits(ref_new) and all(v == "v2" for _, _, v in still),
                  "%s: after the refusals the v2 weights still serve, weight_version v2" % tag)

            # The old weights back, in one bucket: the old outputs bit for bit.
            st4, _ = send(s.url, old, 1, "v1-again")[0]
            back = outputs(s.url)
            check(st4 == 200 and bits(back) == bits(ref_old) and all(v == "v1-again" for _, _, v in back),
                  "%s: the old weights sent back restore the old outputs bit for bit" % tag)
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
