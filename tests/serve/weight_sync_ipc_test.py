"""Weight sync from a colocated trainer by CUDA IPC handles: POST /update_weights_from_tensor
(tests/serve, ctest serve.weight_sync_ipc).

Everywhere: the body is refused field by field -- sglang's torch-pickled serialized_named_tensors
(with the reason), a missing list, a dtype that is none, a handle that is not 64 bytes of base64, a
name given twice -- and a well-formed body whose handle opens nothing (a CPU-only build: refused for
the build) answers 400 naming the tensor, the old weights serving on.

With torch and a GPU (the device machine: EPMOE_SERVE_DEVICE=cuda, servers with --device cuda), the
trainer is this process: the second checkpoint's tensors as torch CUDA tensors on the server's GPU,
shared by `untyped_storage()._share_cuda_()`, sent in two calls (commit false, then true):
  * a request running when the update is committed finishes on the old weights (tokens, log-prob
    bits, weight_version);
  * afterwards every request gives, bit for bit, what a server started on the new checkpoint
    gives, with the new weight_version;
  * a tensor of another shape, an unknown name, an offset past the shared allocation, a handle of
    nothing are refused naming the tensor, the new weights serving on;
  * the old weights sent back the same way restore the old outputs bit for bit.
Without torch or a GPU that part reports itself skipped.
"""
import base64
import os
import struct
import sys
import threading

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_harness as h  # noqa: E402
from weight_sync_test import PROMPTS, bits, outputs, read_tensors  # noqa: E402

MODEL = os.path.join(h.DATA, "qwen3moe-tiny")
check = h.Checks()


def post(url, body):
    r = httpx.post(url + "/update_weights_from_tensor", json=body, timeout=300)
    return r.status_code, r.json()


def refusal(reply):
    st, d = reply
    return st, d.get("error", {}).get("param"), d.get("error", {}).get("message", "")


def body_refusals(url):
    """The refusals that need no GPU, each naming its field; the old weights serve on."""
    before = outputs(url)
    one = {"name": "model.norm.weight", "dtype": "F32", "shape": [8],
           "ipc_handle": base64.b64encode(b"\x01" * 64).decode(), "offset": 0}
    cases = [
        ({"serialized_named_tensors": ["gASV"]}, "serialized_named_tensors", "torch-pickled"),
        ({"weight_version": "v2"}, "named_tensors", "required"),
        ({"named_tensors": [dict(one, dtype="torch.complex64")]}, "named_tensors[0].dtype", "not a dtype"),
        ({"named_tensors": [dict(one, ipc_handle="AAAA")]}, "named_tensors[0].ipc_handle", "64-byte"),
        ({"named_tensors": [dict(one, ipc_handle=base64.b64encode(b"\x01e" + b"\x01" * 64).decode())]},
         "named_tensors[0].ipc_handle", "expandable segment"),
        ({"named_tensors": [one, dict(one)]}, "named_tensors[1].name", "twice"),
        ({"named_tensors": [dict(one, shape=[-1])]}, "named_tensors[0].shape", ">= 0"),
        ({"named_tensors": [dict(one, device=0)]}, "named_tensors[0].device", "not a field"),
        ({"named_tensors": [one], "load_format": "flattened_bucket"}, "load_format", "cuda_ipc"),
        # Well-formed, but the handle names no allocation (or the build has no CUDA).
        ({"named_tensors": [one]}, "named_tensors", "named_tensors[0] 'model.norm.weight'"),
    ]
    for body, param, words in cases:
        st, p, msg = refusal(post(url, body))
        check(st == 400 and p == param and words in msg,
              "refused: %s -> 400, param %s, says %r (%d, %s: %s)" % (list(body), param, words, st, p, msg))
    check(outputs(url) == before, "after the refusals the old weights serve on (outputs, weight_version)")


def torch_cuda():
    """torch with a GPU, or the reason there is none."""
    if h.DEVICE != "cuda":
        return None, "the servers run on the CPU (EPMOE_SERVE_DEVICE=cuda runs them on the GPU)"
    try:
        import torch
    except ImportError as e:
        return None, "no torch (%s)" % e
    if not torch.cuda.is_available():
        return None, "torch sees no GPU"
    return torch, ""


class Trainer:
    """A trainer's weights on the GPU, shared by CUDA IPC handle (kept alive while they are sent)."""

    DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}

    def __init__(self, torch, tensors):
        self.torch = torch
        self.t = {}
        for name, (dtype, shape, raw) in tensors.items():
            dt = getattr(torch, self.DTYPES[dtype])
            self.t[name] = torch.frombuffer(bytearray(raw), dtype=dt).reshape(shape).to("cuda")
        torch.cuda.synchronize()  # the writes done before the server reads them

    def entry(self, name, **over):
        t = self.t[name]
        _, handle, _, storage_off = t.untyped_storage()._share_cuda_()[:4]
        e = {"name": name, "dtype": str(t.dtype), "shape": list(t.shape),
             "ipc_handle": base64.b64encode(handle).decode(),
             "offset": storage_off + t.storage_offset() * t.element_size()}
        e.update(over)
        return e

    def send(self, url, version, parts=2):
        names = sorted(self.t)
        replies = []
        for i in range(parts):
            body = {"named_tensors": [self.entry(n) for n in names[i::parts]], "weight_version": version,
                    "commit": i == parts - 1}
            replies.append(post(url, body))
        return replies


