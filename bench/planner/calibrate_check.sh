#!/bin/bash
# The calibrated planner against dtrain's own measured runs on this machine (issue 15: step
# time within 10%, memory within 2%; 1-4 ranks, 1-2 simulated nodes, every strategy). Run it
# on a QUIET machine (it times runs); NODES containing 2 needs root (network namespaces):
#   NODES="1 2" bash bench/planner/calibrate_check.sh build/dtrain [OUT_DIR]
# 1. dtrain plan --calibrate per world size W and node count N: this machine's entry with W
#    ranks (cpu-calibrated, one device per rank). N = 1: --ranks W (the link from a comm fit on
#    this machine). N = 2 (even W only): the script brings up 2 simulated hosts
#    (scripts/mnhosts.sh up 2: network namespaces, TCP between them, each its own /dev/shm;
#    `mnhosts.sh down` on exit, whatever happens) and runs, on h1, --ranks W --nodes 2 --hosts
#    h1:W/2,h2:W/2: the comm fit across the hosts gives the inter-node link net-fit (its cross
#    group) and the intra-node link shm-fit (its node group, W = 4);
# 2. for each model x world x nodes x strategy: the measured run, `dtrain launch -n W -- bench`
#    (N = 2: `mnhosts.sh exec h1 dtrain launch -n W --hosts h1:W/2,h2:W/2 -- bench`, OMP threads
#    cores / W as on one node), and the prediction, `dtrain plan --catalog ENTRY --gpus W
#    --nodes N --strategy S --tp 1 --pp 1`, same model, batch and sequence;
# 3. a table of predicted vs measured step time (the median over PASSES passes of a run's
#    median step: every run is measured PASSES times, one pass over the list after another,
#    minutes apart, so that a slow spell of the machine covering a whole run counts once) and memory (the
#    allocator's high-water of the fullest rank vs the plan's), the median / worst errors overall and per node count; exit 1
#    if the median step-time error over every run exceeds 10% or any memory error exceeds 2%;
#    OUT_DIR/report.html shows the same pairs (with the first pass's measurement).
# Environment: MODELS (default "gpt2-tiny bench-small gpt2"), WORLDS ("1 2 3 4"), NODES ("1";
# "1 2" adds the 2-host runs of every even W), STRATS ("ddp zero1 zero2 zero3"), BATCH (2),
# SEQ (128; gpt2-tiny: 64, its context), STEPS (5 timed steps a run), WARMUP (2), CAL_MODEL
# (bench-small: the model the calibrations run); gpt2, whose steps are the longest, runs
# STEPS_GPT2 (3) steps and only where W <= GPT2_MAX_WORLD (2); gpt2-tiny, the fastest,
# STEPS_TINY (40); each calibration runs CAL_REPEATS (3) repeats of STEPS (a slow spell of
# the machine during one short calibration run skews every plan made from it). W ranks share the machine's
# cores, so a run takes about W times one rank's step: the defaults with NODES="1 2" (6
# calibrations, 51 runs, PASSES 3) take about 30 minutes on a quiet 2-core machine (PASSES=1:
# about 16); each phase's start is printed in seconds.
set -u
bin=$(readlink -f "$1") out=${2:-$(mktemp -d /tmp/dt_calcheck_XXXXXX)}
mkdir -p "$out" && out=$(readlink -f "$out") || exit 1
src=$(cd "$(dirname "$0")/../.." && pwd)
mn=$src/scripts/mnhosts.sh
models=${MODELS:-gpt2-tiny bench-small gpt2} worlds=${WORLDS:-1 2 3 4} nodes=${NODES:-1}
strats=${STRATS:-ddp zero1 zero2 zero3}
batch=${BATCH:-2} seq=${SEQ:-128} steps=${STEPS:-5} steps_gpt2=${STEPS_GPT2:-3} warmup=${WARMUP:-2}
steps_tiny=${STEPS_TINY:-40} cal_repeats=${CAL_REPEATS:-3} passes=${PASSES:-3}
gpt2_max=${GPT2_MAX_WORLD:-2}
cal_model=${CAL_MODEL:-bench-small}
for v in "$batch" "$seq" "$steps" "$steps_gpt2" "$steps_tiny" "$cal_repeats" "$warmup" "$gpt2_max" "$passes"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "calibrate_check: BATCH, SEQ, STEPS, STEPS_GPT2, STEPS_TINY, CAL_REPEATS, WARMUP, GPT2_MAX_WORLD and PASSES must be whole numbers (got '$v')"; exit 2; }
done
[ "$passes" -ge 1 ] || { echo "calibrate_check: PASSES must be >= 1"; exit 2; }
for w in $worlds; do
  [[ $w =~ ^[1-9][0-9]*$ ]] || { echo "calibrate_check: WORLDS must be rank counts >= 1 (got '$w')"; exit 2; }
