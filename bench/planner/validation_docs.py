#!/usr/bin/env python3
"""Rewrites the results part of docs/planner.md ("The result on the CSV of this commit" to the
end) from `dtrain plan --validate bench/planner/published_runs.csv [--fit]`, so the quoted
numbers are the tool's (tests/test_plan.sh checks the median and the fitted efficiencies).
Usage (repository root): python3 bench/planner/validation_docs.py build/dtrain"""
import json, re, statistics, subprocess, sys

BIN, CSV, DOC = sys.argv[1], "bench/planner/published_runs.csv", "docs/planner.md"
NAMES = {"megatron": "Megatron-LM README 2024 (H100)", "narayanan21": "Narayanan et al. 2021 (Megatron, A100)",
         "korthikanti22": "Korthikanti et al. 2022 (A100)", "llama3": "Llama 3 405B", "tt": "TorchTitan (A100/H100)",
         "megascale24": "MegaScale 2024 (A100)", "bloom": "BLOOM", "opt": "OPT-175B", "mtnlg": "MT-NLG",
         "mpt": "MPT (llm-foundry, A100/H100)", "seedA": "seed table A (p4d)", "seedC": "seed table C (H100)"}


def run(*args):
    return subprocess.run([BIN, "plan", "--validate", CSV, *args], capture_output=True, text=True, check=True).stdout


fit_txt, plain_txt, d = run("--fit"), run(), json.loads(run("--fit", "--json"))
med = re.search(r"over (\d+) rows \(impossible claims excluded\): ([0-9.]+%)", fit_txt)
med0 = re.search(r"excluded\): ([0-9.]+%)", plain_txt).group(1)
eff = re.search(r"fitted[^)]*\): (.*)", fit_txt).group(1).split()
effs = ", ".join(f"{k} {v}" for k, v in zip(eff[0::2], eff[1::2]))
rows, groups = [], {}
for r in d["rows"]:
    if "skipped" in r:
        rows.append(f"| {r['id']} | {r['gpu']} | – | – | – | – | not predicted: {r['skipped']} |")
        continue
    rep = r.get("reported_tflops_per_gpu")
    note = "; ".join(x for x in ["publisher counts recompute FLOPs" if r["hardware_flops"] else "",
                                 "assumed " + r["assumed"] if r["assumed"] else "", r["flags"]] if x)
    if rep:
        e = r["pred_tflops_per_gpu"] / rep - 1
        if "IMPOSSIBLE" not in r["flags"]:
            groups.setdefault(re.sub(r"-.*", "", r["id"]), []).append(abs(e))
        rows.append(f"| {r['id']} | {r['gpu']} | {r['layout']} | {r['pred_tflops_per_gpu']:.0f} | {rep:.0f} | "
                    f"{100 * e:+.0f}% | {note} |")
    else:
        rows.append(f"| {r['id']} | {r['gpu']} | {r['layout']} | {r['pred_tflops_per_gpu']:.0f} | – | – | {note} |")
src = "\n".join(f"| {NAMES.get(k, k)} | {len(v)} | {100 * statistics.median(v):.1f}% |"
                for k, v in sorted(groups.items(), key=lambda kv: statistics.median(kv[1])))
doc = open(DOC).read()
start = doc.index("The result on the CSV of this commit:")
misses = doc.index("Where it misses and why")
end = doc.index("Every row with its prediction, error and assumptions")
head = doc[:start] + f"""The result on the CSV of this commit:

`dtrain plan --validate bench/planner/published_runs.csv --fit`: median |error| of TFLOP/s per GPU {med.group(2)} over {med.group(1)} rows
(catalog efficiency 0.6 everywhere: {med0}). Fitted GEMM efficiencies: {effs}.
Per source (median |error| of the rows with a published rate):

| source | rows | median abs error |
|---|---|---|
{src}

"""
tail = """Every row with its prediction, error and assumptions (`--fit` efficiencies):

| id | gpu | layout | predicted TFLOP/s | published | error | notes |
|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
open(DOC, "w").write(head + doc[misses:end] + tail)
print(f"{DOC}: median {med.group(2)} over {med.group(1)} rows; {effs}")
