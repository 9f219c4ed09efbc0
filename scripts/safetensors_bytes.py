"""The safetensors format in Python, written once: a file's bytes from tensors, and the tensors of
a checkpoint folder. The tests and benchmarks that act as a trainer (tests/serve/weight_sync_test.py,
bench/weight_sync_bench.py) import it instead of each building headers of their own; the C++ side
has its one writer in src/io/safetensors.h (safetensors_prefix). fuzz/make_seeds.py keeps its own
on purpose: it writes malformed files.

Format: 8 bytes of little-endian header length N, N bytes of JSON {name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}, then the data. The header is padded with
spaces to a multiple of 8 so that the data starts aligned, as the C++ writer does.
"""
import json
import os
import struct


def safetensors_bytes(tensors):
    """A safetensors file's bytes for {name: (dtype, shape, raw)} or (name, (dtype, shape, raw))
    pairs, the data in the order given; raw is any bytes-like object (bytes, memoryview)."""
    items = tensors.items() if isinstance(tensors, dict) else tensors
    header, off, blobs = {}, 0, []
    for name, (dtype, shape, raw) in items:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hj = json.dumps(header).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    return b"".join([struct.pack("<Q", len(hj)), hj] + blobs)


def read_tensors(folder, skip_prefix=None, view=False):
    """{name: (dtype, shape, raw)} of every *.safetensors file of a checkpoint folder, files in name
    order. skip_prefix: leave out files whose name starts with it (the fixtures' golden logits).
    view: raw as memoryviews into each file's bytes (no copy per tensor: a benchmark's gigabytes)
    instead of bytes."""
    out = {}
    for fname in sorted(os.listdir(folder)):
        if not fname.endswith(".safetensors") or (skip_prefix and fname.startswith(skip_prefix)):
            continue
        with open(os.path.join(folder, fname), "rb") as f:
            raw = f.read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        data = memoryview(raw)[8 + n:] if view else raw[8 + n:]
        out.update({k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
                    for k, v in header.items() if k != "__metadata__"})
    return out
