#!/usr/bin/python3
"""PyTorch oracle for dtrain's GPT-2 parity test.

Usage:
  /usr/bin/python3 tests/ref/gpt2_ref.py DIR [--tol 1e-4]
  /usr/bin/python3 tests/ref/gpt2_ref.py --self-test

DIR holds three safetensors files written by dtrain (tests/parity_dump):
  init.safetensors    the initial weights (F32, dtrain names, "out x in" matrices, unpadded vocab)
                      and, as metadata, the hyperparameters: n_layer d_model n_head vocab context
                      B T lr min_lr warmup total_steps beta1 beta2 eps weight_decay clip train_steps
  batch.safetensors   "inputs"/"targets" I32 (B,T) for one forward/backward; "train_inputs"/
                      "train_targets" I32 (S,A,B,T), A = accum micro-batches per training step
  dtrain.safetensors  dtrain's results: "logits" (B,T,V), "loss" (1), "grad.<param>" for every
                      parameter, "train_losses" (S) and "train_norms" (S) (loss before the update,
                      global grad norm before clipping), and after the S steps "final.<param>",
                      "exp_avg.<param>", "exp_avg_sq.<param>" (weights and Adam moments)

The script rebuilds the model in float64 (tests/ref/gpt2_torch.py), then
  (a) runs the batch and compares logits, loss and every parameter gradient:
      rel = max|dtrain - ref| / max|ref| must be <= tol (absolute error if the reference is all 0);
  (b) trains S steps of `accum` micro-batches each from the init weights (lr schedule,
      clip_grad_norm_, AdamW with decay on 2-D tensors only) and compares each step's loss and
      pre-clip grad norm (relative error <= tol);
  (c) compares every weight and both Adam moments after the S steps (relative error <= tol).
It refuses to pass vacuously: clipping must trigger on some step (a reference norm > clip), and the
schedule must exercise both warmup (warmup >= 1) and cosine decay (some step s with
warmup <= s < total_steps, i.e. train_steps > warmup and total_steps > warmup).
Exit status 0 when everything passes, 1 otherwise (the failing tensor/step is printed).

--self-test writes a random tiny model, batch and float32 "dtrain" results (computed by torch) to
a temporary directory with its own safetensors writer, checks that the comparison passes, then
checks that it fails after perturbing one gradient element, one training norm, or when clipping
never triggers.

Dependencies: torch, numpy and the standard library only (safetensors is parsed by hand).
"""
import argparse
import copy
import json
import math
import os
import struct
import sys
import tempfile

sys.dont_write_bytecode = True      # keep tests/ref free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np                  # noqa: E402
import torch                        # noqa: E402

import gpt2_torch                   # noqa: E402

DEFAULT_TOL = 1e-4
# Weights after training: Adam divides each gradient by its own running RMS, so a gradient that
# is mathematically zero (the attention key bias: softmax ignores a per-query constant) but is
# float32 rounding noise in dtrain and float64 noise in the reference takes lr-sized steps of
# unrelated sign in each. Measured 2.8e-4 on the parity model; every other compared tensor
# (moments included) stays below DEFAULT_TOL.
DEFAULT_WEIGHTS_TOL = 1e-3

INT_KEYS = ["n_layer", "d_model", "n_head", "vocab", "context", "B", "T", "warmup",
            "total_steps", "train_steps", "accum"]
FLOAT_KEYS = ["lr", "min_lr", "beta1", "beta2", "eps", "weight_decay", "clip"]

_ST_DTYPES = {"F32": "<f4", "F64": "<f8", "I32": "<i4", "I64": "<i8", "F16": "<f2",
              "U8": "u1", "I8": "i1"}
_NP_TO_ST = {np.dtype("float32"): "F32", np.dtype("float64"): "F64",
             np.dtype("int32"): "I32", np.dtype("int64"): "I64"}


class ParityError(Exception):
    pass


