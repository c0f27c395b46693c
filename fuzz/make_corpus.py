#!/usr/bin/python3
"""Writes the seed corpora of the fuzz harnesses: fuzz/corpus/<target>/<name>, valid files and
interesting broken ones. Deterministic; run from anywhere: /usr/bin/python3 fuzz/make_corpus.py
Files found by fuzzing (crashes kept as regressions) live beside these as crash-* / found-*.
"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def st_file(tensors, meta=None, pad=True):
    """tensors: list of (name, dtype, shape, bytes) -> safetensors bytes."""
    h, off, blobs = {}, 0, []
    if meta is not None:
        h["__metadata__"] = meta
    for name, dt, shape, b in tensors:
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    hj = json.dumps(h, separators=(",", ":")).encode()
    if pad:
        hj += b" " * ((8 - len(hj) % 8) % 8)
    return struct.pack("<Q", len(hj)) + hj + b"".join(blobs)


def st_raw(header, data=b""):
    return struct.pack("<Q", len(header)) + header + data


# Tiny GPT-2: L=1, C=4, NH=2, V=5, context=3 (dtrain names, "out x in").
L, C, NH, V, T = 1, 4, 2, 5, 3
KINDS = [("ln_1.weight", [C]), ("ln_1.bias", [C]), ("attn.c_attn.weight", [3 * C, C]),
         ("attn.c_attn.bias", [3 * C]), ("attn.c_proj.weight", [C, C]), ("attn.c_proj.bias", [C]),
         ("ln_2.weight", [C]), ("ln_2.bias", [C]), ("mlp.c_fc.weight", [4 * C, C]),
         ("mlp.c_fc.bias", [4 * C]), ("mlp.c_proj.weight", [C, 4 * C]), ("mlp.c_proj.bias", [C])]


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def tiny_tensors(vp=V):
    """(name, shape) in llm.c / dtrain-table order; wte with vp rows."""
    out = [("wte.weight", [vp, C]), ("wpe.weight", [T, C])]
    for k, s in KINDS:
        for l in range(L):
            out.append(("h.%d.%s" % (l, k), s))
    return out + [("ln_f.weight", [C]), ("ln_f.bias", [C])]


def dtrain_model(meta_over=None):
    meta = {"format": "dtrain-gpt2", "n_layer": str(L), "d_model": str(C), "n_head": str(NH),
            "vocab": str(V), "context": str(T), "step": "0", "tokenizer": "byte"}
    meta.update(meta_over or {})
    ts = [(n, "F32", s, f32([0.01 * (i % 17) for i in range(numel(s))])) for n, s in tiny_tensors()]
    return st_file(ts, meta)


def llmc_model(version=3, vp=8, magic=20240326, nh=NH, layers=L, cut=0, extra=b""):
    h = [0] * 256
    h[:8] = [magic, version, T, V, layers, nh, C, vp]
    body = b""
    for n, s in tiny_tensors(vp):
        vals = [0.5 - 0.03 * i for i in range(numel(s))]
        body += f32(vals) if version == 3 else b"".join(f32([v])[2:] for v in vals)
    data = struct.pack("<256i", *h) + body + extra
    return data[:len(data) - cut] if cut else data


def safetensors_corpus():
    t = "safetensors"
    put(t, "empty-header", st_raw(b"{}"))
    put(t, "one-f32", st_file([("a", "F32", [2, 3], f32(range(6)))], {"step": "3"}))
    put(t, "i32-and-scalar", st_file([("ids", "I32", [3], struct.pack("<3i", 7, -8, 9)),
                                      ("s", "F32", [], f32([1.0]))]))
    put(t, "zero-dim", st_file([("z", "F32", [0, 4], b"")]))
    put(t, "dtrain-model", dtrain_model())
    put(t, "bad-truncated", dtrain_model()[:-7])
    put(t, "bad-hlen-huge", struct.pack("<Q", 1 << 62) + b"{}")
    put(t, "bad-not-json", st_raw(b"{\"a\": [1, 2"))
    put(t, "bad-not-object", st_raw(b"[1,2,3]"))
    put(t, "bad-offsets-outside", st_raw(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}}', b"\0" * 8))
    put(t, "bad-offsets-strings", st_raw(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":["0",4]}}', b"\0" * 4))
    put(t, "bad-shape-size", st_raw(b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', b"\0" * 8))
    put(t, "bad-dtype", st_raw(b'{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}', b"\0" * 4))
    put(t, "bad-negative-dim", st_raw(b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', b"\0" * 4))
    put(t, "bad-huge-dims", st_raw(b'{"a":{"dtype":"F32","shape":[1e15,1e15,1e15],"data_offsets":[0,4]}}', b"\0" * 4))
    put(t, "bad-misaligned", st_raw(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}}', b"\0" * 8))
    put(t, "bad-meta-number", st_raw(b'{"__metadata__":{"step":3}}'))
    put(t, "bad-five-dims", st_raw(b'{"a":{"dtype":"F32","shape":[1,1,1,1,1],"data_offsets":[0,4]}}', b"\0" * 4))
    put(t, "short", b"\x02\0\0")
    # Found by fuzzing: names with control characters made messages span lines.
    put(t, "crash-name-newline", st_raw(b'{"a\\nb":{"dtype":"F32","shape":[9],"data_offsets":[0,4]}}', b"\0" * 4))
    put(t, "crash-meta-key-newline", st_raw(b'{"__metadata__":{"k\\n":1}}'))


def shard_file(version=1, tokens=(1, 2, 3, 4), magic=20240520, count=None):
    h = [0] * 256
    h[:3] = [magic, version, len(tokens) if count is None else count]
    fmt = "<%dH" if version == 1 else "<%dI"
    return struct.pack("<256i", *h) + struct.pack(fmt % len(tokens), *tokens)


def shard_corpus():
    t = "shard"
    # byte 0: bits 0-1 format (0 auto, 1 llmc, 2 raw16), bit 2 ".bin", bit 3 vocab > 65535;
    # bytes 1-2: vocab - 1 (little-endian)
    def sel(fmt, binname, vocab):
        big = vocab > 65536
        v = vocab - 1 - (65536 if big else 0)
        return bytes([fmt | (4 if binname else 0) | (8 if big else 0), v & 255, v >> 8])
    put(t, "llmc-v1", sel(0, 1, 50257) + shard_file(1, range(0, 600, 7)))
    put(t, "llmc-v7", sel(1, 0, 100000) + shard_file(7, [70000, 1, 99999, 5]))
    put(t, "llmc-v7-auto", sel(0, 0, 70000) + shard_file(7, [65536, 2]))
    put(t, "raw16-auto", sel(0, 1, 300) + struct.pack("<6H", 1, 2, 3, 299, 0, 5))
    put(t, "raw16-forced", sel(2, 0, 256) + struct.pack("<100H", *range(0, 200, 2)))
    put(t, "bad-token", sel(1, 1, 10) + shard_file(1, [1, 2, 10]))
    put(t, "bad-token-raw", sel(2, 1, 10) + struct.pack("<3H", 1, 9, 11))
    put(t, "bad-magic-llmc-header", sel(0, 1, 50257) + shard_file(1, [1, 2], magic=20240521))
    put(t, "bad-version", sel(1, 1, 50257) + shard_file(3, [1, 2]))
    put(t, "bad-count", sel(1, 1, 50257) + shard_file(1, [1, 2, 3], count=5))
    put(t, "bad-empty", sel(1, 1, 50257) + shard_file(1, [], count=0))
    put(t, "bad-short-header", sel(1, 1, 50257) + shard_file(1, [1])[:100])
    put(t, "bad-odd-raw", sel(2, 1, 50257) + b"\1\0\2")
    put(t, "bad-not-bin", sel(0, 0, 50257) + b"\1\0\2\0")
    put(t, "empty-file", sel(0, 1, 50257))


def llmc_corpus():
    t = "llmc"
    put(t, "fp32", b"\1" + llmc_model(3))
    put(t, "bf16", b"\1" + llmc_model(5))
    put(t, "fp32-vp-eq-v", b"\0" + llmc_model(3, vp=V))  # found by magic, not by name
    put(t, "dtrain-model", b"\0" + dtrain_model())
    put(t, "dtrain-model-as-bin", b"\1" + dtrain_model())
    put(t, "bad-dtrain-meta", b"\0" + dtrain_model({"n_head": "3"}))
    put(t, "bad-dtrain-vocab", b"\0" + dtrain_model({"vocab": "6"}))
    put(t, "bad-truncated", b"\1" + llmc_model(3, cut=3))
    put(t, "bad-extra", b"\1" + llmc_model(5, extra=b"\0\0"))
    put(t, "bad-version", b"\1" + llmc_model(4))
    put(t, "bad-magic", b"\1" + llmc_model(3, magic=20240325))
    put(t, "bad-vp", b"\1" + llmc_model(3, vp=4))
    put(t, "bad-heads", b"\1" + llmc_model(3, nh=3))
    put(t, "bad-layers", b"\1" + llmc_model(3, layers=-1))
    put(t, "bad-short", b"\1" + llmc_model(3)[:1000])
    put(t, "bad-shard", b"\1" + shard_file(1, [1, 2]))
    # Found by fuzzing: the model-file reader echoed the format value (with a newline).
    put(t, "crash-format-newline", b"\0" + dtrain_model({"format": "x\ny"}))


def manifest_corpus():
    t = "manifest"
    good = {"format": "dtrain-checkpoint", "version": 1, "step": 120, "world": 2,
            "strategy": "zero3", "checksum": "xxh3-64",
            "files": [{"name": "model.safetensors", "size": 1234, "xxh3": "0f1e2d3c4b5a6978"},
                      {"name": "trainer.json", "size": 0, "xxh3": "ffffffffffffffff"}]}

    # byte 0 = 1: the harness appends the manifest's own checksum to the text, which ends
    # before the object's closing brace
    def var(**kw):
        d = json.loads(json.dumps(good))
        d.update(kw)
        return b"\1" + json.dumps(d).encode()[:-1]
    put(t, "good", b"\1" + json.dumps(good, indent=1).encode()[:-1])
    put(t, "bad-self-checksum", b"\0" + json.dumps(good).encode()[:-1] +
        b', "manifest_xxh3": "0123456789abcdef"}\n')
    put(t, "bad-format", var(format="dtrain-gpt2"))
    put(t, "bad-version", var(version=2))
    put(t, "bad-step", var(step=-1))
    put(t, "bad-world", var(world=0))
    put(t, "bad-checksum", var(checksum="crc32c"))
    put(t, "bad-strategy-long", var(strategy="x" * 40))
    put(t, "bad-no-files", var(files=[]))
    put(t, "bad-slash", var(files=[{"name": "../model", "size": 1, "xxh3": "0000000000000000"}]))
    put(t, "bad-dup", var(files=[good["files"][0], good["files"][0]]))
    put(t, "bad-hash", var(files=[{"name": "a", "size": 1, "xxh3": "xyz"}]))
    put(t, "bad-size", var(files=[{"name": "a", "size": -1, "xxh3": "0000000000000000"}]))
    put(t, "bad-json", b'\1{"format": "dtrain-checkpoint", "files": [')
    put(t, "bad-not-object", b"\1[")
    # Found by fuzzing: a size of 1e19 was cast to int64 before the range check (UB).
    put(t, "crash-size-1e19", var(files=[{"name": "a", "size": 1e19, "xxh3": "0000000000000000"}]))


if __name__ == "__main__":
    safetensors_corpus()
    shard_corpus()
    llmc_corpus()
    manifest_corpus()