done
for n in $nodes; do
  [ "$n" = 1 ] || [ "$n" = 2 ] || { echo "calibrate_check: NODES holds 1 and/or 2 (got '$n')"; exit 2; }
done
cores=$(nproc)
t0=$(date +%s)
phase() { echo "# $(($(date +%s) - t0)) s: $*"; }

# The layouts to run: "W N" pairs (2 nodes: even W, W/2 ranks a host).
pairs=()
for n in $nodes; do
  for w in $worlds; do
    [ "$n" = 2 ] && { [ $((w % 2)) = 1 ] && continue; }
    pairs+=("$w $n")
  done
done
[ ${#pairs[@]} -gt 0 ] || { echo "calibrate_check: no layout to run (NODES=2 needs an even world in WORLDS)"; exit 2; }
# The 2-host runs: namespaces of our own prefix, removed on exit.
if [[ " $nodes " == *" 2 "* ]]; then
  [ "$(id -u)" = 0 ] || { echo "calibrate_check: NODES=2 needs root (network namespaces, scripts/mnhosts.sh)"; exit 2; }
  export MN_PREFIX=dtmnc- MN_STATE=$out/mn
  trap '"$mn" down >/dev/null 2>&1' EXIT
  "$mn" down >/dev/null 2>&1 # what a killed earlier run may have left
  "$mn" up 2 >"$out/mnhosts.log" 2>&1 || { echo "calibrate_check: mnhosts.sh up 2 failed: $out/mnhosts.log"; exit 1; }
fi
on_hosts() { # W CMD...: CMD on h1 with OMP threads as a W-rank run on one node gets
  local th=$((cores / $1))
  shift
  [ $th -ge 1 ] || th=1
  "$mn" exec h1 env OMP_NUM_THREADS=$th "$@"
}

# One calibration per layout: a "device" is one rank with its share of the cores, so its peak
# depends on how many ranks share the machine; the calibration runs DDP on CAL_MODEL, every
# other model and strategy is predicted from it.
for p in "${pairs[@]}"; do
  read -r w n <<<"$p"
  cal=(plan --calibrate "$out/cpu-w$w-n$n.yaml" --ranks "$w" --model "$cal_model" --batch "$batch" --seq "$seq"
       --bench-steps "$steps" --warmup-steps "$warmup" --repeats "$cal_repeats")
  phase "calibrating $w rank(s) on $n node(s)"
  if [ "$n" = 1 ]; then "$bin" "${cal[@]}"
  else on_hosts "$w" "$bin" "${cal[@]}" --nodes 2 --hosts "h1:$((w / 2)),h2:$((w / 2))"
  fi >"$out/calibrate-w$w-n$n.log" 2>&1 || { echo "calibration failed: $out/calibrate-w$w-n$n.log"; exit 1; }
done
for ((pass = 1; pass <= passes; pass++)); do # each pass measures every run again, minutes later
  for m in $models; do
    s=$seq st_n=$steps
    [ "$m" = gpt2-tiny ] && s=64 st_n=$steps_tiny # its context; its 1-15 ms steps are cheap to repeat
    [ "$m" = gpt2 ] && st_n=$steps_gpt2
    for p in "${pairs[@]}"; do
      read -r w n <<<"$p"
      [ "$m" = gpt2 ] && [ "$w" -gt "$gpt2_max" ] && continue
      phase "pass $pass/$passes: $m, $w rank(s) on $n node(s)"
      for st in $strats; do
        [ "$w" = 1 ] && [ "$st" != ddp ] && continue
        id=$m-w$w-n$n-$st
        res=$out/$id.bench # pass 1: ID.bench.json (the report reads it), pass k: ID.bench.passK.json
        [ "$pass" -gt 1 ] && res=$out/$id.bench.pass$pass
        run=(bench --model "$m" --batch "$batch" --seq "$s" --set parallel.strategy="$st" --bench-steps "$st_n"
             --warmup-steps "$warmup" --repeats 1 --json "$res.json")
        if [ "$n" = 1 ]; then "$bin" launch -n "$w" -- "${run[@]}"
        else on_hosts "$w" "$bin" launch -n "$w" --hosts "h1:$((w / 2)),h2:$((w / 2))" -- "${run[@]}"
        fi >"$res.log" 2>&1 || echo "bench failed: $res.log"
        [ "$pass" = 1 ] || continue
        "$bin" plan --catalog "$out/cpu-w$w-n$n.yaml" --hardware cpu-calibrated --gpus "$w" --nodes "$n" --model "$m" \
          --batch "$batch" --seq "$s" --strategy "$st" --tp 1 --pp 1 --json >"$out/$id.plan.json" 2>"$out/$id.plan.log" ||
          echo "plan failed: $out/$id.plan.log"
      done
    done
  done
done
phase "runs done"
"$bin" report "$out"/*.bench.json "$out"/*.plan.json -o "$out/report.html" >"$out/report.log" 2>&1 ||
  echo "report failed: $out/report.log" # plans beside the measured runs
python3 - "$out" <<'EOF'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
rows, st_err, mem_err, by_nodes, n_pass = [], [], [], {}, []
for p in sorted(glob.glob(os.path.join(out, "*.plan.json"))):
    b = p.replace(".plan.json", ".bench.json")
    if not os.path.exists(b): continue
    plan, bench = json.load(open(p)), json.load(open(b))
    lay = plan["layouts"][0]
    # each pass's median step (as the calibration: robust to the odd delayed step), then their
    # median: robust to a slow spell of the machine that covers a whole run in one pass
    passes = [bench] + [json.load(open(q)) for q in sorted(glob.glob(p.replace(".plan.json", ".bench.pass*.json")))]
    meas_s = statistics.median(x["summary"]["step_s"]["median"] for x in passes)
    n_pass.append(len(passes))
    meas_m = max(r["total"] for r in bench["memory"])
    e1, e2 = lay["step_s"] / meas_s - 1, lay["memory_bytes"]["total"] / meas_m - 1
    st_err.append(abs(e1)); mem_err.append(abs(e2))
    run = os.path.basename(p)[:-10]
    by_nodes.setdefault(re.search(r"-n(\d+)-", run).group(1), []).append(abs(e1))
    rows.append((run, lay["step_s"], meas_s, e1, lay["memory_bytes"]["total"], meas_m, e2))
print(f"# {'run':30s} {'plan_s':>9s} {'meas_s':>9s} {'err':>7s} {'plan_MiB':>9s} {'meas_MiB':>9s} {'err':>7s}")
for r in rows:
    print(f"  {r[0]:30s} {r[1]:9.4g} {r[2]:9.4g} {100*r[3]:+6.1f}% {r[4]/2**20:9.1f} {r[5]/2**20:9.1f} {100*r[6]:+6.2f}%")
if not rows: sys.exit("no runs compared")
for n, e in sorted(by_nodes.items()):
    print(f"# {n} node(s): {len(e)} runs, step time median |error| {100*statistics.median(e):.1f}%, worst {100*max(e):.1f}%")
print(f"# step time: median |error| {100*statistics.median(st_err):.1f}%, worst {100*max(st_err):.1f}%; "
      f"memory: worst |error| {100*max(mem_err):.2f}% ({min(n_pass)}-{max(n_pass)} pass(es) a run)")
sys.exit(0 if statistics.median(st_err) <= 0.10 and max(mem_err) <= 0.02 else 1)
EOF
rc=$?
phase "done (exit $rc); results in $out"
exit $rc