# ----------------------------------------------------------------------------- safetensors I/O
def read_safetensors(path):
    """Returns (metadata dict str->str, dict name -> numpy array)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ParityError("%s: file too short (%d bytes)" % (path, len(raw)))
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ParityError("%s: header length %d exceeds file size %d" % (path, n, len(raw)))
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ParityError("%s: bad JSON header: %s" % (path, e))
    data = memoryview(raw)[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, info in header.items():
        dt = info.get("dtype")
        if dt not in _ST_DTYPES:
            raise ParityError("%s: tensor %r has unsupported dtype %r" % (path, name, dt))
        shape = [int(s) for s in info["shape"]]
        begin, end = (int(o) for o in info["data_offsets"])
        npdt = np.dtype(_ST_DTYPES[dt])
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * npdt.itemsize or begin < 0 or end > len(data):
            raise ParityError("%s: tensor %r: data_offsets [%d,%d] do not fit shape %s %s"
                              " (data section %d bytes)" % (path, name, begin, end, shape, dt,
                                                            len(data)))
        arr = np.frombuffer(data[begin:end], dtype=npdt, count=count).reshape(shape).copy()
        tensors[name] = arr
    return meta, tensors


def write_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> numpy array (float32/float64/int32/int64); metadata: str -> str."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs, off = [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        st = _NP_TO_ST[a.dtype]
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": st, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)          # data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


# ----------------------------------------------------------------------------- model helpers
def parse_meta(meta):
    hp = {}
    for k in INT_KEYS + FLOAT_KEYS:
        if k not in meta:
            raise ParityError("init.safetensors: metadata key %r missing" % k)
        try:
            v = float(meta[k])
        except ValueError:
            raise ParityError("init.safetensors: metadata %r=%r is not a number" % (k, meta[k]))
        if k in INT_KEYS:
            if v != int(v):
                raise ParityError("init.safetensors: metadata %r=%r is not an integer"
                                  % (k, meta[k]))
            v = int(v)
        hp[k] = v
    return hp


def build_model(hp, init, dtype):
    model = gpt2_torch.GPT2(hp["n_layer"], hp["d_model"], hp["n_head"], hp["vocab"],
                            hp["context"])
    expected = dict(model.named_parameters())
    missing = [n for n in expected if n not in init]
    extra = [n for n in init if n not in expected]
    if missing:
        raise ParityError("init.safetensors: missing tensors: %s" % ", ".join(missing))
    if extra:
        raise ParityError("init.safetensors: unexpected tensors: %s" % ", ".join(extra))
    state = {}
    for n, p in expected.items():
        if tuple(init[n].shape) != tuple(p.shape):
            raise ParityError("init.safetensors: %s has shape %s, expected %s"
                              % (n, list(init[n].shape), list(p.shape)))
        state[n] = torch.from_numpy(np.asarray(init[n], dtype=np.float64))
    model.load_state_dict(state, strict=True)
    return model.to(dtype)


def forward_backward(model, inputs, targets):
    """Returns (logits, loss, {param name: grad}) as float64 numpy arrays."""
    model.zero_grad(set_to_none=True)
    logits, loss = model(inputs, targets)
    loss.backward()
    grads = {n: p.grad.detach().double().numpy().copy() for n, p in model.named_parameters()}
    return (logits.detach().double().numpy(), np.array([loss.item()], dtype=np.float64), grads)


def train(model, train_inputs, train_targets, hp):
    """S steps of A micro-batches each (train_inputs is (S, A, B, T)): the loss of a step is the
    mean of its micro-batch losses and so is the gradient, as dtrain accumulates. Returns
    (losses, pre-clip norms, lrs, optimizer)."""
    opt = torch.optim.AdamW(gpt2_torch.param_groups(model, hp["weight_decay"]),
                            lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"])
    losses, norms, lrs = [], [], []
    A = train_inputs.shape[1]
    for s in range(train_inputs.shape[0]):
        lr = gpt2_torch.lr_at(s, hp["lr"], hp["min_lr"], hp["warmup"], hp["total_steps"])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for k in range(A):
            _, loss = model(train_inputs[s, k], train_targets[s, k])
            (loss / A).backward()
            total += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hp["clip"])
        opt.step()
        losses.append(total / A)
        norms.append(float(norm))
        lrs.append(lr)
    return losses, norms, lrs, opt


def rel_error(a, b):
    """max|a - b| / max|b| (b is the reference; plain max|a - b| if b is all zero)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        return float("inf")
    diff = float(np.max(np.abs(a - b))) if a.size else 0.0
    mb = float(np.max(np.abs(b))) if b.size else 0.0
    return diff / mb if mb > 0 else diff


