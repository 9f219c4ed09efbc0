"""Weight sync over HTTP without disk: how fast a trainer's weights reach `epmoe serve`.

Starts `epmoe serve` on MODEL (CPU), reads a second checkpoint NEW of the same shapes (the
trainer's weights, in this process's memory), and sends all of its tensors as safetensors buckets
of about --bucket-mb to POST /update_weights_from_safetensors, the last one committing. Prints the
bytes, the staging time (buckets in), the commit time (every rank checks and swaps in the new
weights) and GB/s of the whole; then one greedy request on the new weights. Printed, never asserted.

--ipc (a GPU machine with torch): the server runs with --device cuda and the trainer's tensors live
on the same GPU as torch CUDA tensors, sent by CUDA IPC handle to POST /update_weights_from_tensor
in buckets of about --bucket-mb (a colocated trainer, the RL frameworks' usual layout); the server's
own copy time (GPU -> host) is printed beside the whole.

  python3 bench/weight_sync_bench.py --epmoe build/epmoe --model OLD --new NEW [--bucket-mb 512] [--ranks 1] [--ipc]
      [--serve-args "--device cuda"]
"""
import argparse
import http.client
import os
import shlex
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import safetensors_bytes  # noqa: E402
from serve_process import start_serve  # noqa: E402


def read_tensors(folder):
    """{name: (dtype, shape, raw)}, raw a view into its file's bytes (no copy per tensor)."""
    return safetensors_bytes.read_tensors(folder, view=True)


def bucket(tensors):
    """A safetensors file's bytes for (name, (dtype, shape, raw)) pairs."""
    return safetensors_bytes.safetensors_bytes(tensors)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epmoe", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--bucket-mb", type=int, default=512)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--ipc", action="store_true", help="torch CUDA tensors by IPC handle (--device cuda)")
    ap.add_argument("--serve-args", default="", help="more `epmoe serve` flags, e.g. \"--device cuda\"")
    a = ap.parse_args()
    cmd = [a.epmoe, "serve", "--model", a.model, "--port", "0", "--max-body-mb", str(2 * a.bucket_mb + 64)]
    if a.ipc:
        return ipc(a, cmd + ["--device", "cuda"])
    cmd += shlex.split(a.serve_args)
    if a.ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "-np", str(a.ranks)] + cmd + ["--threads", "1"]
    proc, url = start_serve(cmd)
    try:
        tensors = sorted(read_tensors(a.new).items(), key=lambda kv: kv[0])
        buckets, cur, size = [], [], 0
        for name, t in tensors:
            if cur and size + len(t[2]) > a.bucket_mb << 20:
                buckets.append(cur)
                cur, size = [], 0
            cur.append((name, t))
            size += len(t[2])
        buckets.append(cur)
        total = sum(len(t[2]) for _, t in tensors)
        # (http.client sends a body with one sendall; httpx's uploads ran at ~15 MB/s here.)
        host, port = url.split("//")[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=3600)

        def post(query, body):
            conn.request("POST", "/update_weights_from_safetensors?" + query, body=body,
                         headers={"Content-Type": "application/octet-stream"})
            r = conn.getresponse()
            text = r.read()
            assert r.status == 200, text
        blobs = [bucket(b) for b in buckets]  # (built first: the trainer's serialization is not timed)
        t0 = time.time()
        for b in blobs[:-1]:
            post("commit=false", b)
        t1 = time.time()
        post("weight_version=bench", blobs[-1])
        t2 = time.time()
        print("weights: %.2f GB in %d tensors, %d buckets of <= %d MB, %d rank(s)" %
              (total / 1e9, len(tensors), len(buckets), a.bucket_mb, a.ranks))
        print("staged %d buckets in %.2f s; the last bucket + commit (check, swap in, every rank) %.2f s" %
              (len(buckets) - 1, t1 - t0, t2 - t1))
        print("whole update: %.2f s, %.2f GB/s" % (t2 - t0, total / 1e9 / (t2 - t0)))
        d = httpx.post(url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {
            "max_new_tokens": 4, "temperature": 0}}, timeout=600).json()
        print("after: weight_version %s, output %s" % (d["meta_info"]["weight_version"], d["output_ids"]))
    finally:
        proc.terminate()
        proc.wait(60)


def ipc(a, cmd):
    import base64
    import torch
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F8_E4M3": torch.float8_e4m3fn}
    tensors = sorted(read_tensors(a.new).items(), key=lambda kv: kv[0])
    # The trainer's weights on the GPU, one bucket of about bucket_mb per flat buffer (as the RL
    # frameworks' flattened buckets), each tensor a view into it.
    buckets, cur, size = [], [], 0
    for name, t in tensors:
        if cur and size + len(t[2]) > a.bucket_mb << 20:
            buckets.append(cur)
            cur, size = [], 0
        cur.append((name, t))
        size += len(t[2])
    buckets.append(cur)
    bodies, keep = [], []
    for b in buckets:
        flat = torch.empty(sum(len(t[2]) for _, t in b), dtype=torch.uint8, device="cuda")
        _, handle, _, base_off = flat.untyped_storage()._share_cuda_()[:4]
        entries, off = [], 0
        for name, (dtype, shape, raw) in b:
            flat[off:off + len(raw)].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
            entries.append({"name": name, "dtype": dtype, "shape": shape,
                            "ipc_handle": base64.b64encode(handle).decode(), "offset": base_off + off})
            off += len(raw)
        keep.append(flat)
        bodies.append(entries)
    torch.cuda.synchronize()
    total = sum(len(t[2]) for _, t in tensors)
    proc, url = start_serve(cmd)
    try:
        copy_s = 0.0
        t0 = time.time()
        for i, entries in enumerate(bodies):
            last = i == len(bodies) - 1
            r = httpx.post(url + "/update_weights_from_tensor", json={
                "named_tensors": entries, "commit": last, "weight_version": "bench" if last else None}, timeout=3600)
            assert r.status_code == 200, r.text
            copy_s += r.json()["copy_seconds"]
            if i == len(bodies) - 2:
                t1 = time.time()
        t2 = time.time()
        t1 = t1 if len(bodies) > 1 else t0
        print("weights: %.2f GB in %d tensors, %d buckets of <= %d MB on the GPU (torch), by CUDA IPC handle" %
              (total / 1e9, len(tensors), len(bodies), a.bucket_mb))
        print("server's copies GPU -> host: %.2f s, %.2f GB/s" % (copy_s, total / 1e9 / copy_s))
        print("staged %d buckets in %.2f s; the last bucket + commit (check, rebuild on the GPU) %.2f s" %
              (len(bodies) - 1, t1 - t0, t2 - t1))
        print("whole update: %.2f s, %.2f GB/s" % (t2 - t0, total / 1e9 / (t2 - t0)))
        d = httpx.post(url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {
            "max_new_tokens": 4, "temperature": 0}}, timeout=600).json()
        print("after: weight_version %s, output %s" % (d["meta_info"]["weight_version"], d["output_ids"]))
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
