#!/bin/bash
# The calibrated planner against dtrain's own measured runs on this machine (issues 15 and 35:
# step time within 10%, memory exact; 1-4 ranks, 1-2 simulated nodes, every strategy and every
# layout family: DDP, ZeRO, TP, PP, CP, EP, 3-D). A benchmark, not a test: run it on a QUIET
# machine (it times runs); NODES containing 2 needs root (network namespaces):
#   NODES="1 2" bash bench/planner/calibrate_check.sh build/dtrain [OUT_DIR]
# 1. dtrain plan --calibrate per world size W and node count N: this machine's entry with W
#    ranks (cpu-calibrated, one device per rank). N = 1: --ranks W (the link from a comm fit on
#    this machine). N = 2 (even W only): the script brings up 2 simulated hosts
#    (scripts/mnhosts.sh up 2: network namespaces, TCP between them, each its own /dev/shm;
#    `mnhosts.sh down` on exit, whatever happens) and runs, on h1, --ranks W --nodes 2 --hosts
#    h1:W/2,h2:W/2: the comm fit across the hosts gives the inter-node link net-fit (its cross
#    group) and the intra-node link shm-fit (its node group, W = 4);
# 2. for each run of the families (below): the measured run, `dtrain launch -n W -- bench`
#    (N = 2: `mnhosts.sh exec h1 dtrain launch -n W --hosts h1:W/2,h2:W/2 -- bench`, OMP threads
#    cores / W as on one node), and the prediction, `dtrain plan --catalog ENTRY --gpus W
#    --nodes N --strategy S --tp T --pp P --cp C --ep E --global-batch G`, same model, micro-batch,
#    sequence and accumulation;
# 3. a table of predicted vs measured step time (the median over PASSES passes of a run's
#    median step: every run is measured PASSES times, one pass over the list after another,
#    minutes apart, so that a slow spell of the machine covering a whole run counts once) and memory (the
#    allocator's high-water of the fullest rank vs the plan's), the median / worst errors overall,
#    per family, per node count, and apart for the time-sliced runs (more ranks than cores); exit 1
#    if the median step-time error over every run exceeds 10%, the worst 35%, any memory differs
#    from the plan's by a byte, or a run or plan failed;
#    OUT_DIR/report.html shows the same pairs (with the first pass's measurement).
# Environment: FAMILIES (default "dp tp pp cp ep 3d": which layout families run, below), MODELS
# (default "gpt2-tiny bench-small gpt2"; the dp family's), WORLDS ("1 2 3 4"; the dp family's),
# NODES ("1"; "1 2" adds the 2-host runs of every even W), STRATS ("ddp zero1 zero2 zero3"; the dp
# family's), BATCH (2), SEQ (128; gpt2-tiny and mixtral-tiny: 64, their context), STEPS (5 timed steps a
# run), WARMUP (2), CAL_MODEL (bench-small: the model the calibrations run); gpt2, whose steps
# are the longest, runs STEPS_GPT2 (3) steps and only where W <= GPT2_MAX_WORLD (2); gpt2-tiny
# and mixtral-tiny, the fastest, STEPS_TINY (40); each calibration runs CAL_REPEATS (3) repeats of STEPS (a slow
# spell of the machine during one short calibration run skews every plan made from it),
# CAL_COMM_MAX_BYTES (64M: the comm fit's largest message, plan --calibrate --comm-max-bytes),
# PP_ACCUM (4: the micro-batches a step of the runs with pp > 1).
# Families (each run's plan fixes its layout: --strategy S --tp T --pp P --cp C --ep E, the
# bench the same parallel.* keys, both the same model, micro-batch, sequence and
# training.grad_accum, the plan's --global-batch micro-batch x accumulation x dp):
#   dp  MODELS x WORLDS x NODES x STRATS, DDP and ZeRO-1/2/3 (reported as families ddp and zero);
#   tp  bench-small: tp 2 (2 ranks, one node), tp 2 x dp 2 with ddp and zero1 (4 ranks);
#   pp  bench-small, PP_ACCUM (4) micro-batches a step: pp 2, pp 2 x dp 2 with ddp and zero1, pp 4;
#   cp  bench-small: cp 2, cp 2 x dp 2 with ddp and zero3;
#   ep  mixtral-tiny (4 experts, top-2; ddp, as dtrain runs ep): ep 2 (dp 2), ep 2 x dp 4;
#   3d  two model-parallel degrees on 4 ranks (with dp 1, the 3-D layouts 4 ranks hold):
#       tp 2 x pp 2 (PP_ACCUM), tp 2 x cp 2, pp 2 x cp 2 (PP_ACCUM);
# the model-parallel families on every node count of NODES (2 nodes: 1 or 2 ranks a host; tp's
# groups stay inside a host, so tp 2 on 2 ranks runs on one node only). The report gives the
# median / worst step-time error per family, per node count, and apart for the runs with more
# ranks than this machine's cores (nproc: time-sliced, the ranks taking turns on the cores).
# W ranks share the machine's cores, so a run takes about W times one rank's step: the dp family
# with NODES="1 2" (6 calibrations, 51 runs, PASSES 3) takes about 30 minutes on a quiet 2-core
# machine (PASSES=1: about 16); the other families add 29 runs on the same calibrations, about
# 40 minutes (an estimate: docs/planner.md); each phase's start is printed in seconds.
set -u
bin=$(readlink -f "$1") out=${2:-$(mktemp -d /tmp/dt_calcheck_XXXXXX)}
mkdir -p "$out" && out=$(readlink -f "$out") || exit 1
src=$(cd "$(dirname "$0")/../.." && pwd)
mn=$src/scripts/mnhosts.sh
families=${FAMILIES:-dp tp pp cp ep 3d}
models=${MODELS:-gpt2-tiny bench-small gpt2} worlds=${WORLDS:-1 2 3 4} nodes=${NODES:-1}
strats=${STRATS:-ddp zero1 zero2 zero3}
batch=${BATCH:-2} seq=${SEQ:-128} steps=${STEPS:-5} steps_gpt2=${STEPS_GPT2:-3} warmup=${WARMUP:-2}
steps_tiny=${STEPS_TINY:-40} cal_repeats=${CAL_REPEATS:-3} passes=${PASSES:-3} pp_accum=${PP_ACCUM:-4}
gpt2_max=${GPT2_MAX_WORLD:-2}
cal_model=${CAL_MODEL:-bench-small}
comm_max=${CAL_COMM_MAX_BYTES:-64M}
for v in "$batch" "$seq" "$steps" "$steps_gpt2" "$steps_tiny" "$cal_repeats" "$warmup" "$gpt2_max" "$passes" "$pp_accum"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "calibrate_check: BATCH, SEQ, STEPS, STEPS_GPT2, STEPS_TINY, CAL_REPEATS, WARMUP, GPT2_MAX_WORLD, PASSES and PP_ACCUM must be whole numbers (got '$v')"; exit 2; }
done
[ "$passes" -ge 1 ] || { echo "calibrate_check: PASSES must be >= 1"; exit 2; }
[ "$pp_accum" -ge 4 ] || { echo "calibrate_check: PP_ACCUM must be >= 4 (micro-batches of a pp 4 run)"; exit 2; }
for w in $worlds; do
  [[ $w =~ ^[1-9][0-9]*$ ]] || { echo "calibrate_check: WORLDS must be rank counts >= 1 (got '$w')"; exit 2; }