# ----------------------------------------------------------------------------- the comparison
def compare(dirpath, tol=DEFAULT_TOL, out=print, weights_tol=DEFAULT_WEIGHTS_TOL):
    """Runs the whole check on DIR. Returns a list of failure strings (empty = pass)."""
    failures = []
    meta, init = read_safetensors(os.path.join(dirpath, "init.safetensors"))
    _, batch = read_safetensors(os.path.join(dirpath, "batch.safetensors"))
    _, got = read_safetensors(os.path.join(dirpath, "dtrain.safetensors"))
    hp = parse_meta(meta)
    B, T, S, V = hp["B"], hp["T"], hp["train_steps"], hp["vocab"]
    out("# gpt2_ref: n_layer=%d d_model=%d n_head=%d vocab=%d context=%d B=%d T=%d "
        "train_steps=%d tol=%g" % (hp["n_layer"], hp["d_model"], hp["n_head"], V,
                                   hp["context"], B, T, S, tol))

    def need(d, name, shape, where):
        if name not in d:
            raise ParityError("%s: tensor %r missing" % (where, name))
        if tuple(d[name].shape) != tuple(shape):
            raise ParityError("%s: %s has shape %s, expected %s"
                              % (where, name, list(d[name].shape), list(shape)))
        return d[name]

    for n in ("inputs", "targets"):
        need(batch, n, (B, T), "batch.safetensors")
    A = hp["accum"]
    for n in ("train_inputs", "train_targets"):
        need(batch, n, (S, A, B, T), "batch.safetensors")
    for n, a in batch.items():
        if a.size and (a.min() < 0 or a.max() >= V):
            raise ParityError("batch.safetensors: %s has token ids outside [0, %d)" % (n, V))
    if T > hp["context"]:
        raise ParityError("T=%d exceeds context=%d" % (T, hp["context"]))

    # (a) one forward/backward
    model = build_model(hp, init, torch.float64)
    inputs = torch.from_numpy(batch["inputs"].astype(np.int64))
    targets = torch.from_numpy(batch["targets"].astype(np.int64))
    logits, loss, grads = forward_backward(model, inputs, targets)
    checks = [("logits", logits), ("loss", loss)]
    checks += [("grad." + n, g) for n, g in grads.items()]
    worst = 0.0
    for name, ref in checks:
        if name not in got:
            failures.append("%s: missing from dtrain.safetensors" % name)
            out("FAIL %-40s missing" % name)
            continue
        a = got[name]
        if a.size != ref.size or (tuple(a.shape) != tuple(ref.shape) and name != "loss"):
            failures.append("%s: shape %s, expected %s" % (name, list(a.shape), list(ref.shape)))
            out("FAIL %-40s shape %s, expected %s" % (name, list(a.shape), list(ref.shape)))
            continue
        rel = rel_error(a.reshape(ref.shape), ref)
        ok = rel <= tol
        worst = max(worst, rel)
        extra = ""
        if not ok:
            d = np.abs(a.reshape(ref.shape).astype(np.float64) - ref)
            d[~np.isfinite(d)] = np.inf
            idx = np.unravel_index(int(np.argmax(d)), ref.shape)
            extra = "  worst at %s: dtrain=%.9g ref=%.9g" % (
                list(int(i) for i in idx), float(a.reshape(ref.shape)[idx]), float(ref[idx]))
            failures.append("%s: rel %.3e > %g%s" % (name, rel, tol, extra))
        out("%s %-40s %-16s rel=%.3e%s" % ("ok  " if ok else "FAIL", name,
                                            "x".join(str(s) for s in ref.shape), rel, extra))
    out("# forward/backward: %d tensors, worst rel %.3e" % (len(checks), worst))

    # (b) S training steps
    model = build_model(hp, init, torch.float64)
    tin = torch.from_numpy(batch["train_inputs"].astype(np.int64))
    ttg = torch.from_numpy(batch["train_targets"].astype(np.int64))
    losses, norms, lrs, opt = train(model, tin, ttg, hp)
    got_l = need(got, "train_losses", (S,), "dtrain.safetensors").astype(np.float64)
    got_n = need(got, "train_norms", (S,), "dtrain.safetensors").astype(np.float64)
    worst_t = 0.0
    out("# step  lr            loss_ref        loss_dtrain     rel        "
        "norm_ref        norm_dtrain     rel        clipped")
    for s in range(S):
        rl = abs(got_l[s] - losses[s]) / abs(losses[s]) if losses[s] != 0 else abs(got_l[s])
        rn = abs(got_n[s] - norms[s]) / abs(norms[s]) if norms[s] != 0 else abs(got_n[s])
        rl = rl if np.isfinite(rl) else float("inf")
        rn = rn if np.isfinite(rn) else float("inf")
        worst_t = max(worst_t, rl, rn)
        ok = rl <= tol and rn <= tol
        out("%s %4d  %.6e  %.9g  %.9g  %.3e  %.9g  %.9g  %.3e  %s" % (
            "ok  " if ok else "FAIL", s, lrs[s], losses[s], got_l[s], rl, norms[s], got_n[s], rn,
            "yes" if norms[s] > hp["clip"] else "no"))
        if rl > tol:
            failures.append("train step %d: loss dtrain=%.9g ref=%.9g rel %.3e > %g"
                            % (s, got_l[s], losses[s], rl, tol))
        if rn > tol:
            failures.append("train step %d: grad norm dtrain=%.9g ref=%.9g rel %.3e > %g"
                            % (s, got_n[s], norms[s], rn, tol))
    out("# training: %d steps of %d micro-batches, worst rel %.3e" % (S, A, worst_t))

    # (c) the state after the steps: every weight and both Adam moments of every tensor
    worst_s = 0.0
    for n, p in model.named_parameters():
        st = opt.state[p]
        for label, ref in (("final." + n, p.detach()), ("exp_avg." + n, st["exp_avg"]),
                           ("exp_avg_sq." + n, st["exp_avg_sq"])):
            ref = ref.double().numpy()
            if label not in got:
                failures.append("%s: missing from dtrain.safetensors" % label)
                continue
            rel = rel_error(got[label].reshape(ref.shape), ref)
            lim = weights_tol if label.startswith("final.") else tol
            worst_s = max(worst_s, rel)
            if not rel <= lim:
                failures.append("%s: rel %.3e > %g" % (label, rel, lim))
                out("FAIL %-40s rel=%.3e" % (label, rel))
    out("# state after training: %d weights (tol %g) and moments (tol %g), worst rel %.3e"
        % (3 * len(list(model.parameters())), weights_tol, tol, worst_s))

    # not vacuous
    n_clipped = sum(1 for n in norms if n > hp["clip"])
    if n_clipped == 0:
        failures.append("vacuous: clipping never triggered (max ref norm %.6g <= clip %g)"
                        % (max(norms) if norms else 0.0, hp["clip"]))
    if hp["warmup"] < 1:
        failures.append("vacuous: warmup=%d, the warmup phase is not exercised" % hp["warmup"])
    if not (S > hp["warmup"] and hp["total_steps"] > hp["warmup"]):
        failures.append("vacuous: no cosine-decay step (train_steps=%d, warmup=%d, "
                        "total_steps=%d)" % (S, hp["warmup"], hp["total_steps"]))
    out("# schedule: warmup steps %d, decay steps %d, min_lr steps %d; clipped steps %d/%d" % (
        min(S, hp["warmup"]), max(0, min(S, hp["total_steps"]) - hp["warmup"]),
        max(0, S - max(hp["total_steps"], hp["warmup"])), n_clipped, S))
    return failures


