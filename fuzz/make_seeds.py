#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ from the test fixtures (run from the
repository root: python3 fuzz/make_seeds.py). The seeds are committed; this script says how they
were made. Each seed is small (a few KB at most) so that libFuzzer mutates them quickly."""
import json
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
OUT = os.path.join(ROOT, "fuzz", "corpus")


def out(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(header, data=b"", length=None):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def safetensors_seeds():
    t = "safetensors"
    out(t, "valid_f32", safetensors({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, bytes(24)))
    out(t, "valid_mixed", safetensors({
        "__metadata__": {"format": "pt", "ids": "1,2,3"},
        "w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
        "ids": {"dtype": "I64", "shape": [2], "data_offsets": [8, 24]},
        "h": {"dtype": "F16", "shape": [1], "data_offsets": [24, 26]},
        "empty": {"dtype": "F32", "shape": [0], "data_offsets": [26, 26]}}, bytes(26)))
    # Real tensor names and dtypes: the small tensors (norms) of a fixture, packed anew.
    header, offset = {}, 0
    for name, e in sorted(read_header(os.path.join(DATA, "qwen3moe-tiny", "model.safetensors")).items()):
        if name == "__metadata__" or len(e["shape"]) != 1:
            continue
        n = 4 * e["shape"][0]
        header[name] = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [offset, offset + n]}
        offset += n
        if len(header) == 8:
            break
    out(t, "fixture_norms", safetensors(header, bytes(offset)))
    # The malformed files of docs/hostile-inputs.md, as starting points.
    out(t, "overlap", safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12)))
    out(t, "reversed", safetensors({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}, bytes(8)))
    dup = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    out(t, "duplicate", struct.pack("<Q", len(dup)) + dup + bytes(8))
    out(t, "length_beyond", safetensors({}, b"", length=1000))
    # Regression: an empty tensor inside a's range once hid the overlap of a and c.
    out(t, "overlap_hidden_by_empty", safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                                   "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                                                   "c": {"dtype": "F32", "shape": [1], "data_offsets": [6, 10]}}, bytes(10)))
    out(t, "short", b"abc")


def config_seeds():
    for d in sorted(os.listdir(DATA)):
        p = os.path.join(DATA, d, "config.json")
        if os.path.exists(p):
            with open(p) as f:  # compact: fewer bytes for the fuzzer to wade through
                out("config", d, json.dumps(json.load(f), separators=(",", ":")))
    # transformers v5 moves rope settings, partial_rotary_factor included, into rope_parameters.
    with open(os.path.join(DATA, "glm4moe-tiny", "config.json")) as f:
        c = json.load(f)
    c["rope_parameters"] = {"rope_type": "default", "rope_theta": c.pop("rope_theta", 10000.0),
                            "partial_rotary_factor": c.pop("partial_rotary_factor", 0.5)}
    c.pop("rope_scaling", None)
    out("config", "glm4moe-tiny-v5-rope", json.dumps(c, separators=(",", ":")))


def tokenizer_seeds():
    texts = {
        "english": "Hello world! The quick brown fox jumps over the lazy dog.",
        "contractions": "I'm sure they'll say we've done it, don't you?",
        "code": "def f(x):\n    return x ** 2  # square\n\tprint(f'{x!r}')\r\n",
        "numbers": "3.14159 1,000,000 2024-06-01 0x1F",
        "cjk": "你好，世界。日本語のテキスト。한국어",
        "emoji": "👍🏽 🇩🇪 👨‍👩‍👧 ❤️",
        "chat": "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "spaces": "a   b\n\n\n   c \t\t d      ",
        "combining": "e\u0301 A\u030a \u1e9b\u0323",
    }
    for name, t in texts.items():
        out("tokenizer", name, t)
    out("tokenizer", "invalid_utf8", b"ok \xff\xfe \xc3( \xe2\x82 \xf0\x9f\x98 end")


def tokenizer_json_seeds():
    with open(os.path.join(DATA, "bpe-tokenizer", "tokenizer.json"), encoding="utf-8") as f:
        full = json.load(f)
    # The byte alphabet plus the first merges whose pieces stay in the kept vocabulary.
    vocab = {k: v for k, v in full["model"]["vocab"].items() if v < 300}
    merges = [m for m in full["model"]["merges"] if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    small = dict(full)
    small["model"] = dict(full["model"], vocab=vocab, merges=merges)
    out("tokenizer_json", "bpe_small", json.dumps(small, ensure_ascii=False, separators=(",", ":")))
    legacy = json.loads(json.dumps(small))
    legacy["model"]["merges"] = [" ".join(m) for m in merges]  # older "left right" spelling
    legacy["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}]}
    legacy["post_processor"] = {"type": "ByteLevel"}
    out("tokenizer_json", "bpe_legacy_merges", json.dumps(legacy, ensure_ascii=False, separators=(",", ":")))
    bare = json.loads(json.dumps(small))
    bare["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}
    bare["normalizer"] = None
    bare["model"]["ignore_merges"] = True
    out("tokenizer_json", "bpe_bytelevel_only", json.dumps(bare, ensure_ascii=False, separators=(",", ":")))
    # Regression: a number beyond double range once escaped the reader as a non-input error.
    out("tokenizer_json", "regression_number_overflow", '{"model": {"type": "BPE", "dropout": 1e999}}')


if __name__ == "__main__":
    shutil.rmtree(OUT, ignore_errors=True)
    safetensors_seeds()
    config_seeds()
    tokenizer_seeds()
    tokenizer_json_seeds()