done
for n in $nodes; do
  [ "$n" = 1 ] || [ "$n" = 2 ] || { echo "calibrate_check: NODES holds 1 and/or 2 (got '$n')"; exit 2; }
done
for f in $families; do
  case $f in dp | tp | pp | cp | ep | 3d) ;; *) echo "calibrate_check: FAMILIES holds dp tp pp cp ep 3d (got '$f')"; exit 2 ;; esac
done
has_family() { [[ " $families " == *" $1 "* ]]; }
cores=$(nproc)
t0=$(date +%s)
phase() { echo "# $(($(date +%s) - t0)) s: $*"; }

# The runs, one line each: "family model W N tp pp cp ep strategy accum" (dp = W / (tp pp cp)).
runs=()
if has_family dp; then
  for m in $models; do
    for n in $nodes; do
      for w in $worlds; do
        [ "$n" = 2 ] && [ $((w % 2)) = 1 ] && continue
        [ "$m" = gpt2 ] && [ "$w" -gt "$gpt2_max" ] && continue
        for st in $strats; do
          [ "$w" = 1 ] && [ "$st" != ddp ] && continue
          fam=zero
          [ "$st" = ddp ] && fam=ddp
          runs+=("$fam $m $w $n 1 1 1 1 $st 1")
        done
      done
    done
  done
fi
for n in $nodes; do # the model-parallel families: W = 2 on 1 or 2 hosts, W = 4 with 2 ranks a host
  has_family tp && { [ "$n" = 1 ] && runs+=("tp bench-small 2 1 2 1 1 1 ddp 1")
                     runs+=("tp bench-small 4 $n 2 1 1 1 ddp 1" "tp bench-small 4 $n 2 1 1 1 zero1 1"); }
  has_family pp && runs+=("pp bench-small 2 $n 1 2 1 1 ddp $pp_accum" "pp bench-small 4 $n 1 2 1 1 ddp $pp_accum"
                          "pp bench-small 4 $n 1 2 1 1 zero1 $pp_accum" "pp bench-small 4 $n 1 4 1 1 ddp $pp_accum")
  has_family cp && runs+=("cp bench-small 2 $n 1 1 2 1 ddp 1" "cp bench-small 4 $n 1 1 2 1 ddp 1"
                          "cp bench-small 4 $n 1 1 2 1 zero3 1")
  has_family ep && runs+=("ep mixtral-tiny 2 $n 1 1 1 2 ddp 1" "ep mixtral-tiny 4 $n 1 1 1 2 ddp 1")
  has_family 3d && runs+=("3d bench-small 4 $n 2 2 1 1 ddp $pp_accum" "3d bench-small 4 $n 2 1 2 1 ddp 1"
                          "3d bench-small 4 $n 1 2 2 1 ddp $pp_accum")
