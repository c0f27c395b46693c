#!/usr/bin/python3
"""Checks a Prometheus text-format file written by dtrain (logging.prometheus).

Usage: prom_check.py FILE STEP RANKS
Every sample line must parse (name, optional labels, a float); every metric family must have
# HELP and # TYPE lines before its samples; dtrain_step must equal STEP; the per-rank series
must have one sample per rank 0..RANKS-1 (dtrain_memory_bytes: one per rank and kind). Prints
what failed; exit 1 on failure.
"""
import re
import sys

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-z_]+="[^"\\\n]*"(,[a-z_]+="[^"\\\n]*")*)\})? (\S+)$')


def main():
    path, step, ranks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    help_, type_, samples, bad = set(), {}, [], []
    for n, line in enumerate(open(path).read().splitlines(), 1):
        if line.startswith("# HELP "):
            help_.add(line.split()[2])
            continue
        if line.startswith("# TYPE "):
            type_[line.split()[2]] = line.split()[3]
            continue
        m = LINE.match(line)
        if not m:
            bad.append("line %d does not parse: %r" % (n, line))
            continue
        name, labels, value = m.group(1), m.group(3) or "", m.group(5)
        try:
            float(value)
        except ValueError:
            bad.append("line %d: value %r" % (n, value))
        family = re.sub(r"_(sum|count)$", "", name) if type_.get(re.sub(r"_(sum|count)$", "", name)) == "summary" else name
        if family not in help_ or family not in type_:
            bad.append("line %d: %s has no # HELP/# TYPE before it" % (n, name))
        samples.append((name, dict(kv.split("=", 1) for kv in labels.split(",")) if labels else {}, value))
    got = [float(v) for nm, lb, v in samples if nm == "dtrain_step"]
    if got != [float(step)]:
        bad.append("dtrain_step %s, expected %d" % (got, step))
    for fam, per in (("dtrain_rank_step_seconds", 1), ("dtrain_rss_bytes", 1), ("dtrain_memory_bytes", 6)):
        rs = sorted(lb.get("rank", "").strip('"') for nm, lb, v in samples if nm == fam)
        want = sorted(str(r) for r in range(ranks) for _ in range(per))
        if rs != want:
            bad.append("%s: ranks %s, expected %s" % (fam, rs, want))
    for fam in ("dtrain_loss", "dtrain_tokens_per_second", "dtrain_skipped_steps_total", "dtrain_restarts",
                "dtrain_last_update_timestamp_seconds", "dtrain_loss_scale", "dtrain_overflow_steps_total"):
        if not any(nm == fam for nm, lb, v in samples):
            bad.append("%s missing" % fam)
    if bad:
        print("prom_check: " + "; ".join(bad[:5]))
        sys.exit(1)
    print("%d samples, %d families" % (len(samples), len(type_)))


if __name__ == "__main__":
    main()
