#!/usr/bin/python3
"""Compares two dtrain runs: their JSONL metrics (losses per step) and final weight files.

Usage: compare_runs.py METRICS_A WEIGHTS_A METRICS_B WEIGHTS_B TOL [losses-only] [--atol ATOL | --normwise]

Run B is the reference. TOL = 0 demands bitwise equality of every loss and every weight
tensor. Otherwise each loss must agree to TOL relative (|a - b| <= TOL |b|), and each weight
tensor both
  normwise:    max |a - b| / max |b| <= TOL over the tensor, and
  elementwise: |a_i - b_i| <= ATOL + TOL |b_i| for every element i.
The normwise measure alone lets a small element be wholly wrong (one 1e-4 of its tensor's
largest, 100% off, passes TOL 1e-4); the elementwise one does not, down to elements of about
ATOL. ATOL (default 1e-6, --atol) is the absolute difference allowed on any element: the
weights of the tiny test models are ~1e-2 to 1, where fp32 rounding is 1e-9 to 1e-7, so the
rounding of runs that sum in another order fits under it (test_resume's resharded resumes,
compared at TOL 1e-5, are even bitwise equal), while a wholly wrong element of about 1e-6 or
more fails. --normwise drops the elementwise check, for runs whose elements legitimately
differ by more; the caller says why (e.g. a bias whose gradient is mathematically zero: AdamW
turns its rounding noise, different per summation order, into lr-sized steps).
With "losses-only" the weights are reported but only the losses are judged (the same reason).

Non-finite values fail in every mode, in either run: a loss that is NaN, Inf or null (dtrain
logs a non-finite loss as null), or a NaN/Inf weight. A run that diverged has nothing to agree
with, and a NaN error must never pass as small (every comparison of NaN is false, so a check
written `err > tol -> fail` lets it through; here each check is written `not err <= tol`).
Metrics of a resumed run may hold a step more than once (the last record counts).
Prints the worst errors (and what failed); exit 1 on failure.
"""
import json
import math
import struct
import sys

import numpy as np

from tensor_check import errors, scalar_rel

DEFAULT_ATOL = 1e-6


def losses(path):
    """(step, loss) per step. A resumed run appends to the file and re-logs the steps after
    its checkpoint: the last record of each step is the one that counts. A line cut short by
    a kill is skipped. A loss is a float, or None where the file holds null (non-finite)."""
    last = {}
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("type") == "step":
            v = r.get("loss")
            last[r["step"]] = float(v) if isinstance(v, (int, float)) else None
    return sorted(last.items())


def _bf16(raw):
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


DTYPES = {"F32": lambda r: np.frombuffer(r, dtype="<f4"), "F64": lambda r: np.frombuffer(r, dtype="<f8"),
          "F16": lambda r: np.frombuffer(r, dtype="<f2"), "BF16": _bf16,
          "I32": lambda r: np.frombuffer(r, dtype="<i4"), "I64": lambda r: np.frombuffer(r, dtype="<i8")}