def gpu_trainer(torch):
    v2 = h.second_weights(MODEL)
    old, new = read_tensors(MODEL), read_tensors(v2)
    long_req = {"input_ids": PROMPTS[0], "return_logprob": True,
                "sampling_params": {"max_new_tokens": 600, "temperature": 0, "ignore_eos": True}}
    with h.Server(MODEL) as s:
        ref_old = outputs(s.url)
        ref_long = httpx.post(s.url + "/generate", json=long_req, timeout=120).json()
    with h.Server(v2) as s:
        ref_new = outputs(s.url)
    check(bits(ref_old) != bits(ref_new), "GPU: the two checkpoints give different outputs (the test can tell them apart)")
    trainer_new, trainer_old = Trainer(torch, new), Trainer(torch, old)
    with h.Server(MODEL) as s:
        check(bits(outputs(s.url)) == bits(ref_old), "GPU: the old weights' outputs before the update")
        got = {}
        t = threading.Thread(target=lambda: got.update(
            httpx.post(s.url + "/generate", json=long_req, timeout=120).json()))
        t.start()
        while httpx.get(s.url + "/v1/loads", timeout=10).json()["loads"][0]["num_reqs"] == 0 and t.is_alive():
            pass
        replies = trainer_new.send(s.url, "v2")
        t.join(120)
        last = replies[-1][1]
        check(all(st == 200 for st, _ in replies) and last.get("weight_version") == "v2",
              "GPU: 2 calls of IPC handles, the last one committed: 200, weight_version v2 (%s)" % (replies,))
        gb = last.get("bytes", 0) / 1e9
        print("GPU: %d tensors, %.3f GB: copy %.3f s, whole update %.3f s" % (
            len(new), sum(len(r) for _, _, r in new.values()) / 1e9, last.get("copy_seconds", 0), last.get("seconds", 0)))
        check(got.get("output_ids") == ref_long["output_ids"] and
              got["meta_info"]["output_token_logprobs"] == ref_long["meta_info"]["output_token_logprobs"] and
              got["meta_info"]["weight_version"] == "default",
              "GPU: the request in flight finished on the old weights (tokens, log-probs, weight_version)")
        after = outputs(s.url)
        check(bits(after) == bits(ref_new) and all(v == "v2" for _, _, v in after),
              "GPU: after the update, a fresh server's outputs on the new checkpoint bit for bit, weight_version v2")

        name = sorted(new)[0]
        t0 = trainer_new.t[name]
        big = torch.cat([t0.flatten(), t0.flatten()]).reshape([t0.shape[0] * 2] + list(t0.shape[1:]))
        trainer_new.t["__big"] = big
        bad_shape = dict(trainer_new.entry("__big"), name=name)
        st, p, msg = refusal(post(s.url, {"named_tensors": [bad_shape], "weight_version": "v3"}))
        check(st == 400 and name in msg, "GPU: a tensor of another shape is refused naming it (%s)" % msg)
        st, p, msg = refusal(post(s.url, {"named_tensors": [dict(trainer_new.entry(name), name="model.no_such")]}))
        check(st == 400 and "no_such" in msg, "GPU: an unknown name is refused naming it (%s)" % msg)
        past = trainer_new.entry(name, offset=1 << 40)
        st, p, msg = refusal(post(s.url, {"named_tensors": [past]}))
        check(st == 400 and "past the shared allocation" in msg, "GPU: an offset past the allocation is refused (%s)" % msg)
        nothing = trainer_new.entry(name, ipc_handle=base64.b64encode(os.urandom(64)).decode())
        st, p, msg = refusal(post(s.url, {"named_tensors": [nothing]}))
        check(st == 400 and "does not open" in msg, "GPU: a handle of nothing is refused (%s)" % msg)
        still = outputs(s.url)
        check(bits(still) == bits(ref_new) and all(v == "v2" for _, _, v in still),
              "GPU: after the refusals the v2 weights still serve, weight_version v2")

        replies = trainer_old.send(s.url, "v1-again", parts=1)
        back = outputs(s.url)
        check(replies[0][0] == 200 and bits(back) == bits(ref_old) and all(v == "v1-again" for _, _, v in back),
              "GPU: the old weights sent back by IPC restore the old outputs bit for bit")


def main():
    with h.Server(MODEL) as s:
        body_refusals(s.url)
    torch, why = torch_cuda()
    if torch is None:
        print("skipped: the trainer on the GPU (%s)" % why)
    else:
        gpu_trainer(torch)
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
