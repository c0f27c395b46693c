#!/usr/bin/python3
"""Checks the per-sample ledger of a run (data.ledger): exactly-once data across restarts.

Usage: ledger_check.py PREFIX STEPS SAMPLES
Each rank r appended "step incarnation id id ..." lines to PREFIX.rank<r>. A step may have
been run by several incarnations (a restart re-runs the steps after its checkpoint); the one
that counts is the last incarnation that ran it, all ranks' lines of it. Over steps 1..STEPS
every sample id of the epoch [0, SAMPLES) must occur exactly once (STEPS x global batch must
equal SAMPLES). Prints what it found; exit 1 on failure.
"""
import collections
import glob
import sys


def main():
    prefix, steps, samples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    by_step = collections.defaultdict(lambda: collections.defaultdict(list))  # step -> inc -> ids
    files = sorted(glob.glob(prefix + ".rank*"))
    incs = set()
    for f in files:
        for line in open(f):
            parts = line.split()
            if len(parts) < 3 or not line.endswith("\n"):
                continue
            step, inc = int(parts[0]), int(parts[1])
            incs.add(inc)
            by_step[step][inc].extend(int(x) for x in parts[2:])
    missing_steps = [s for s in range(1, steps + 1) if s not in by_step]
    counts = collections.Counter()
    for s in range(1, steps + 1):
        if s in by_step:
            counts.update(by_step[s][max(by_step[s])])
    dup = [i for i, c in counts.items() if c > 1]
    miss = [i for i in range(samples) if counts[i] == 0]
    extra = [i for i in counts if i >= samples]
    ok = not missing_steps and not dup and not miss and not extra
    print("%d ledger files, %d incarnations, %d steps: %d samples seen, %d repeated, %d skipped%s; %s" % (
        len(files), len(incs), len(by_step), len(counts), len(dup), len(miss),
        ", steps missing %s" % missing_steps[:5] if missing_steps else "", "ok" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


main()
