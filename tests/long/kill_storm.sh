#!/usr/bin/env bash
# Kill storm (make test-long): one supervised 2-rank run receives KILLS (default 22) kill -9
# of a random rank at random instants - mid-step, mid-all-reduce, mid-checkpoint-save, during
# start-up - and restarts itself each time. Its final weights, final optimizer files and
# every logged loss must be bitwise those of an uninterrupted run, and the per-sample ledger
# must show every sample exactly once per epoch. Under DDP and ZeRO-3.
set -uo pipefail
bin=$1
dir=$2
kills=${KILLS:-22}
src=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$dir" && mkdir -p "$dir"
cd "$dir"
. "$src/tests/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
/usr/bin/python3 -c "
import numpy as np
np.random.default_rng(7).integers(0, 256, 400 * 32 + 1, dtype=np.uint16).tofile('tok.bin')"
common=(--set model.preset= --model.n_layer 2 --model.d_model 64 --model.n_head 4 --model.vocab_size 256
        --model.context 32 --seq 32 --batch 4 --set training.batch=8 --steps 600
        --set schedule.decay_steps=600 --set optimizer.lr=3e-3 --data tok.bin --set data.format=raw16
        --set logging.progress=lines --set checkpoint.every=5 --set checkpoint.keep_last=2)

for strat in ddp zero3; do
  mkdir -p ref_$strat storm_$strat
  "$bin" launch -n 2 -- train "${common[@]}" --set parallel.strategy=$strat --set checkpoint.dir=ref_$strat/ck \
    --set logging.metrics=ref_$strat/m.jsonl --save-weights ref_$strat/w.safetensors >ref_$strat.log 2>&1 \
    || fail "$strat reference: $(tail -3 ref_$strat.log)"
  DTRAIN_TEST_STEP_DELAY_MS=60 "$bin" launch -n 2 --max-restarts $((kills + 10)) --backoff 0.05 --backoff-max 0.2 -- \
    train "${common[@]}" --set parallel.strategy=$strat --set checkpoint.dir=storm_$strat/ck \
    --set logging.metrics=storm_$strat/m.jsonl --set data.ledger=storm_$strat/ledger \
    --save-weights storm_$strat/w.safetensors >storm_$strat.log 2>&1 &
  lp=$!
  n=0
  old=" "
  while [ $n -lt $kills ] && kill -0 $lp 2>/dev/null; do
    # one kill per incarnation: wait until the ranks of the previous one are gone
    pids=($(pgrep -f "dtrain train .*storm_$strat/ck" || true))
    stale=0
    for p in "${pids[@]}"; do case "$old" in *" $p "*) stale=1 ;; esac; done
    if [ $stale = 1 ] || [ ${#pids[@]} -lt 2 ]; then sleep 0.05; continue; fi
    sleep "$(/usr/bin/python3 -c 'import random; print(round(random.uniform(0.0, 2.0), 2))')"
    pids=($(pgrep -f "dtrain train .*storm_$strat/ck" || true))
    [ ${#pids[@]} -gt 0 ] || continue
    kill -9 "${pids[RANDOM % ${#pids[@]}]}" 2>/dev/null && n=$((n + 1))
    old=" ${pids[*]} "
  done
  wait $lp
  rc=$?
  restarts=$(grep -c "job failed after" storm_$strat.log)
  [ $rc = 0 ] && [ $n -ge $kills ] && [ $restarts -ge $kills ] && pass "$strat: $n kills, $restarts restarts, finished (exit 0)" \
    || fail "$strat storm: rc $rc after $n kills: $(grep 'dtrain launch' storm_$strat.log | tail -3)"
  out=$(/usr/bin/python3 "$src/tests/ref/compare_runs.py" storm_$strat/m.jsonl storm_$strat/w.safetensors \
        ref_$strat/m.jsonl ref_$strat/w.safetensors 0) && pass "$strat: losses and weights bitwise ($out)" \
    || fail "$strat: $out"
  same=1
  for f in ref_$strat/ck/step-00000600/optim-*; do cmp -s "$f" "storm_$strat/ck/step-00000600/$(basename "$f")" || same=0; done
  [ $same = 1 ] && pass "$strat: final optimizer state bitwise" || fail "$strat: optimizer state differs"
  out=$(/usr/bin/python3 "$src/tests/ref/ledger_check.py" storm_$strat/ledger 600 400) && pass "$strat ledger: $out" \
    || fail "$strat ledger: $out"
  grep "recovered:" storm_$strat.log | sed 's/.*logged \([0-9.]*\) s.*/\1/' | sort -n | awk '{a[NR]=$1} END {if (NR) printf "     recovery (failure detected -> first step): median %.2f s, max %.2f s over %d restarts\n", a[int((NR+1)/2)], a[NR], NR}'
done
echo "kill_storm: $fails failure(s)"
[ $fails -eq 0 ]