def run_dir(dirpath, tol, out=print):
    try:
        failures = compare(dirpath, tol, out)
    except (ParityError, OSError, KeyError, RuntimeError, ValueError) as e:
        failures = ["error: %s" % e]
    if failures:
        out("gpt2_ref: FAIL (%d problem%s)" % (len(failures), "" if len(failures) == 1 else "s"))
        for f in failures:
            out("  " + f)
    else:
        out("gpt2_ref: PASS")
    return failures


# ----------------------------------------------------------------------------- self-test
def _make_case(dirpath, seed=1234):
    """Random tiny model + batch; float32 torch stands in for dtrain."""
    g = torch.Generator().manual_seed(seed)
    hp = dict(n_layer=2, d_model=32, n_head=4, vocab=61, context=16, B=2, T=12,
              lr=1e-3, min_lr=1e-4, warmup=2, total_steps=6, beta1=0.9, beta2=0.95, eps=1e-8,
              weight_decay=0.1, clip=1.0, train_steps=8, accum=2)
    model = gpt2_torch.GPT2(hp["n_layer"], hp["d_model"], hp["n_head"], hp["vocab"],
                            hp["context"])
    gpt2_torch.gpt2_init_(model, std=0.05, generator=g)
    with torch.no_grad():      # non-trivial LayerNorm params and biases so every grad path matters
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0.0, 0.02, generator=g)
            elif ".ln_" in n or n.startswith("ln_f."):
                p.normal_(1.0, 0.1, generator=g)
    init = {n: p.detach().float().numpy().copy() for n, p in model.named_parameters()}
    B, T, S, V = hp["B"], hp["T"], hp["train_steps"], hp["vocab"]
    batch = {
        "inputs": torch.randint(0, V, (B, T), generator=g).int().numpy(),
        "targets": torch.randint(0, V, (B, T), generator=g).int().numpy(),
        "train_inputs": torch.randint(0, V, (S, 2, B, T), generator=g).int().numpy(),
        "train_targets": torch.randint(0, V, (S, 2, B, T), generator=g).int().numpy(),
    }
    m32 = build_model(hp, init, torch.float32)
    logits, loss, grads = forward_backward(m32, torch.from_numpy(batch["inputs"]).long(),
                                           torch.from_numpy(batch["targets"]).long())
    # clip at 0.6x the first step's norm, so clipping triggers on (at least) step 0
    m32 = build_model(hp, init, torch.float32)
    _, _, g0 = forward_backward(m32, torch.from_numpy(batch["train_inputs"][0, 0]).long(),
                                torch.from_numpy(batch["train_targets"][0, 0]).long())
    hp["clip"] = 0.6 * math.sqrt(sum(float((v ** 2).sum()) for v in g0.values()))
    m32 = build_model(hp, init, torch.float32)
    losses, norms, _, opt = train(m32, torch.from_numpy(batch["train_inputs"]).long(),
                                  torch.from_numpy(batch["train_targets"]).long(), hp)
    res = {"logits": logits.astype(np.float32), "loss": loss.astype(np.float32),
           "train_losses": np.array(losses, dtype=np.float32),
           "train_norms": np.array(norms, dtype=np.float32)}
    for n, p in m32.named_parameters():
        res["final." + n] = p.detach().float().numpy().copy()
        res["exp_avg." + n] = opt.state[p]["exp_avg"].float().numpy().copy()
        res["exp_avg_sq." + n] = opt.state[p]["exp_avg_sq"].float().numpy().copy()
    for n, v in grads.items():
        res["grad." + n] = v.astype(np.float32)
    meta = {k: repr(v) for k, v in hp.items()}
    write_safetensors(os.path.join(dirpath, "init.safetensors"), init, meta)
    write_safetensors(os.path.join(dirpath, "batch.safetensors"), batch)
    write_safetensors(os.path.join(dirpath, "dtrain.safetensors"), res)
    return hp, init, batch, res, meta


