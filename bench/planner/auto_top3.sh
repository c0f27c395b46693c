#!/bin/bash
# parallel.layout auto against the measurement (issue 35 item 1): on W ranks of this machine,
# `dtrain plan` ranks the layouts dtrain can run on the catalog entry HW; `dtrain train --set
# parallel.layout=auto` picks one (its log names it); each of the plan's top 3 fitting runnable
# layouts is then benchmarked (`dtrain bench`, PASSES passes over the three in turn, the median
# tokens/s of each layout's passes) and the script reports whether auto's choice was the
# measured fastest, and by how much it missed if not. A benchmark, not a test: run it on a
# QUIET machine.
#   bash bench/planner/auto_top3.sh build/dtrain [OUT_DIR]
# Environment: W (2 ranks: this machine's cores; the cpu-core entry holds 2 devices a node, so
# W = 4 needs NODES=2, which simulates the nodes with DTRAIN_NODE_ID as the tests do), NODES (1), HW (cpu-core; a calibrated entry from `dtrain plan --calibrate`
# is better), CATALOG (configs/hardware.yaml), MODEL (the model keys; default a 4-layer llama
# d 256, context 256), SEQ (256), MICRO (2), BATCH (global, 16), STEPS (10 timed), WARMUP (2), PASSES (3).
set -u
bin=$(readlink -f "$1") out=${2:-$(mktemp -d /tmp/dt_autotop3_XXXXXX)}
mkdir -p "$out" && out=$(readlink -f "$out") || exit 1
src=$(cd "$(dirname "$0")/../.." && pwd)
W=${W:-2} hw=${HW:-cpu-core} cat=${CATALOG:-$src/configs/hardware.yaml}
seq=${SEQ:-256} micro=${MICRO:-2} batch=${BATCH:-16} steps=${STEPS:-10} warmup=${WARMUP:-2} passes=${PASSES:-3}
read -r -a model <<<"${MODEL:---set model.preset=llama-tiny --set model.n_layer=4 --set model.d_model=256 --set model.n_head=4 --set model.n_kv_head=2 --set model.context=256}"
. "$src/tests/lib.sh"
mpi_env
common=("${model[@]}" --seq "$seq" --set training.micro_batch="$micro")
echo "# auto_top3: W=$W HW=$hw seq=$seq micro=$micro batch=$batch; $(date -u +%FT%TZ)"
echo "# cpu flags: $(grep -o -w 'avx512[a-z_0-9]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"

# 1. the plan's top 3 fitting layouts dtrain runs
nodes=${NODES:-1} per=$((W / ${NODES:-1}))
mpi+=(-x DTRAIN_NODE_ID)
"$bin" plan "${common[@]}" --global-batch "$batch" --gpus "$W" --nodes "$nodes" --hardware "$hw" --catalog "$cat" --json \
  >"$out/plan.json" 2>"$out/plan.err" || { echo "plan failed: $(tail -2 "$out/plan.err")"; exit 1; }
/usr/bin/python3 - "$out/plan.json" >"$out/top3.txt" <<'PY' || exit 1
import json, sys
ls = [l for l in json.load(open(sys.argv[1]))["layouts"] if l["fits"] and l["dtrain_runs"]]
ls.sort(key=lambda l: l["step_s"])
for l in ls[:3]:
    print(l["layout"].replace(" ", "_"), l["strategy"], str(l["hybrid"]).lower(), l["tp"], l["pp"], l["cp"], f"{l['step_s']:.6g}")
PY
[ -s "$out/top3.txt" ] || { echo "no runnable layout fits"; exit 1; }
echo "# the plan's top 3 (layout, predicted step s):"
awk '{gsub("_", " ", $1); print "#   " $1 ": " $NF}' "$out/top3.txt"

# 2. what parallel.layout=auto picks on these ranks
timeout 600 "${mpi[@]}" -n "$W" bash -c 'DTRAIN_NODE_ID=node$((OMPI_COMM_WORLD_RANK / '"$per"')) exec "$0" "$@"' "$bin" train "${common[@]}" --set training.batch="$batch" --steps 1 \
  --set parallel.layout=auto --set parallel.layout_hardware="$hw" --set parallel.layout_catalog="$cat" \
  >"$out/auto.log" 2>&1 || { echo "auto run failed: $(tail -3 "$out/auto.log")"; exit 1; }
auto=$(sed -n 's/.*parallel.layout auto on [^:]*: \([^,]*\), the fastest.*/\1/p' "$out/auto.log" | head -1)
echo "# layout auto picked: $auto"
auto=${auto// /_}

# 3. each of the three, PASSES passes in turn
for p in $(seq 1 "$passes"); do
  i=0
  while read -r name zero hyb tp pp cp pred; do
    i=$((i + 1))
    timeout 900 "${mpi[@]}" -n "$W" bash -c 'DTRAIN_NODE_ID=node$((OMPI_COMM_WORLD_RANK / '"$per"')) exec "$0" "$@"' "$bin" bench "${common[@]}" --set training.batch="$batch" \
      --set parallel.strategy="$zero" --set parallel.hybrid="$hyb" --set parallel.tp="$tp" --set parallel.pp="$pp" \
      --set parallel.cp="$cp" --warmup-steps "$warmup" --bench-steps "$steps" --repeats 1 \
      --json "$out/l$i.p$p.json" >"$out/l$i.p$p.log" 2>&1 </dev/null || echo "# bench of $name failed: $(tail -2 "$out/l$i.p$p.log")"
  done <"$out/top3.txt"
done

/usr/bin/python3 - "$out" "$auto" "$passes" <<'PY'
import json, statistics, sys
out, auto, passes = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [l.split() for l in open(f"{out}/top3.txt")]
meas = []
for i, r in enumerate(rows, 1):
    v = []
    for p in range(1, passes + 1):
        try:
            v.append(json.load(open(f"{out}/l{i}.p{p}.json"))["summary"]["tokens_per_s"]["median"])
        except (OSError, KeyError, ValueError, TypeError):
            pass
    meas.append(statistics.median(v) if v else float("nan"))
print("| layout | predicted step (s) | measured tokens/s (median of passes) |")
print("|---|---|---|")
for r, m in zip(rows, meas):
    print(f"| {r[0].replace('_', ' ')}{' (auto)' if r[0] == auto else ''} | {float(r[-1]):.4g} | {m:.4g} |")
ok = [m for m in meas if m == m]
if not ok or auto not in [r[0] for r in rows]:
    sys.exit(f"auto's choice {auto!r} is not among the plan's top 3, or no measurement")
best = max(range(len(meas)), key=lambda i: meas[i] if meas[i] == meas[i] else -1)
a = [r[0] for r in rows].index(auto)
if a == best:
    print(f"auto's choice {auto.replace('_', ' ')} was the measured fastest")
else:
    print(f"auto's choice {auto.replace('_', ' ')} was not the measured fastest: {rows[best][0].replace('_', ' ')} "
          f"ran {meas[best] / meas[a]:.3f}x its tokens/s")
PY
