#!/usr/bin/python3
"""Checks the per-sample ledger of a run (data.ledger): exactly-once data across restarts.

Usage: ledger_check.py PREFIX STEPS SAMPLES
Each rank r appended "step incarnation id id ..." lines to PREFIX.rank<r>. A step may have
been run by several incarnations (a restart re-runs the steps after its checkpoint); the one
that counts is the last incarnation that ran it, all ranks' lines of it. STEPS x global batch
must be a multiple of SAMPLES (the epoch); within each epoch's block of steps every sample id
of [0, SAMPLES) must occur exactly once. Prints what it found; exit 1 on failure.
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
    per_step = len(by_step[1][max(by_step[1])]) if 1 in by_step else 0
    ok = not missing_steps and per_step > 0 and samples % per_step == 0
    spe = samples // per_step if ok else 1  # steps per epoch
    ok = ok and steps % spe == 0
    dup = miss = extra = 0
    seen = 0
    for e in range(steps // spe if ok else 0):
        counts = collections.Counter()
        for s in range(e * spe + 1, (e + 1) * spe + 1):
            counts.update(by_step[s][max(by_step[s])])
        seen += sum(counts.values())
        dup += sum(1 for c in counts.values() if c > 1)
        miss += sum(1 for i in range(samples) if counts[i] == 0)
        extra += sum(1 for i in counts if i >= samples)
    ok = ok and not dup and not miss and not extra
    print("%d ledger files, %d incarnations, %d steps (%d epoch(s)): %d samples read, %d repeated, %d skipped%s; %s" % (
        len(files), len(incs), len(by_step), steps // spe, seen, dup, miss,
        ", steps missing %s" % missing_steps[:5] if missing_steps else "", "ok" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


main()
