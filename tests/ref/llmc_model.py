#!/usr/bin/python3
"""llm.c model files for dtrain's import test (dtrain ckpt import-llmc), without llm.c.

Usage:
  /usr/bin/python3 tests/ref/llmc_model.py write DIR
  /usr/bin/python3 tests/ref/llmc_model.py compare DIR/x.safetensors fp32|bf16

write: known random weights (numpy seed 1234; dtrain/HF names, matrices "out x in" as nn.Linear)
for L=2, C=48, NH=4, V=300, maxT=32, written in llm.c's model layout (train_gpt2.py
write_model): 256 int32 header [20240326, version, maxT, V, L, NH, C, Vp], then wte (Vp rows),
wpe, then each per-layer kind for all layers at once (ln_1.w, ln_1.b, c_attn.w, c_attn.b,
attn.c_proj.w, .b, ln_2.w, .b, c_fc.w, .b, mlp.c_proj.w, .b), ln_f.w, ln_f.b. Files:
  good_fp32.bin   version 3, Vp = 384; padding rows hold 7.0 (must not reach dtrain)
  good_bf16.bin   version 5 (bf16, round to nearest even), Vp = V = 300
and broken ones, each named after what is wrong: bad_magic, bad_version, truncated (4 bytes
short), extra (4 bytes more), short_header (100 bytes), vp_below_v, heads (NH does not divide
C), zero_layers, shard (an llm.c token-shard header).

compare: reads the dtrain model file that import-llmc wrote and requires exactly the expected
tensor names, shapes and metadata, and every value bitwise equal to the fp32 weights (fp32) or to
the bf16 values widened to fp32 (bf16). Exit status 0 on success, 1 otherwise.
"""
import os
import struct
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np                       # noqa: E402

from gpt2_ref import read_safetensors    # noqa: E402

L, C, NH, V, MAXT = 2, 48, 4, 300, 32

# Per-layer kinds in llm.c's (and dtrain's table) order: (name, shape)
LAYER_KINDS = [("ln_1.weight", (C,)), ("ln_1.bias", (C,)),
               ("attn.c_attn.weight", (3 * C, C)), ("attn.c_attn.bias", (3 * C,)),
               ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)),
               ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
               ("mlp.c_fc.weight", (4 * C, C)), ("mlp.c_fc.bias", (4 * C,)),
               ("mlp.c_proj.weight", (C, 4 * C)), ("mlp.c_proj.bias", (C,))]


def weights():
    rng = np.random.default_rng(1234)
    w = {"wte.weight": rng.standard_normal((V, C)), "wpe.weight": rng.standard_normal((MAXT, C))}
    for l in range(L):
        for k, s in LAYER_KINDS:
            w["h.%d.%s" % (l, k)] = rng.standard_normal(s)
    w["ln_f.weight"] = rng.standard_normal(C)
    w["ln_f.bias"] = rng.standard_normal(C)
    return {n: (a * 0.3).astype(np.float32) for n, a in w.items()}


def to_bf16_bits(a):
    """float32 -> bf16 bits (uint16), round to nearest even (as torch's .to(bfloat16))."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def widen_bf16(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def ordered(w, vp, pad_value):
    """The tensors in llm.c's file order; wte padded to vp rows with pad_value."""
    wte = np.full((vp, C), pad_value, dtype=np.float32)
    wte[:V] = w["wte.weight"]
    out = [wte, w["wpe.weight"]]
    for k, _ in LAYER_KINDS:
        for l in range(L):
            out.append(w["h.%d.%s" % (l, k)])
    return out + [w["ln_f.weight"], w["ln_f.bias"]]


def header(version, vp, magic=20240326, maxt=MAXT, v=V, layers=L, nh=NH, c=C):
    h = [0] * 256
    h[:8] = [magic, version, maxt, v, layers, nh, c, vp]
    return struct.pack("<256i", *h)


def write(d):
    os.makedirs(d, exist_ok=True)
    w = weights()
    fp32 = b"".join(t.astype("<f4").tobytes() for t in ordered(w, 384, 7.0))
    bf16 = b"".join(to_bf16_bits(t).astype("<u2").tobytes() for t in ordered(w, V, 0.0))
    files = {
        "good_fp32.bin": header(3, 384) + fp32,
        "good_bf16.bin": header(5, V) + bf16,
        "bad_magic.bin": header(3, 384, magic=20240327) + fp32,
        "bad_version.bin": header(1, 384) + fp32,
        "truncated.bin": (header(3, 384) + fp32)[:-4],
        "extra.bin": header(3, 384) + fp32 + b"\0\0\0\0",
        "short_header.bin": header(3, 384)[:100],
        "vp_below_v.bin": header(3, 256) + fp32,
        "heads.bin": header(3, 384, nh=5) + fp32,
        "zero_layers.bin": header(3, 384, layers=0) + fp32,
        "shard.bin": header(1, 0, magic=20240520) + fp32,
    }
    for name, data in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return 0


def compare(path, kind):
    meta, got = read_safetensors(path)
    want = weights()
    if kind == "bf16":
        want = {n: widen_bf16(to_bf16_bits(a)) for n, a in want.items()}
    for k, v in {"format": "dtrain-gpt2", "n_layer": L, "d_model": C, "n_head": NH, "vocab": V,
                 "context": MAXT}.items():
        if meta.get(k) != str(v):
            print("FAIL %s: metadata %s = %r, expected %r" % (path, k, meta.get(k), str(v)))
            return 1
    if set(got) != set(want):
        print("FAIL %s: tensors %s missing, %s unexpected" % (path, sorted(set(want) - set(got)),
                                                            sorted(set(got) - set(want))))
        return 1
    for n, a in want.items():
        g = got[n]
        if g.shape != a.shape or g.dtype != np.float32 or \
                not np.array_equal(g.view(np.uint32), a.view(np.uint32)):
            print("FAIL %s: tensor %s differs (shape %s vs %s)" % (path, n, g.shape, a.shape))
            return 1
    print("ok   %s: %d tensors bitwise equal to the %s weights" % (path, len(want), kind))
    return 0


def main():
    a = sys.argv[1:]
    if len(a) == 2 and a[0] == "write":
        return write(a[1])
    if len(a) == 3 and a[0] == "compare" and a[2] in ("fp32", "bf16"):
        return compare(a[1], a[2])
    print(__doc__.strip().splitlines()[2], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
