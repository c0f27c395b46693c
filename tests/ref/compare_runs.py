#!/usr/bin/python3
"""Compares two dtrain runs: their JSONL metrics (losses per step) and final weight files.

Usage: compare_runs.py METRICS_A WEIGHTS_A METRICS_B WEIGHTS_B TOL [losses-only]
TOL = 0 demands bitwise equality; otherwise every loss and every weight tensor must agree to
TOL relative (max |a - b| / max |b| per tensor). With "losses-only" the weights are reported
but only the losses are judged (for runs whose summation order differs: AdamW turns the
rounding noise of exactly-zero gradients, e.g. the attention key bias, into lr-sized steps).
Metrics of a resumed run may hold a step more than once (the last record counts).
Prints the worst errors; exit 1 on failure.
"""
import json
import struct
import sys

import numpy as np


def losses(path):
    """(step, loss) per step. A resumed run appends to the file and re-logs the steps after
    its checkpoint: the last record of each step is the one that counts. A line cut short by
    a kill is skipped."""
    last = {}
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("type") == "step":
            last[r["step"]] = r["loss"]
    return sorted(last.items())


def tensors(path):
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
        out[k] = np.frombuffer(data[b:e], dtype="<f4")
    return out


def main():
    ma, wa, mb, wb, tol = sys.argv[1:6]
    losses_only = len(sys.argv) > 6 and sys.argv[6] == "losses-only"
    tol = float(tol)
    la, lb = losses(ma), losses(mb)
    ok = len(la) == len(lb) and len(la) > 0 and [s for s, _ in la] == [s for s, _ in lb]
    worst_loss = max((abs(a - b) / abs(b) for (_, a), (_, b) in zip(la, lb)), default=float("inf"))
    ta, tb = tensors(wa), tensors(wb)
    ok = ok and ta.keys() == tb.keys()
    worst_w, worst_name = 0.0, ""
    for k in ta:
        if tol == 0:
            err = 0.0 if ta[k].tobytes() == tb[k].tobytes() else float("inf")
        else:
            ref = max(float(np.abs(tb[k]).max()), 1e-30)
            err = float(np.abs(ta[k].astype(np.float64) - tb[k]).max()) / ref
        if err > worst_w:
            worst_w, worst_name = err, k
    if tol == 0:
        ok = ok and worst_loss == 0 and worst_w == 0
    elif losses_only:
        ok = ok and worst_loss <= tol
    else:
        ok = ok and worst_loss <= tol and worst_w <= tol
    print("%d steps: worst loss rel err %.3e; worst weight rel err %.3e %s; %s" %
          (len(la), worst_loss, worst_w, worst_name, "ok" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