def tensors(path):
    """name -> the tensor's values, flat: floats and integers by their dtype, any other dtype
    (e.g. packed 4-bit codes) as raw bytes, which compare() compares bitwise."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = DTYPES.get(v.get("dtype", "F32"), lambda r: np.frombuffer(r, dtype=np.uint8))(data[b:e])
    return out


def finite(x):
    return x is not None and math.isfinite(x)


def compare(ma, wa, mb, wb, tol, losses_only=False, atol=DEFAULT_ATOL, elementwise=True):
    """(ok, summary line, [reasons it failed])."""
    why = []
    la, lb = losses(ma), losses(mb)
    if not la:
        why.append("%s: no step losses" % ma)
    if [s for s, _ in la] != [s for s, _ in lb]:
        why.append("the runs logged different steps (%d vs %d)" % (len(la), len(lb)))
    worst_loss, loss_nonfinite = 0.0, False
    for run, ls in (("A", la), ("B", lb)):
        nf = [s for s, v in ls if not finite(v)]
        if nf:
            why.append("run %s: non-finite loss at %d step(s), first step %d" % (run, len(nf), nf[0]))
            worst_loss, loss_nonfinite = math.inf, True
    for (s, a), (_, b) in zip(la, lb):
        if not (finite(a) and finite(b)):
            continue
        e = scalar_rel(a, b)
        if not e <= worst_loss:  # keeps inf
            worst_loss = e
        if tol == 0 and a != b:
            why.append("step %d: loss %.9g vs %.9g (bitwise wanted)" % (s, a, b))
    if tol > 0 and not worst_loss <= tol and not loss_nonfinite:
        why.append("worst loss rel err %.3e > %g" % (worst_loss, tol))

    ta, tb = tensors(wa), tensors(wb)
    if ta.keys() != tb.keys():
        why.append("the weight files hold different tensors: %s" % sorted(set(ta) ^ set(tb))[:8])
    worst_n, worst_nn = 0.0, ""    # normwise (tol 0: 0 or inf)
    worst_e, worst_en = 0.0, ""    # elementwise, with the element
    judged = not losses_only or tol == 0  # bitwise judges the weights always
    for k in sorted(set(ta) & set(tb)):
        a, b = ta[k], tb[k]
        nonfinite = False
        for run, x in (("A", a), ("B", b)):
            if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
                nonfinite = True
                bad = ~np.isfinite(x)
                i = int(np.argmax(bad))
                # even with losses-only: a run that diverged is not the same training
                why.append("run %s: %d non-finite value(s) in %s (first [%d] = %r)" % (
                    run, int(bad.sum()), k, i, float(x[i])))
        if a.size != b.size:
            why.append("%s: %d elements vs %d" % (k, a.size, b.size))
            continue
        bitwise = tol == 0 or a.dtype.kind != "f" or b.dtype.kind != "f"
        if bitwise:
            n = 0.0 if a.tobytes() == b.tobytes() and a.dtype == b.dtype else math.inf
            e, i = n, 0
        else:
            n, e, i = errors(a, b, tol, atol)
        if not n <= worst_n:
            worst_n, worst_nn = n, k
        if not e <= worst_e:
            worst_e = e
            worst_en = "%s[%d] %.9g vs %.9g" % (k, i, float(a[i]), float(b[i])) if i < a.size else k
        if judged and bitwise and n != 0:
            why.append("%s differs (bitwise wanted%s)" % (k, "" if tol == 0 else ": not floating point"))
        elif judged and tol > 0 and not nonfinite:
            if not n <= tol:
                why.append("%s: normwise rel err %.3e > %g" % (k, n, tol))
            if elementwise and not e <= 1.0:
                why.append("%s[%d]: %.9g vs %.9g, |diff| %.3e > atol %g + %g |ref| (%.3gx)" % (
                    k, i, float(a[i]), float(b[i]), abs(float(a[i]) - float(b[i])), atol, tol, e))
    ok = not why
    if tol == 0:
        line = "%d steps: worst loss rel err %.3e; weights %s%s" % (
            len(la), worst_loss, "bitwise equal" if worst_n == 0 else "differ (first: %s)" % worst_nn,
            "" if judged else " (not judged: losses-only)")
    else:
        if worst_n == 0 and worst_e == 0:
            w = "weights equal"
        else:
            w = "worst weight rel err %.3e %s, elementwise %s" % (
                worst_n, worst_nn, ("%.3g of atol %g + rtol |ref| at %s" % (worst_e, atol, worst_en))
                if elementwise else "not checked (--normwise)")
        line = "%d steps: worst loss rel err %.3e; %s" % (len(la), worst_loss, w)
        if not judged:
            line += " (weights not judged: losses-only)"
    return ok, line + "; " + ("ok" if ok else "FAIL"), why


def main():
    args = sys.argv[1:]
    atol, elementwise = DEFAULT_ATOL, True
    if "--atol" in args:
        i = args.index("--atol")
        atol = float(args[i + 1])
        del args[i:i + 2]
    if "--normwise" in args:
        args.remove("--normwise")
        elementwise = False
    if len(args) not in (5, 6) or (len(args) == 6 and args[5] != "losses-only"):
        sys.exit(__doc__.split("\n\n")[1])
    ma, wa, mb, wb, tol = args[:5]
    tol = float(tol)
    if not tol >= 0 or not atol >= 0:
        sys.exit("TOL and ATOL must be >= 0")
    ok, line, why = compare(ma, wa, mb, wb, tol, len(args) == 6, atol, elementwise)
    print(line)
    for w in why[:8]:
        print("  " + w)
    if len(why) > 8:
        print("  ... and %d more" % (len(why) - 8))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
