#!/usr/bin/env bash
# The pipeline made visible and measured (issue 32 item 7; ARCHITECTURE decision 77), pp 2 on
# 2 ranks, llama-tiny (untied head, 4 layers), 4 micro-batches a step. No timing is checked,
# only what must hold whatever the host's speed:
#  - `dtrain bench` under 1f1b, gpipe and zb-h1 (its weight-gradient passes measured apart): the JSON's keys are FORMATS.md's, pipeline.ranks[]
#    has every rank's stage with busy + idle <= step, forward + backward + idle <= the span of
#    the schedule's passes <= step, idle <= the transfers' time, and exactly m x micro_batch x
#    seq x d_model x 4 bytes sent each way per stage boundary (activations forward, gradients
#    back); the replay's per-micro-batch durations are each stage's forward / m and backward /
#    m, and its span and idle fractions are those of an independent replay of the schedule's
#    lists (tests/check_bench.py); textbook (p-1)/(m+p-1) and the measured idle fraction beside
#    it; the table and the replay line are printed;
#  - the Chrome trace, of bench and of `dtrain train` (logging.trace): one row per rank named
#    with its stage, every micro-batch's forward and backward slot on both ranks in the
#    schedule's order each step, and the receive waits;
#  - a bench without a pipeline prints and writes none of it.
#   tests/test_pp_bench.sh BIN DIR
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
fresh_dir "$dir"
mpi_env
command -v mpiexec >/dev/null || skip "mpiexec not found (apt-get install openmpi-bin)"
check=$src/tests/check_bench.py

model=(--model llama-tiny --set model.untied_embeddings=1 --set model.n_layer=4 --seq 32 --batch 2
       --set training.grad_accum=4)
for s in 1f1b gpipe zb-h1; do
  trace=()
  [ $s = 1f1b ] && trace=(--trace bench.trace.json)
  if ! timeout 300 "${mpi[@]}" -n 2 "$bin" bench "${model[@]}" --set parallel.pp=2 --set parallel.pp_schedule=$s \
      --bench-steps 2 --warmup-steps 1 --repeats 1 --peak 100 --json "$s.json" "${trace[@]}" >"$s.log" 2>&1; then
    fail "bench pp 2 $s: $(tail -2 "$s.log")"
    continue
  fi
  d=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"]["d_model"])' "$s.json")
  if out=$(/usr/bin/python3 "$check" pp "$s.json" "$src/docs/FORMATS.md" 2 4 $s 2 32 "$d" 2>&1); then
    pass "bench pp 2 $s: $out"
  else
    fail "bench pp 2 $s: $out"
  fi
  if grep -qE "^# rank +stage +step_ms" "$s.log" && [ "$(grep -cE '^  [01] +[01] +[0-9.]+ ' "$s.log")" -ge 2 ] &&
     grep -qE "^# schedule replay \($s, transfers free\)" "$s.log" &&
     grep -qE "^# pipeline idle fraction: replay [0-9.]+%, textbook \(p-1\)/\(m\+p-1\) 20.0%, measured [0-9.]+%" "$s.log"
  then pass "bench pp 2 $s: the per-rank table and the replay line beside (p-1)/(m+p-1)"
  else fail "bench pp 2 $s: no per-rank table or replay line: $(grep '^# pipeline' "$s.log")"
  fi
done
if [ -s bench.trace.json ] && out=$(/usr/bin/python3 "$check" pptrace bench.trace.json 2 4 1f1b 2 2>&1) &&
   out2=$(/usr/bin/python3 "$check" trace bench.trace.json 2 2>&1); then
  pass "bench trace: $out; $out2"
else
  fail "bench trace: $out ${out2:-}"
fi

# dtrain train's trace (logging.trace), gpipe: the same picture
if timeout 300 "${mpi[@]}" -n 2 "$bin" train "${model[@]}" --steps 2 --lr 1e-3 --set parallel.pp=2 \
     --set parallel.pp_schedule=gpipe --set logging.trace=train.trace.json >train.log 2>&1 &&
   out=$(/usr/bin/python3 "$check" pptrace train.trace.json 2 4 gpipe 2 2>&1); then
  pass "train trace (logging.trace): $out"
else
  fail "train trace: $(tail -2 train.log) ${out:-}"
fi

# no pipeline: no pipeline table, line or key
if "$bin" bench "${model[@]}" --bench-steps 1 --warmup-steps 0 --repeats 1 --peak 100 --json one.json >one.log 2>&1 &&
   ! grep -qE "^# (pipeline|schedule replay)" one.log &&
   /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert "pipeline" not in d and "pp" not in d["parallel"]' one.json &&
   out=$(/usr/bin/python3 "$check" keys one.json "$src/docs/FORMATS.md" 2>&1); then
  pass "pp 1: no pipeline table, line or JSON key ($out)"
else
  fail "pp 1: $(tail -2 one.log)"
fi

echo "test_pp_bench: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
