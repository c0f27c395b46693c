#!/usr/bin/env bash
# Tensor-parallel layouts through dtrain bench, dtrain plan and dtrain report (issue 31 item 5;
# ARCHITECTURE decision 71), on tp 2 x dp 2 (4 ranks, 2 simulated nodes, a TP group in each):
#  - the plan's memory for a TP layout equals the allocator's high-water, exactly: for
#    gpt2-tiny and llama-tiny, with and without sequence parallelism, ZeRO-1 and ZeRO-3 over the
#    data-parallel ranks, `dtrain plan --tp 2 --json`'s memory_bytes (every kind and the total,
#    the fullest device) equal the largest rank's allocator high-water in `dtrain bench --json`
#    (memory[]), and the bench's own plan (memory[].plan) equals each rank's total;
#  - bench's layout and TP collectives (parallel.tp, parallel.dp, summary.tp_comm_s and
#    tp_bytes_step: positive, finite) go into `dtrain report`: its tensor-parallelism table has
#    one row per run with the layout, sequence parallelism, the ZeRO stage, the TP bytes and
#    exposed milliseconds per step, and each run stands beside the plan of its layout with the
#    memory error +0.0%.
#   tests/test_tp_report.sh BIN DIR
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
fresh_dir "$dir"
mpi_env
command -v mpiexec >/dev/null || skip "mpiexec not found (apt-get install openmpi-bin)"

job=(--seq 32 --batch 2)
for m in gpt2-tiny llama-tiny; do
  for sp in false true; do
    for s in zero1 zero3; do
      name=$m.$s.sp-$sp
      set_sp=(--set parallel.sequence_parallel=$sp)
      timeout 300 "$bin" launch -n 4 --simulate-nodes 2 -- bench --model "$m" "${job[@]}" --bench-steps 2 \
        --warmup-steps 1 --repeats 1 --peak 100 --set parallel.tp=2 --set parallel.strategy=$s "${set_sp[@]}" \
        --json "$name.bench.json" >"$name.bench.log" 2>&1 || { fail "bench $name: $(tail -2 "$name.bench.log")"; continue; }
      (cd "$src" && "$bin" plan --set model.preset="$m" "${job[@]}" "${set_sp[@]}" --gpus 4 --nodes 2 \
        --global-batch 4 --hardware cpu-core --strategy $s --tp 2 --pp 1 --json) >"$name.plan.json" 2>"$name.plan.err" ||
        { fail "plan $name: $(head -2 "$name.plan.err")"; continue; }
      if out=$(/usr/bin/python3 - "$name.bench.json" "$name.plan.json" "$s" "$sp" <<'PY' 2>&1
import json, math, sys
b, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
strategy, sp = sys.argv[3], sys.argv[4] == "true"
kinds = ("params", "grads", "optimizer", "activations", "comm", "other")
assert b["parallel"]["tp"] == 2 and b["parallel"]["dp"] == 2 and b["parallel"]["world"] == 4, b["parallel"]
assert b["config"]["parallel.sequence_parallel"] == sp, b["config"]["parallel.sequence_parallel"]
t, n = b["summary"]["tp_comm_s"], b["summary"]["tp_bytes_step"]
assert math.isfinite(t) and t > 0 and math.isfinite(n) and n > 0, (t, n)
assert n <= b["summary"]["comm_bytes_step"], (n, b["summary"]["comm_bytes_step"])
for r in b["memory"]:
    assert r["plan"] == r["total"] == sum(r[k] for k in kinds), r
full = max(b["memory"], key=lambda r: r["total"])
(l,) = p["layouts"]
assert l["layout"] == f"{strategy} dp2 tp2 pp1 cp1 ep1" and l["memory_source"] == "dtrain", l["layout"]
assert p["job"]["sequence_parallel"] == sp, p["job"]
pm = l["memory_bytes"]
bad = [k for k in kinds if pm[k] != full[k]]
assert not bad and pm["total"] == full["total"], (bad, pm, full)
print(f"plan {pm['total']} bytes == allocator high-water (rank {full['rank']}, every kind); "
      f"TP {t * 1e3:.3f} ms, {n:.0f} bytes per step")
PY
      ); then pass "$name: $out"; else fail "$name: $out"; fi
    done
  done
done

# dtrain report on the bench and plan files: the layout and the TP collectives of each run
ls ./*.bench.json >/dev/null 2>&1 || { echo "test_tp_report: $fails failure(s)"; exit 1; }
if "$bin" report ./*.bench.json ./*.plan.json -o rep.html >rep.txt 2>&1 &&
   out=$(/usr/bin/python3 - rep.html ./*.bench.json <<'PY' 2>&1
import html as H, json, re, sys
h = open(sys.argv[1]).read()
t = h[h.index('<table id="tp">'):]
t = t[:t.index("</table>")]
rows = re.findall(r"<tr><td class=\"l\">([^<]*)</td><td class=\"l\">([^<]*)</td><td>2</td><td>2</td><td>(on|off)</td>"
                  r"<td class=\"l\">(zero[13])</td><td>([^<]*)</td><td>([0-9.]+)</td><td>([0-9.]+)%</td>", t)
assert len(rows) == len(sys.argv) - 2 == 8, (len(rows), t[:400])
for label, layout, sp, zero, nbytes, ms, pct in rows:
    assert " x4 tp2" in label and (" tp2 sp " in label) == (sp == "on"), label
    assert layout == "tp 2 x dp 2" + (", sequence parallel" if sp == "on" else ""), layout
    assert float(ms) > 0 and float(pct) > 0, (ms, pct)
runs = sorted((json.load(open(f))["summary"]["tp_comm_s"] for f in sys.argv[2:]))
got = sorted(float(r[5]) for r in rows)
assert all(abs(a * 1e3 - b) <= 5e-4 for a, b in zip(runs, got)), (runs, got)
pv = h[h.index('<table id="plan-vs-measured">'):]
pv = pv[:pv.index("</table>")]
matched = re.findall(r"<tr><td class=\"l\">(R\d[^<]*)</td>.*?</tr>", pv)
assert len(matched) == 8 and all(" tp2" in m for m in matched), matched
assert pv.count("<td>+0.0%</td></tr>") == 8, pv  # memory error: planned == measured
print("8 TP runs: layout, sequence parallelism, ZeRO stage, TP bytes and exposed ms per step; each beside its plan, memory +0.0%")
PY
   ); then pass "report: $out"
else fail "report: $(head -3 rep.txt) $out"; fi

echo "test_tp_report: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
