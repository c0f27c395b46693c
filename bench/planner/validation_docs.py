#!/usr/bin/env python3
"""Rewrites the results part of docs/planner.md ("The result on the CSV of this commit" to the
end) from `dtrain plan --validate bench/planner/published_runs.csv [--fit]`, so the quoted
numbers are the tool's (tests/test_plan.sh checks the median and the fitted efficiencies).
Usage (repository root): python3 bench/planner/validation_docs.py build/dtrain [--check]
--check writes nothing and exits 1 when docs/planner.md differs from what it would write
(tests/test_plan.sh runs it so)."""
import json, re, statistics, subprocess, sys

BIN, CSV, DOC = sys.argv[1], "bench/planner/published_runs.csv", "docs/planner.md"
CHECK = sys.argv[2:] == ["--check"]
NAMES = {"megatron": "Megatron-LM README 2024 (H100)", "narayanan21": "Narayanan et al. 2021 (Megatron, A100)",
         "korthikanti22": "Korthikanti et al. 2022 (A100)", "llama3": "Llama 3 405B", "tt": "TorchTitan (A100/H100)",
         "megascale24": "MegaScale 2024 (A100)", "bloom": "BLOOM", "opt": "OPT-175B", "mtnlg": "MT-NLG",
         "mpt": "MPT (llm-foundry, A100/H100)", "seedA": "seed table A (p4d)", "seedC": "seed table C (H100)",
         "nemo2407": "NeMo 24.07 summary (H100, FP8)", "nemolong": "NeMo long-sequence page (H100, FP8)",
         "mbridge": "Megatron-Bridge archive (H100, FP8)", "ttasync": "torchtitan asyncTP (H100)",
         "tth200": "torchtitan H200 (Trainy)", "automodel": "NeMo AutoModel (H100)", "fmsfsdp": "IBM fms-fsdp (A100/H100)",
         "mlmex": "Megatron-LM examples/llama (H100, FP8)", "mlperf30": "MLPerf Training v3.0 GPT-3 (H100, FP8)",
         "mlperf31": "MLPerf Training v3.1 GPT-3 (H100, FP8)", "mlperf40": "MLPerf Training v4.0 GPT-3 (H100, FP8)",
         "mlperf41": "MLPerf Training v4.1 GPT-3 (H100, FP8)", "dsazure": "DeepSpeed on Azure (A100, ZeRO-3)"}


def run(*args):
    return subprocess.run([BIN, "plan", "--validate", CSV, *args], capture_output=True, text=True, check=True).stdout


fit_txt, plain_txt, d = run("--fit"), run(), json.loads(run("--fit", "--json"))
med = re.search(r"over (\d+) rows \(impossible claims excluded\): ([0-9.]+%)", fit_txt)
med0 = re.search(r"excluded\): ([0-9.]+%)", plain_txt).group(1)
line = lambda txt, key: re.search(rf"^# ({key}: .*)$", txt, re.M).group(1)
ins, held, loso, held0 = line(fit_txt, "in-sample"), line(fit_txt, "held-out"), line(fit_txt, "leave-one-source-out"), \
    line(plain_txt, "held-out")
eff = re.search(r"fitted[^)]*\): (.*)", fit_txt).group(1).split()
effs = ", ".join(f"{k} {v}" for k, v in zip(eff[0::2], eff[1::2]))
fws = ", ".join(f"{k} {v:g}" for k, v in d["gemm_eff_framework"].items()
                if any(r.get("framework") and f"{r['gpu']}/{r['framework']}" == k for r in d["rows"]))
fp8 = f"{d['fp8_factor']:g} (fitted on {d['fp8_fitting_rows']} fp8 rows)"
rows, groups = [], {}
for r in d["rows"]:
    if "skipped" in r:
        rows.append(f"| {r['id']} | {r['split']} | {r['gpu']} | – | – | – | – | not predicted: {r['skipped']} |")
        continue
    rep = r.get("reported_tflops_per_gpu")
    note = "; ".join(x for x in ["publisher counts recompute FLOPs" if r["hardware_flops"] else "",
                                 "assumed " + r["assumed"] if r["assumed"] else "", r["flags"]] if x)
    if rep:
        e = r["pred_tflops_per_gpu"] / rep - 1
        if "IMPOSSIBLE" not in r["flags"]:
            groups.setdefault((r["split"], r["source"]), []).append(abs(e))
        rows.append(f"| {r['id']} | {r['split']} | {r['gpu']} | {r['layout']} | {r['pred_tflops_per_gpu']:.0f} | {rep:.0f} | "
                    f"{100 * e:+.0f}% | {note} |")
    else:
        rows.append(f"| {r['id']} | {r['split']} | {r['gpu']} | {r['layout']} | {r['pred_tflops_per_gpu']:.0f} | – | – | {note} |")
src = "\n".join(f"| {NAMES.get(k[1], k[1])} | {k[0]} | {len(v)} | {100 * statistics.median(v):.1f}% |"
                for k, v in sorted(groups.items(), key=lambda kv: (kv[0][0], statistics.median(kv[1]))))
doc = open(DOC).read()
start = doc.index("The result on the CSV of this commit:")
misses = doc.index("Where it misses and why")
end = doc.index("Every row with its prediction, error and assumptions")
head = doc[:start] + f"""The result on the CSV of this commit:

`dtrain plan --validate bench/planner/published_runs.csv --fit`: median |error| of TFLOP/s per GPU {med.group(2)} over {med.group(1)} rows
(the fitting rows; catalog efficiency 0.6 everywhere: {med0}). Fitted GEMM efficiencies: {effs}.
Per GPU type and framework: {fws}; fp8 rows at their 16-bit efficiency x {fp8}, the linear
layers at the fp8 peak and the attention core at the 16-bit one.
The same command prints, in sample, out of sample and source by source:

```
{ins}
{held}
{loso}
```

(with the catalog's efficiencies, `--validate` without `--fit`: {held0}.)
Per source (median |error| of the rows with a published rate, `--fit` efficiencies):

| source | split | rows | median abs error |
|---|---|---|---|
{src}

"""
tail = """Every row with its prediction, error and assumptions (`--fit` efficiencies):

| id | split | gpu | layout | predicted TFLOP/s | published | error | notes |
|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n"
new = head + doc[misses:end] + tail
if CHECK:
    if new != doc:
        a, b = doc.splitlines(), new.splitlines()
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        sys.exit(f"{DOC}:{i + 1}: differs from --validate's output (run python3 bench/planner/validation_docs.py "
                 f"build/dtrain): '{a[i] if i < len(a) else ''}' vs '{b[i] if i < len(b) else ''}'")
    sys.exit(0)
open(DOC, "w").write(new)
print(f"{DOC}: median {med.group(2)} over {med.group(1)} fitting rows; {effs}\n{ins}\n{held}\n{loso}")
