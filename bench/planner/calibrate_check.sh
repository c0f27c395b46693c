#!/bin/bash
# The calibrated planner against dtrain's own measured runs on this machine (issue 15: step
# time within 10%, memory within 2%). Run it on a QUIET machine (it times runs):
#   bash bench/planner/calibrate_check.sh build/dtrain [OUT_DIR]
# 1. dtrain plan --calibrate per world size W: this machine's entry with W ranks (cpu-calibrated,
#    one device per rank);
# 2. for each model x world x strategy: `dtrain launch -n W -- bench` (measured) and
#    `dtrain plan --catalog ... --gpus W --strategy S --tp 1 --pp 1` (predicted), same batch;
# 3. a table of predicted vs measured step time and memory (rank 0's allocator high-water vs
#    the plan's fullest rank) and the median / worst errors; exit 1 if the median step-time
#    error exceeds 10% or any memory error exceeds 2%; OUT_DIR/report.html shows the same pairs.
# Environment: MODELS (default "gpt2-tiny bench-small gpt2"), WORLDS ("1 2"), STRATS ("ddp
# zero1 zero2 zero3"), BATCH (4), SEQ (256), STEPS (20), CAL_MODEL (bench-small: the model the
# calibration runs, once per world size).
set -u
bin=$(readlink -f "$1") out=${2:-$(mktemp -d /tmp/dt_calcheck_XXXXXX)}
mkdir -p "$out" || exit 1
models=${MODELS:-gpt2-tiny bench-small gpt2} worlds=${WORLDS:-1 2} strats=${STRATS:-ddp zero1 zero2 zero3}
batch=${BATCH:-4} seq=${SEQ:-256} steps=${STEPS:-20}
cal_model=${CAL_MODEL:-bench-small}
# One calibration per world size: a "device" is one rank with its share of the cores, so its
# peak depends on how many ranks share the machine. The calibration runs DDP on CAL_MODEL; every
# other model and strategy is predicted from it.
for w in $worlds; do
  "$bin" plan --calibrate "$out/cpu-w$w.yaml" --ranks "$w" --model "$cal_model" --batch "$batch" --seq "$seq" \
    --bench-steps "$steps" --repeats 1 >"$out/calibrate-w$w.log" 2>&1 ||
    { echo "calibration failed: $out/calibrate-w$w.log"; exit 1; }
done
for m in $models; do
  s=$seq
  [ "$m" = gpt2-tiny ] && s=64 # its context
  for w in $worlds; do
    for st in $strats; do
      [ "$w" = 1 ] && [ "$st" != ddp ] && continue
      id=$m-w$w-$st
      "$bin" launch -n "$w" -- bench --model "$m" --batch "$batch" --seq "$s" --set parallel.strategy="$st" \
        --bench-steps "$steps" --repeats 1 --json "$out/$id.bench.json" >"$out/$id.bench.log" 2>&1 || echo "bench failed: $id"
      "$bin" plan --catalog "$out/cpu-w$w.yaml" --hardware cpu-calibrated --gpus "$w" --nodes 1 --model "$m" --batch "$batch" \
        --seq "$s" --strategy "$st" --tp 1 --pp 1 --json >"$out/$id.plan.json" 2>"$out/$id.plan.log" || echo "plan failed: $id"
    done
  done
done
"$bin" report "$out"/*.bench.json "$out"/*.plan.json -o "$out/report.html" >"$out/report.log" 2>&1 ||
  echo "report failed: $out/report.log" # plans beside the measured runs
python3 - "$out" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows, st_err, mem_err = [], [], []
for p in sorted(glob.glob(os.path.join(out, "*.plan.json"))):
    b = p.replace(".plan.json", ".bench.json")
    if not os.path.exists(b): continue
    plan, bench = json.load(open(p)), json.load(open(b))
    lay = plan["layouts"][0]
    meas_s = bench["summary"]["step_s"]["mean"]
    meas_m = max(r["total"] for r in bench["memory"])
    e1, e2 = lay["step_s"] / meas_s - 1, lay["memory_bytes"]["total"] / meas_m - 1
    st_err.append(abs(e1)); mem_err.append(abs(e2))
    rows.append((os.path.basename(p)[:-10], lay["step_s"], meas_s, e1, lay["memory_bytes"]["total"], meas_m, e2))
print(f"# {'run':28s} {'plan_s':>9s} {'meas_s':>9s} {'err':>7s} {'plan_MiB':>9s} {'meas_MiB':>9s} {'err':>7s}")
for r in rows:
    print(f"  {r[0]:28s} {r[1]:9.4g} {r[2]:9.4g} {100*r[3]:+6.1f}% {r[4]/2**20:9.1f} {r[5]/2**20:9.1f} {100*r[6]:+6.2f}%")
if not rows: sys.exit("no runs compared")
print(f"# step time: median |error| {100*statistics.median(st_err):.1f}%, worst {100*max(st_err):.1f}%; "
      f"memory: worst |error| {100*max(mem_err):.2f}%")
sys.exit(0 if statistics.median(st_err) <= 0.10 and max(mem_err) <= 0.02 else 1)
EOF
