#!/usr/bin/env python3
"""loss_scales.py RUN.jsonl REF.jsonl PRECISION STEPS: the loss scale (and overflow flag) of
every step of two metrics files are equal; for fp16 the scale must have taken at least 3
values and an overflow must have happened (the scaler state was exercised)."""
import json
import sys


def scales(path):
    s = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("type") == "step":
            s[r["step"]] = (r.get("loss_scale", 1.0), r.get("overflow", False))
    return s


a, b = scales(sys.argv[1]), scales(sys.argv[2])
steps = int(sys.argv[4])
diff = [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
if diff or len(a) != steps:
    print("loss scales differ (step, run, reference): %s; %d steps logged" % (diff[:5], len(a)))
    sys.exit(1)
vals = sorted({v[0] for v in a.values()})
if sys.argv[3] == "fp16" and (len(vals) < 3 or not any(v[1] for v in a.values())):
    print("fp16 scale never moved or no overflow: %s" % vals)
    sys.exit(1)
print("loss scales of all %d steps equal (%s)" % (steps, ", ".join("%g" % v for v in vals)))
