#!/usr/bin/env python3
"""Two checkpoint step directories hold the same state, whatever layout wrote them
(tensor parallelism's canonical index space, docs/FORMATS.md version 2):
  - every tensor of model.safetensors bitwise equal;
  - the AdamW moments, put together from every optim-rank*.safetensors by their pieces
    ("global:local:count" in the canonical space), bitwise equal where both hold a value; a
    value only one of them holds must be 0 (vocabulary padding: a tensor-parallel run's files
    leave it out);
  - trainer.json's step, tokens seen, seed and data cursor equal;
  - no NaN or Inf anywhere (equal bits of a NaN prove nothing).
Usage: ckpt_canon.py STEP_DIR_A STEP_DIR_B. Prints one line; exit 1 on any difference."""
import glob, json, os, struct, sys
import numpy as np


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    meta = head.pop("__metadata__", {})
    tens = {}
    for name, t in head.items():
        a, b = t["data_offsets"]
        dt = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}[t["dtype"]]
        tens[name] = np.frombuffer(data[a:b], dtype=dt)
    return meta, tens


def moments(step):
    m = v = have = None
    for p in sorted(glob.glob(os.path.join(step, "optim-rank*.safetensors"))):
        meta, t = read_st(p)
        n = int(meta["n_params"])
        if m is None:
            m, v, have = np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.int8)
        for piece in filter(None, meta["pieces"].split(",")):
            g, l, c = map(int, piece.split(":"))
            m[g:g + c] = t["exp_avg"][l:l + c]
            v[g:g + c] = t["exp_avg_sq"][l:l + c]
            have[g:g + c] += 1
    if have is not None and have.max() > 1:
        sys.exit(f"FAIL {step}: {int((have > 1).sum())} moment values written twice")
    return m, v, have


def main():
    a, b = sys.argv[1], sys.argv[2]
    _, ma = read_st(os.path.join(a, "model.safetensors"))
    _, mb = read_st(os.path.join(b, "model.safetensors"))
    if sorted(ma) != sorted(mb):
        sys.exit(f"FAIL: model tensors differ: {sorted(set(ma) ^ set(mb))}")
    for k in ma:
        if ma[k].tobytes() != mb[k].tobytes():
            sys.exit(f"FAIL: model tensor {k} differs")
        if ma[k].dtype == np.float32 and not np.all(np.isfinite(ma[k])):
            sys.exit(f"FAIL: model tensor {k} holds NaN or Inf")  # equal bits of a NaN prove nothing
    (m1, v1, h1), (m2, v2, h2) = moments(a), moments(b)
    if m1 is None or m2 is None or len(m1) != len(m2):
        sys.exit("FAIL: optimizer files missing or of different sizes")
    if not (np.all(np.isfinite(m1)) and np.all(np.isfinite(v1))):
        sys.exit("FAIL: the moments hold NaN or Inf")
    both = (h1 > 0) & (h2 > 0)
    for name, x, y in (("exp_avg", m1, m2), ("exp_avg_sq", v1, v2)):
        if x[both].tobytes() != y[both].tobytes():
            sys.exit(f"FAIL: {name} differs at {int((x[both] != y[both]).sum())} of {int(both.sum())} values")
        lone = ((h1 > 0) ^ (h2 > 0))
        if np.any(np.where(h1 > 0, x, y)[lone] != 0):
            sys.exit(f"FAIL: {name}: a value held by one checkpoint only is not 0")
    ta = json.load(open(os.path.join(a, "trainer.json")))
    tb = json.load(open(os.path.join(b, "trainer.json")))
    for k in ("step", "tokens_seen", "seed", "data"):
        if ta.get(k) != tb.get(k):
            sys.exit(f"FAIL: trainer.json {k}: {ta.get(k)} vs {tb.get(k)}")
    print(f"same state: {len(ma)} tensors, {int(both.sum())} moment values of {len(m1)} "
          f"({int(((h1 > 0) ^ (h2 > 0)).sum())} padding values held by one only), step {ta['step']}, "
          f"data {ta.get('data')}")


main()
