#!/usr/bin/env python3
"""calibrate_check.sh's summary: each run's plan against its measurement (OUT/runs.tsv: id,
family, ranks W, nodes N; OUT/ID.plan.json, OUT/ID.bench.json and OUT/ID.bench.passK.json).

Step time: the median over the passes of each pass's median step; memory: the allocator's
high-water of the fullest rank against the plan's bytes. Prints one row per run, then the
median / worst step-time error overall, per family, per node count, and for the runs with
more ranks than the machine's cores (time-sliced) and the others apart. Exit 1 when the
median step-time error over every run exceeds 10%, the worst 35%, a run's memory differs from
its plan's by a byte, or a run has no plan, no measurement, or a plan of another job than the
bench ran (model, micro-batch, sequence, accumulation, ranks, precision, layout, strategy).
usage: calibrate_report.py OUT_DIR CORES"""
import json
import os
import statistics
import sys

MEDIAN_MAX, WORST_MAX = 0.10, 0.35


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def pairing(plan, bench):
    """What differs between the plan's job and layout and the bench run's configuration ("" if nothing)."""
    c, j, lay = bench["config"], plan["job"], plan["layouts"][0]
    want = {"model": (j["model"]["name"], c["model.preset"]), "micro_batch": (j["micro_batch"], c["training.micro_batch"]),
            "seq_len": (j["seq_len"], c["training.seq_len"]), "ranks": (j["gpus"], len(bench["memory"])),
            "micro_steps": (lay["micro_steps"], c["training.grad_accum"]),
            "global_batch": (j["global_batch"], c["training.micro_batch"] * c["training.grad_accum"] * lay["dp"]),
            "precision": (j["precision"], c["training.precision"])}
    for k in ("tp", "pp", "cp", "ep", "strategy", "hybrid"):
        want[k] = (lay[k], c["parallel." + k])
    return ", ".join(f"{k} plan {a} bench {b}" for k, (a, b) in want.items() if a != b)


def main():
    out, cores = sys.argv[1], int(sys.argv[2])
    index = [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "runs.tsv")) if l.strip()]
    rows, missing = [], []
    for run, fam, w, n in index:
        plan, bench = load(os.path.join(out, run + ".plan.json")), load(os.path.join(out, run + ".bench.json"))
        if not plan or not bench or not plan.get("layouts"):
            missing.append(f"{run}: no plan or no measurement (see OUT/{run}.plan.log, .bench.log)")
            continue
        lay = plan["layouts"][0]
        bad = pairing(plan, bench)
        if bad:
            missing.append(f"{run}: the plan is not the bench's job ({bad})")
            continue
        # each pass's median step (as the calibration: robust to the odd delayed step), then their
        # median: robust to a slow spell of the machine that covers a whole run in one pass
        passes = [bench]
        k = 2
        while True:
            b = load(os.path.join(out, f"{run}.bench.pass{k}.json"))
            if b is None:
                break
            passes.append(b)
            k += 1
        meas_s = statistics.median(x["summary"]["step_s"]["median"] for x in passes)
        meas_m = max(r["total"] for r in bench["memory"])
        plan_m = lay["memory_bytes"]["total"]
        rows.append(dict(run=run, fam=fam, w=int(w), n=int(n), plan_s=lay["step_s"], meas_s=meas_s,
                         err=lay["step_s"] / meas_s - 1, plan_m=plan_m, meas_m=meas_m, dmem=plan_m - meas_m,
                         passes=len(passes)))

    def table(title, rs):
        print(f"# {title}")
        print(f"# {'run':52s} {'plan_s':>9s} {'meas_s':>9s} {'err':>7s} {'plan_MiB':>9s} {'meas_MiB':>9s} {'mem_diff_B':>10s}")
        for r in rs:
            print(f"  {r['run']:52s} {r['plan_s']:9.4g} {r['meas_s']:9.4g} {100 * r['err']:+6.1f}% "
                  f"{r['plan_m'] / 2**20:9.2f} {r['meas_m'] / 2**20:9.2f} {r['dmem']:10.0f}")

    def summary(what, rs):
        if not rs:
            return
        e = [abs(r["err"]) for r in rs]
        print(f"# {what}: {len(rs)} runs, step time median |error| {100 * statistics.median(e):.1f}%, "
              f"worst {100 * max(e):.1f}%; memory: {sum(r['dmem'] == 0 for r in rs)}/{len(rs)} exact")

    on, sliced = [r for r in rows if r["w"] <= cores], [r for r in rows if r["w"] > cores]
    table(f"runs on at most {cores} ranks (this machine's cores)", on)
    if sliced:
        table(f"time-sliced runs: more ranks than the {cores} cores", sliced)
    for why in missing:
        print(f"  {why}")
    if not rows:
        sys.exit("no runs compared")
    for fam in dict.fromkeys(r["fam"] for r in rows):
        summary(f"family {fam}", [r for r in rows if r["fam"] == fam])
    for n in sorted({r["n"] for r in rows}):
        summary(f"{n} node(s)", [r for r in rows if r["n"] == n])
    summary(f"on at most {cores} ranks", on)
    summary(f"time-sliced (more than {cores} ranks)", sliced)
    summary(f"all ({min(r['passes'] for r in rows)}-{max(r['passes'] for r in rows)} pass(es) a run)", rows)
    e = [abs(r["err"]) for r in rows]
    ok = statistics.median(e) <= MEDIAN_MAX and max(e) <= WORST_MAX and all(r["dmem"] == 0 for r in rows) and not missing
    if missing:
        print(f"# {len(missing)} run(s) not compared (no plan, no measurement, or a plan of another job)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