def self_test(tol):
    quiet = lambda *a, **k: None     # noqa: E731
    ok = True
    with tempfile.TemporaryDirectory(prefix="gpt2_ref_selftest_") as d:
        hp, init, batch, res, meta = _make_case(d)

        # round trip of the hand-written safetensors writer/reader
        m2, t2 = read_safetensors(os.path.join(d, "init.safetensors"))
        assert m2 == meta and all(np.array_equal(t2[n], init[n]) for n in init)

        print("== self-test 1: unmodified float32 results must PASS")
        f = run_dir(d, tol)
        if f:
            print("self-test: expected PASS, got FAIL")
            ok = False

        def expect_fail(label, what):
            print("== self-test: %s must FAIL" % label)
            f = run_dir(d, tol, out=quiet)
            hit = [x for x in f if what in x]
            print("   -> %s" % ("FAIL as expected: " + hit[0] if hit else
                                "NOT detected (failures: %s)" % f))
            return bool(hit)

        # 2: perturb one gradient element by 1e-3 of the tensor's max magnitude
        name = "grad.h.1.mlp.c_fc.weight"
        bad = dict(res)
        bad[name] = res[name].copy()
        bad[name][3, 5] += 1e-3 * float(np.abs(res[name]).max())
        write_safetensors(os.path.join(d, "dtrain.safetensors"), bad)
        ok &= expect_fail("2: one grad element perturbed (1e-3 rel)", name)

        # 3: perturb one training-step norm
        bad = dict(res)
        bad["train_norms"] = res["train_norms"].copy()
        bad["train_norms"][5] *= 1.001
        write_safetensors(os.path.join(d, "dtrain.safetensors"), bad)
        ok &= expect_fail("3: train_norms[5] perturbed (1e-3 rel)", "train step 5: grad norm")

        # 3b: perturb one Adam second moment and one final weight
        bad = dict(res)
        nm = "exp_avg_sq.h.0.attn.c_proj.weight"
        bad[nm] = res[nm].copy()
        bad[nm][1, 2] += 1e-3 * float(np.abs(res[nm]).max())
        write_safetensors(os.path.join(d, "dtrain.safetensors"), bad)
        ok &= expect_fail("3b: one exp_avg_sq element perturbed (1e-3 rel)", nm)
        bad = dict(res)
        nm = "final.ln_f.weight"
        bad[nm] = res[nm].copy()
        bad[nm][4] += 1e-2 * float(np.abs(res[nm]).max())
        write_safetensors(os.path.join(d, "dtrain.safetensors"), bad)
        ok &= expect_fail("3c: one final weight perturbed (1e-2 rel)", nm)

        # 4: clip so large that clipping never triggers (results consistent, but vacuous)
        write_safetensors(os.path.join(d, "dtrain.safetensors"), res)
        m = dict(meta, clip=repr(1e9))
        write_safetensors(os.path.join(d, "init.safetensors"), init, m)
        ok &= expect_fail("4: clip never triggered", "clipping never triggered")

        # 5: no decay phase (warmup == train_steps)
        m = dict(meta, warmup=str(hp["train_steps"]), total_steps=str(hp["train_steps"]))
        write_safetensors(os.path.join(d, "init.safetensors"), init, m)
        ok &= expect_fail("5: schedule never decays", "no cosine-decay step")
    print("gpt2_ref self-test: %s" % ("PASS" if ok else "FAIL"))
    return ok


def main():
    ap = argparse.ArgumentParser(description="PyTorch float64 oracle for dtrain's GPT-2 parity.")
    ap.add_argument("dir", nargs="?", help="directory with init/batch/dtrain .safetensors")
    ap.add_argument("--self-test", action="store_true", help="check this script on itself")
    ap.add_argument("--tol", type=float, default=DEFAULT_TOL, help="max relative error (1e-4)")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.self_test:
        sys.exit(0 if self_test(args.tol) else 1)
    if not args.dir:
        ap.error("DIR is required (or --self-test)")
    sys.exit(1 if run_dir(args.dir, args.tol) else 0)


if __name__ == "__main__":
    main()