done
[ ${#runs[@]} -gt 0 ] || { echo "calibrate_check: no run selected (FAMILIES, MODELS, WORLDS, NODES, STRATS)"; exit 2; }
# One calibration per "W N" pair the runs use (2 nodes: even W, W/2 ranks a host).
pairs=()
declare -A seen=()
for r in "${runs[@]}"; do
  read -r _ _ w n _ <<<"$r"
  [ -n "${seen[$w.$n]:-}" ] || pairs+=("$w $n")
  seen[$w.$n]=1
done
# the index the report reads: id family W N
: >"$out/runs.tsv"
run_id() { # "family model W N tp pp cp ep strategy accum" -> the run's file name
  local fam m w n tp pp cp ep st acc
  read -r fam m w n tp pp cp ep st acc <<<"$1"
  if [ "$fam" = ddp ] || [ "$fam" = zero ]; then echo "$m-w$w-n$n-$st" # the names of the earlier checks
  else echo "$fam-$m-w$w-n$n-tp$tp-pp$pp-cp$cp-ep$ep-$st"; fi
}
for r in "${runs[@]}"; do
  read -r fam m w n _ <<<"$r"
  printf '%s\t%s\t%s\t%s\n' "$(run_id "$r")" "$fam" "$w" "$n" >>"$out/runs.tsv"
done
phase "${#runs[@]} runs, ${#pairs[@]} calibration(s), $passes pass(es), families: $families"
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
# other model, strategy and layout is predicted from it (its links: shm-fit, net-fit, and the
# tensor-, pipeline- and expert-parallel links tp-fit, pp-fit, ep-fit of the comm fit).
for p in "${pairs[@]}"; do
  read -r w n <<<"$p"
  cal=(plan --calibrate "$out/cpu-w$w-n$n.yaml" --ranks "$w" --model "$cal_model" --batch "$batch" --seq "$seq"
       --bench-steps "$steps" --warmup-steps "$warmup" --repeats "$cal_repeats" --comm-max-bytes "$comm_max")
  phase "calibrating $w rank(s) on $n node(s)"
  if [ "$n" = 1 ]; then "$bin" "${cal[@]}"
  else on_hosts "$w" "$bin" "${cal[@]}" --nodes 2 --hosts "h1:$((w / 2)),h2:$((w / 2))"
  fi >"$out/calibrate-w$w-n$n.log" 2>&1 || { echo "calibration failed: $out/calibrate-w$w-n$n.log"; exit 1; }
done
for ((pass = 1; pass <= passes; pass++)); do # each pass measures every run again, minutes later
  for r in "${runs[@]}"; do
    read -r fam m w n tp pp cp ep st acc <<<"$r"
    s=$seq st_n=$steps
    [ "$m" = gpt2-tiny ] || [ "$m" = mixtral-tiny ] && s=64 st_n=$steps_tiny # their context; 1-15 ms steps are cheap to repeat
    [ "$m" = gpt2 ] && st_n=$steps_gpt2
    id=$(run_id "$r") dp=$((w / (tp * pp * cp)))
    phase "pass $pass/$passes: $fam $m, $w rank(s) on $n node(s), tp $tp pp $pp cp $cp ep $ep dp $dp $st"
    res=$out/$id.bench # pass 1: ID.bench.json (the report reads it), pass k: ID.bench.passK.json
    [ "$pass" -gt 1 ] && res=$out/$id.bench.pass$pass
    keys=(--model "$m" --batch "$batch" --seq "$s" --set training.grad_accum="$acc")
    run=(bench "${keys[@]}" --set parallel.strategy="$st" --set parallel.tp="$tp" --set parallel.pp="$pp"
         --set parallel.cp="$cp" --set parallel.ep="$ep" --bench-steps "$st_n" --warmup-steps "$warmup" --repeats 1
         --json "$res.json")
    if [ "$n" = 1 ]; then "$bin" launch -n "$w" -- "${run[@]}"
    else on_hosts "$w" "$bin" launch -n "$w" --hosts "h1:$((w / 2)),h2:$((w / 2))" -- "${run[@]}"
    fi >"$res.log" 2>&1 || echo "bench failed: $res.log"
    [ "$pass" = 1 ] || continue
    "$bin" plan --catalog "$out/cpu-w$w-n$n.yaml" --hardware cpu-calibrated --gpus "$w" --nodes "$n" "${keys[@]}" \
      --global-batch $((batch * acc * dp)) --strategy "$st" --tp "$tp" --pp "$pp" --cp "$cp" --ep "$ep" \
      --json >"$out/$id.plan.json" 2>"$out/$id.plan.log" || echo "plan failed: $out/$id.plan.log"
  done
done
phase "runs done"
"$bin" report "$out"/*.bench.json "$out"/*.plan.json -o "$out/report.html" >"$out/report.log" 2>&1 ||
  echo "report failed: $out/report.log" # plans beside the measured runs
python3 "$src/bench/planner/calibrate_report.py" "$out" "$cores"
rc=$?
phase "done (exit $rc); results in $out"
exit $rc
