#!/usr/bin/env bash
# Kill storm: one supervised 2-rank run receives KILLS kill -9 of a random rank process, each
# at a random step (KILLS distinct steps drawn from the run, sorted) and a random instant of
# that step - in its slowed start, its compute, an all-reduce or a checkpoint save - and
# restarts itself each time. Every kill must have hit a rank (not mpirun or launch), the
# supervisor must name that rank and restart once per kill, the final weights, every final
# optimizer file and every logged loss must be bitwise those of an uninterrupted run, and
# the per-sample ledger must show every sample exactly once per epoch. Under DDP and ZeRO-3.
#   kill_storm.sh BIN DIR
# make test-long: KILLS=22 over 600 steps (the defaults); CTest test_kill_storm_short (make
# test): KILLS=5 STEPS=100. STRATS (default "ddp zero3"), DELAY_MS per step (default 60), EXTRA:
# more train arguments (make test-long: a storm on a tensor-parallel pair, --set parallel.tp=2).
set -uo pipefail
bin=$1
dir=$2
kills=${KILLS:-22}
steps=${STEPS:-600}
strats=${STRATS:-ddp zero3}
delay=${DELAY_MS:-60}
. "$(dirname "$0")/../lib.sh"
fresh_dir "$dir"
start=$(date +%s)
mpi_env
# 400 samples: one epoch is 50 steps of a global batch of 8, so STEPS must be a multiple of 50.
raw16_tokens tok.bin
common=(--set model.preset= --model.n_layer 2 --model.d_model 64 --model.n_head 4 --model.vocab_size 256
        --model.context 32 --seq 32 --batch 4 --set training.batch=8 --steps $steps
        --set schedule.decay_steps=$steps --set optimizer.lr=3e-3 --data tok.bin --set data.format=raw16
        --set logging.progress=lines --set checkpoint.every=5 --set checkpoint.keep_last=2 ${EXTRA:-})
final=ck/step-$(printf %08d $steps)

for strat in $strats; do
  mkdir -p ref_$strat storm_$strat
  "$bin" launch -n 2 -- train "${common[@]}" --set parallel.strategy=$strat --set checkpoint.dir=ref_$strat/ck \
    --set logging.metrics=ref_$strat/m.jsonl --save-weights ref_$strat/w.safetensors >ref_$strat.log 2>&1 \
    || fail "$strat reference: $(tail -3 ref_$strat.log)"
  DTRAIN_TEST_STEP_DELAY_MS=$delay "$bin" launch -n 2 --max-restarts $((kills + 10)) --backoff 0.05 --backoff-max 0.2 -- \
    train "${common[@]}" --set parallel.strategy=$strat --set checkpoint.dir=storm_$strat/ck \
    --set logging.metrics=storm_$strat/m.jsonl --set data.ledger=storm_$strat/ledger \
    --save-weights storm_$strat/w.safetensors >storm_$strat.log 2>&1 &
  lp=$!
  # The kill steps: distinct, inside the run (not its first or last step), in order.
  targets=$(/usr/bin/python3 -c "import random; print(*sorted(random.sample(range(2, $steps - 1), $kills)))")
  n=0
  old=" "
  victims=()
  : >storm_$strat.kills
  for t in $targets; do
    # One kill per incarnation: kill_rank_at waits for ranks that are not the previous ones.
    if ! v=$(kill_rank_at "$bin" "storm_$strat/ck" storm_$strat/m.jsonl 2 "$t" "$delay" $lp "$old"); then
      fail "$strat: kill $((n + 1)) of $kills (step $t): $v"
      break
    fi
    read -r vpid vrank vstep <<<"$v"
    echo "kill $((n + 1)): pid $vpid (rank $vrank) at step $vstep (drawn: $t)" >>storm_$strat.kills
    victims+=("$vrank")
    n=$((n + 1))
    old=" $(rank_pids "$bin" "storm_$strat/ck" | cut -d' ' -f1 | tr '\n' ' ')$vpid "
  done
  wait $lp
  rc=$?
  # The supervisor's view: one failure per kill naming the killed rank and signal 9, in order.
  named=($(sed -n 's/.*job failed after .*: rank \([0-9]*\) killed by signal 9 .*/\1/p' storm_$strat.log))
  restarts=$(grep -c "restart [0-9]* of [0-9]*" storm_$strat.log)
  if [ $rc = 0 ] && [ $n = "$kills" ] && [ "${named[*]}" = "${victims[*]}" ] && [ "$restarts" = $n ] \
    && grep -q "job finished after $n restart(s)" storm_$strat.log; then
    pass "$strat: $n kill -9 of ranks ${victims[*]} at steps $(awk '{printf "%s ", $9}' storm_$strat.kills)(drawn: $targets), $restarts restarts, finished (exit 0)"
  else
    fail "$strat storm: rc $rc, $n of $kills kills (ranks '${victims[*]}'), supervisor named killed ranks '${named[*]}', $restarts restarts; supervisor: $(grep 'dtrain launch' storm_$strat.log | tail -2 | grep . || echo 'nothing logged')"
  fi
  out=$(/usr/bin/python3 "$src/tests/ref/compare_runs.py" storm_$strat/m.jsonl storm_$strat/w.safetensors \
        ref_$strat/m.jsonl ref_$strat/w.safetensors 0) && pass "$strat: losses and weights bitwise ($out)" \
    || fail "$strat: $out"
  # Every optimizer file of the reference, present and bitwise equal; no others.
  same=0 nf=0
  for f in ref_$strat/$final/optim-*; do
    nf=$((nf + 1))
    cmp -s "$f" "storm_$strat/$final/$(basename "$f")" && same=$((same + 1))
  done
  got=$(ls storm_$strat/$final/optim-* 2>/dev/null | wc -l)
  [ $nf -gt 0 ] && [ $same = $nf ] && [ "$got" = $nf ] && pass "$strat: final optimizer state bitwise ($nf files)" \
    || fail "$strat: optimizer state: $same of $nf reference files equal, $got files"
  # Exactly once per epoch, and written by one incarnation more than there were kills.
  out=$(/usr/bin/python3 "$src/tests/ref/ledger_check.py" storm_$strat/ledger $steps 400) \
    && [[ $out == *" $((n + 1)) incarnations,"* ]] && pass "$strat ledger: $out" || fail "$strat ledger ($n kills): $out"
  grep "recovered:" storm_$strat.log | sed 's/.*logged \([0-9.]*\) s.*/\1/' | sort -n | awk '{a[NR]=$1} END {if (NR) printf "     recovery (failure detected -> first step): median %.2f s, max %.2f s over %d restarts\n", a[int((NR+1)/2)], a[NR], NR}'
done
echo "kill_storm: $fails failure(s) in $(($(date +%s) - start)) s"
[ $fails -eq 0 ]
