#!/usr/bin/env bash
# Resume and fault tolerance, end to end under MPI (2 ranks, tiny model, 50 steps = one epoch
# of a 400-sample token file):
#  - kill -9 mid-save (fault injection) and kill -9 of a random rank process at a random step,
#    under `dtrain launch --max-restarts`: the kill and the restart asserted, final weights,
#    every optimizer file and every logged loss bitwise equal to an uninterrupted run, for DDP
#    and ZeRO-3; the per-sample ledger shows every sample of the epoch exactly once;
#  - resharding: ZeRO-3 on 2 ranks -> DDP on 1 rank (2 accumulation steps) -> ZeRO-2 on 2
#    ranks: bitwise the losses and weights of the uninterrupted run, ledger exactly once;
#  - mixed precision (bf16, fp16 with its loss scaler and an injected overflow): resumed
#    across ZeRO-3 -> ZeRO-1 -> DDP x1 -> ZeRO-2, bitwise the uninterrupted run, loss scales too;
#  - the LLaMA and ViT families (ViT on an IDX image file): stop + resume bitwise (ZeRO-3),
#    and resharded onto 1 rank;
#  - a damaged newest checkpoint is skipped with a message and the previous one is used;
#  - a rank that hangs: the watchdog fires, the supervisor names the rank that never
#    entered the collective, restarts, and the result is still bitwise the same;
#  - SIGTERM to the supervisor: checkpoint at the next step, exit 0; resuming finishes;
#    SIGUSR1 to one rank of a plain mpirun job: every rank checkpoints at the same step, exit 0;
#  - a real full disk (a 2.5 MB tmpfs, when this user may mount one): the saves that do not fit
#    fail with ENOSPC and a message, training goes on, the earlier checkpoint stays intact, and
#    the run fails because its final checkpoint could not be written (without the mount this
#    case is skipped by name; under CI=true that fails the test).
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
fresh_dir "$dir"
mpi_env
ledger() { /usr/bin/python3 "$src/tests/ref/ledger_check.py" "$@"; }

# 400 samples of T=32 (+1 token): one epoch is 50 steps of a global batch of 8.
raw16_tokens tok.bin
# Vocabulary 2048 (tokens stay below 256): wte is 3 vocabulary-chunk units, so ZeRO-2/3
# resume and reshard with the embedding sharded chunk by chunk.
common=(--set model.preset= --model.n_layer 2 --model.d_model 64 --model.n_head 4 --model.vocab_size 2048
        --model.context 32 --seq 32 --batch 4 --set training.batch=8 --steps 50
        --set schedule.decay_steps=50 --set optimizer.lr=3e-3 --data tok.bin --set data.format=raw16
        --set logging.progress=lines --set checkpoint.every=5 --set checkpoint.keep_last=0)
launch() { "$bin" launch -n "$1" "${@:2}"; }
# run NAME RANKS [launch flags --] train flags...
run() {
  local name=$1 n=$2
  shift 2
  launch "$n" "$@" --set checkpoint.dir="$name/ck" --set logging.metrics="$name/m.jsonl" \
    --save-weights "$name/w.safetensors" >"$name.log" 2>&1
}
last_optim() { ls "$1"/ck/step-00000050/optim-*.safetensors 2>/dev/null; }
same_optim() { # RUN REF: each of REF's final optimizer files in RUN, bitwise, and no others
  local a n=0 bad=""
  for a in $(last_optim "$2"); do
    n=$((n + 1))
    cmp -s "$a" "$1/ck/step-00000050/$(basename "$a")" || bad="$bad $(basename "$a")"
  done
  local got=$(last_optim "$1" | wc -l)
  if [ $n -gt 0 ] && [ -z "$bad" ] && [ "$got" = $n ]; then echo "$n optimizer files bitwise"; return 0; fi
  echo "optimizer files: $n in the reference, $got in $1, missing or different:${bad:- none}"
  return 1
}
mkdir -p ref_ddp ref_z3 kill_ddp kill_z3 reshard hang preempt damaged
run ref_ddp 2 -- train "${common[@]}" || fail "reference DDP run: $(tail -3 ref_ddp.log)"
run ref_z3 2 -- train "${common[@]}" --set parallel.strategy=zero3 || fail "reference ZeRO-3 run: $(tail -3 ref_z3.log)"
out=$(cmp_runs ref_z3/m.jsonl ref_z3/w.safetensors ref_ddp/m.jsonl ref_ddp/w.safetensors 0) \
  && pass "references: ZeRO-3 = DDP bitwise ($out)" || fail "references differ: $out"

# 1. Rank 0 is killed (SIGKILL) at its 40th checkpoint I/O point: in the middle of a save.
DTRAIN_CKPT_FAULT=crash@40:0 run kill_ddp 2 --max-restarts 3 --backoff 0.1 -- train "${common[@]}" \
  --set data.ledger=kill_ddp/ledger || fail "DDP with a crash mid-save: $(tail -3 kill_ddp.log)"
grep -q "killed by signal 9" kill_ddp.log && grep -q "job finished after 1 restart" kill_ddp.log \
  && pass "crash mid-save: supervisor names rank 0 (signal 9) and restarts once" \
  || fail "crash mid-save not reported/restarted: $(grep 'dtrain launch' kill_ddp.log | tail -3)"
out=$(cmp_runs kill_ddp/m.jsonl kill_ddp/w.safetensors ref_ddp/m.jsonl ref_ddp/w.safetensors 0) \
  && out="$out; $(same_optim kill_ddp ref_ddp)" \
  && pass "DDP killed mid-save + restart: losses, weights, optimizer bitwise ($out)" || fail "DDP kill/resume: $out"
out=$(ledger kill_ddp/ledger 50 400) && pass "ledger across the restart: $out" || fail "ledger: $out"

# 2. ZeRO-3: kill -9 of a random rank process (not mpirun or launch: see rank_pids) once the
#    run has logged a random step k in [8, 40], at a random instant of the next 50 ms (steps
#    are slowed to 50 ms, so the run is far from over). No kill, a kill at the last step, or no
#    restart naming the killed rank is a failure.
k=$((8 + RANDOM % 33))
DTRAIN_TEST_STEP_DELAY_MS=50 run kill_z3 2 --max-restarts 3 --backoff 0.1 -- train "${common[@]}" --set parallel.strategy=zero3 \
  --set data.ledger=kill_z3/ledger &
lp=$!
killed=$(kill_rank_at "$bin" kill_z3/ck kill_z3/m.jsonl 2 $k 50 $lp " ") || fail "ZeRO-3 random kill at step $k: $killed"
wait $lp || fail "ZeRO-3 with a random kill: $(tail -3 kill_z3.log)"
read -r vpid vrank vstep <<<"$killed"
[[ $vstep =~ ^[0-9]+$ ]] && [ "$vstep" -ge $k ] && [ "$vstep" -lt 50 ] \
  && grep -q "job failed after .*: rank $vrank killed by signal 9" kill_z3.log \
  && grep -q "job finished after 1 restart(s)" kill_z3.log \
  && pass "ZeRO-3: rank $vrank (pid $vpid) killed -9 at step $vstep (drawn: $k); supervisor named it, restarted once" \
  || fail "ZeRO-3 random kill (drawn step $k, killer: '$killed'): supervisor: $(grep 'dtrain launch' kill_z3.log \
       | tail -3 | grep . || echo 'no failure and no restart logged')"
out=$(cmp_runs kill_z3/m.jsonl kill_z3/w.safetensors ref_z3/m.jsonl ref_z3/w.safetensors 0) \
  && out="$out; $(same_optim kill_z3 ref_z3)" && pass "ZeRO-3 random kill -9 + restart: bitwise ($out)" \
  || fail "ZeRO-3 kill/resume: $out"
out=$(ledger kill_z3/ledger 50 400) && [[ $out == *" 2 incarnations,"* ]] && pass "ledger: $out" || fail "ledger: $out"

# 3. Resharding: ZeRO-3 x2 to step 20, DDP x1 (2 accumulation micro-steps) to 35, ZeRO-2 x2 to 50.
ok=1
launch 2 -- train "${common[@]}" --steps 20 --set parallel.strategy=zero3 --set checkpoint.dir=reshard/ck \
  --set logging.metrics=reshard/m.jsonl --set data.ledger=reshard/ledger >reshard.log 2>&1 || ok=0
"$bin" train "${common[@]}" --steps 35 --resume --set checkpoint.dir=reshard/ck \
  --set logging.metrics=reshard/m.jsonl --set data.ledger=reshard/ledger >>reshard.log 2>&1 || ok=0
launch 2 -- train "${common[@]}" --set parallel.strategy=zero2 --resume --set checkpoint.dir=reshard/ck \
  --set logging.metrics=reshard/m.jsonl --set data.ledger=reshard/ledger --save-weights reshard/w.safetensors >>reshard.log 2>&1 || ok=0
[ $ok = 1 ] && [ "$(grep -c '(resharded)' reshard.log)" = 2 ] || fail "resharding runs: $(grep -E 'error|resumed' reshard.log | tail -3)"
# Bitwise: the global batch is kept (training.batch) and every leg sums in rank order with
# one micro-step per rank, or one rank's micro-steps in order (DDP x1 x 2) - the same sums.
out=$(cmp_runs reshard/m.jsonl reshard/w.safetensors ref_ddp/m.jsonl ref_ddp/w.safetensors 0) \
  && pass "ZeRO-3 x2 -> DDP x1 -> ZeRO-2 x2: bitwise the uninterrupted run ($out)" || fail "resharded run: $out"
out=$(ledger reshard/ledger 50 400) && pass "ledger across world-size changes: $out" || fail "ledger: $out"

# Mixed precision: bf16 and fp16 resumed through every strategy, ZeRO-3 x2 (to step 15) ->
# ZeRO-1 x2 (30) -> DDP x1 with 2 accumulation micro-steps (40) -> ZeRO-2 x2 (50), bitwise the
# uninterrupted DDP run: losses, weights and the loss scale of every step. fp16's scale grows
# every 7 finite steps and an overflow is injected at step 12 (DTRAIN_TEST_OVERFLOW), so the
# scaler state (scale, finite-step count) must cross each resume for the scales to match.
for prec in bf16 fp16; do
  mp=(--set training.precision=$prec --set training.loss_scale_window=7)
  ovf=""; [ $prec = fp16 ] && ovf=12 # bf16 has no scaler: an overflow would be a divergence
  mkdir -p mp_ref_$prec mp_$prec
  DTRAIN_TEST_OVERFLOW=${ovf:+$ovf:1} run mp_ref_$prec 2 -- train "${common[@]}" "${mp[@]}" || fail "$prec reference: $(tail -3 mp_ref_$prec.log)"
  ok=1
  legs=("2 15 zero3" "2 30 zero1" "1 40 ddp" "2 50 zero2")
  for leg in "${legs[@]}"; do
    read -r n upto strat <<<"$leg"
    res=(); [ "$upto" != 15 ] && res=(--resume)
    DTRAIN_TEST_OVERFLOW=${ovf:+$ovf:$((n - 1))} launch "$n" -- train "${common[@]}" "${mp[@]}" --steps "$upto" "${res[@]}" \
      --set parallel.strategy=$strat --set checkpoint.dir=mp_$prec/ck --set logging.metrics=mp_$prec/m.jsonl \
      --save-weights mp_$prec/w.safetensors >>mp_$prec.log 2>&1 || ok=0
  done
  [ $ok = 1 ] && [ "$(grep -c '(resharded)' mp_$prec.log)" = 3 ] || fail "$prec resume legs: $(grep -E 'error|resumed' mp_$prec.log | tail -3)"
  out=$(cmp_runs mp_$prec/m.jsonl mp_$prec/w.safetensors mp_ref_$prec/m.jsonl mp_ref_$prec/w.safetensors 0) \
    && scales=$(/usr/bin/python3 "$src/tests/ref/loss_scales.py" mp_$prec/m.jsonl mp_ref_$prec/m.jsonl "$prec" 50) \
    && pass "$prec: ZeRO-3 x2 -> ZeRO-1 x2 -> DDP x1 -> ZeRO-2 x2 = uninterrupted ($out; $scales)" \
    || fail "$prec resume across strategies: $out ${scales:-}"
done

# The LLaMA family: stop at step 25 and resume (ZeRO-3, 2 ranks) = uninterrupted, bitwise
# (losses, weights, every optimizer file); then the step-25 checkpoint resumed on 1 rank with
# DDP (resharded) gives the same math.
llama=(--set model.family=llama --set model.n_kv_head=2 --set model.d_ff=96 --set model.untied_embeddings=true)
mkdir -p llama_ref llama_res llama_rs
run llama_ref 2 -- train "${common[@]}" "${llama[@]}" --set parallel.strategy=zero3 || fail "llama reference: $(tail -3 llama_ref.log)"
ok=1
launch 2 -- train "${common[@]}" "${llama[@]}" --steps 25 --set parallel.strategy=zero3 --set checkpoint.dir=llama_res/ck \
  --set logging.metrics=llama_res/m.jsonl >llama_res.log 2>&1 || ok=0
cp -r llama_res/ck llama_rs/ck && cp llama_res/m.jsonl llama_rs/m.jsonl
run llama_res 2 -- train "${common[@]}" "${llama[@]}" --set parallel.strategy=zero3 --resume >>llama_res.log 2>&1 || ok=0
"$bin" train "${common[@]}" "${llama[@]}" --resume --set checkpoint.dir=llama_rs/ck --set logging.metrics=llama_rs/m.jsonl \
  --save-weights llama_rs/w.safetensors >llama_rs.log 2>&1 || ok=0
[ $ok = 1 ] && grep -q "(resharded)" llama_rs.log || fail "llama resume runs: $(grep -E 'error|resumed' llama_res.log llama_rs.log | tail -3)"
out=$(cmp_runs llama_res/m.jsonl llama_res/w.safetensors llama_ref/m.jsonl llama_ref/w.safetensors 0) \
  && opt=$(same_optim llama_res llama_ref) && pass "llama: ZeRO-3 stop at 25 + resume = uninterrupted ($out; $opt)" \
  || fail "llama resume: $out ${opt:-}"
out=$(cmp_runs llama_rs/m.jsonl llama_rs/w.safetensors llama_ref/m.jsonl llama_ref/w.safetensors 1e-5) \
  && pass "llama: ZeRO-3 x2 -> DDP x1 resharded: same math ($out)" || fail "llama resharded resume: $out"

# The ViT family on an IDX file (400 random 8 x 8 images, 7 classes; one epoch = 50 steps of
# 8 images): the same stop at 25 + resume under ZeRO-3 (bitwise, optimizer files included) and
# the resharded resume on 1 rank; the ledger shows every image once.
/usr/bin/python3 -c "
import struct, numpy as np
r = np.random.default_rng(11)
open('img-images-idx3-ubyte', 'wb').write(struct.pack('>IIII', 0x803, 400, 8, 8) + r.integers(0, 256, 400 * 64, dtype=np.uint8).tobytes())
open('img-labels-idx1-ubyte', 'wb').write(struct.pack('>II', 0x801, 400) + r.integers(0, 7, 400, dtype=np.uint8).tobytes())"
vit=(--set model.preset= --set model.family=vit --model.n_layer 2 --model.d_model 32 --model.n_head 4
     --set model.image_size=8 --set model.patch_size=4 --set model.n_classes=7 --batch 4 --set training.batch=8
     --steps 50 --set schedule.decay_steps=50 --set optimizer.lr=3e-3 --data img-images-idx3-ubyte
     --set data.format=idx --set logging.progress=lines --set checkpoint.every=5 --set checkpoint.keep_last=0)
mkdir -p vit_ref vit_res vit_rs
run vit_ref 2 -- train "${vit[@]}" --set parallel.strategy=zero3 --set data.ledger=vit_ref/ledger || fail "vit reference: $(tail -3 vit_ref.log)"
ok=1
launch 2 -- train "${vit[@]}" --steps 25 --set parallel.strategy=zero3 --set checkpoint.dir=vit_res/ck \
  --set logging.metrics=vit_res/m.jsonl >vit_res.log 2>&1 || ok=0
cp -r vit_res/ck vit_rs/ck && cp vit_res/m.jsonl vit_rs/m.jsonl
run vit_res 2 -- train "${vit[@]}" --set parallel.strategy=zero3 --resume >>vit_res.log 2>&1 || ok=0
"$bin" train "${vit[@]}" --resume --set checkpoint.dir=vit_rs/ck --set logging.metrics=vit_rs/m.jsonl \
  --save-weights vit_rs/w.safetensors >vit_rs.log 2>&1 || ok=0
[ $ok = 1 ] && grep -q "(resharded)" vit_rs.log || fail "vit resume runs: $(grep -E 'error|resumed' vit_res.log vit_rs.log | tail -3)"
out=$(cmp_runs vit_res/m.jsonl vit_res/w.safetensors vit_ref/m.jsonl vit_ref/w.safetensors 0) \
  && opt=$(same_optim vit_res vit_ref) && pass "vit: ZeRO-3 stop at 25 + resume = uninterrupted ($out; $opt)" \
  || fail "vit resume: $out ${opt:-}"
out=$(cmp_runs vit_rs/m.jsonl vit_rs/w.safetensors vit_ref/m.jsonl vit_ref/w.safetensors 1e-5) \
  && pass "vit: ZeRO-3 x2 -> DDP x1 resharded: same math ($out)" || fail "vit resharded resume: $out"
out=$(ledger vit_ref/ledger 50 400) && pass "vit ledger: $out" || fail "vit ledger: $out"

# 4. The newest checkpoint damaged: skipped, the previous one used, the result unchanged.
cp -r ref_ddp/ck damaged/ck
printf '\x00\x01' | dd of=damaged/ck/step-00000050/model.safetensors bs=1 seek=4000 conv=notrunc 2>/dev/null
"$bin" ckpt verify damaged/ck >verify.out 2>&1; rc=$?
[ $rc = 1 ] && grep -q "DAMAGED .*step-00000050" verify.out && grep -q "newest intact checkpoint: .*step-00000045" verify.out \
  && pass "ckpt verify names the damaged step and the one --resume uses" || fail "ckpt verify (rc $rc): $(cat verify.out)"
launch 2 -- train "${common[@]}" --resume --set checkpoint.dir=damaged/ck --set logging.metrics=damaged/m.jsonl \
  --save-weights damaged/w.safetensors >damaged.log 2>&1 || fail "resume past damage: $(tail -3 damaged.log)"
grep -q "skipping checkpoint .*step-00000050.*checksum" damaged.log && grep -q "resumed from .*step-00000045" damaged.log \
  && cmp -s damaged/w.safetensors ref_ddp/w.safetensors \
  && pass "damaged step 50 skipped (checksum), resumed from 45, same final weights" \
  || fail "damaged checkpoint: $(grep -E 'skipping|resumed|error' damaged.log | head -3)"

# 5. A rank that stops before step 12: the watchdog, the supervisor's report, a restart.
DTRAIN_TEST_HANG=12:1 run hang 2 --max-restarts 1 --backoff 0.1 -- train "${common[@]}" \
  --set fault.collective_timeout=2 || fail "hang run: $(tail -3 hang.log)"
grep -q "job failed after .*: rank 1 on .* hung: held up collective" hang.log && grep -q "watchdog: rank 0 of 2" hang.log \
  && pass "hang: rank 0's watchdog dumped its collectives; the supervisor names rank 1, which never entered" \
  || fail "hang report: $(grep -E 'hang|watchdog' hang.log | head -3)"
out=$(cmp_runs hang/m.jsonl hang/w.safetensors ref_ddp/m.jsonl ref_ddp/w.safetensors 0) \
  && pass "after the hang and restart: bitwise ($out)" || fail "hang/resume: $out"

# 6. Preemption: SIGTERM to the supervisor once step 10 is logged.
"$bin" launch -n 2 --max-restarts 2 --grace 20 -- train "${common[@]}" --steps 4000 --set schedule.decay_steps=4000 \
  --set checkpoint.every=0 --set checkpoint.dir=preempt/ck --set logging.metrics=preempt/m.jsonl >preempt.log 2>&1 &
lp=$!
for _ in $(seq 300); do
  [ -s preempt/m.jsonl ] && [ "$(wc -l <preempt/m.jsonl)" -ge 10 ] && break
  sleep 0.1
done
kill -TERM $lp
wait $lp
rc=$?
stopped=$(sed 's/step-0*//' preempt/ck/latest 2>/dev/null)
[ $rc = 0 ] && grep -q "preempted (signal received): checkpoint written at step" preempt.log && [ -n "$stopped" ] \
  && [ "$stopped" -lt 4000 ] && ! grep -q "restart 1" preempt.log \
  && pass "SIGTERM to launch: checkpoint at step $stopped, exit 0, no restart" \
  || fail "preemption (rc $rc, latest '$stopped'): $(grep -E 'preempt|error' preempt.log | tail -3)"
"$bin" launch -n 2 -- train "${common[@]}" --steps 4000 --set schedule.decay_steps=4000 --set checkpoint.every=0 \
  --set checkpoint.dir=preempt/ck --set logging.metrics=preempt/m.jsonl --resume >>preempt.log 2>&1 \
  && grep -q "resumed from .*step-0*$stopped:" preempt.log && [ "$(cat preempt/ck/latest)" = step-00004000 ] \
  && pass "resumed after the preemption and finished" || fail "resume after preemption: $(tail -3 preempt.log)"

# 7. SIGUSR1 to one rank only (as a spot warning or Slurm --signal to one task would).
mkdir -p usr1
"$bin" launch -n 2 -- train "${common[@]}" --steps 4000 --set schedule.decay_steps=4000 --set checkpoint.every=0 \
  --set checkpoint.dir=usr1/ck --set logging.metrics=usr1/m.jsonl >usr1.log 2>&1 &
lp=$!
for _ in $(seq 300); do
  [ -s usr1/m.jsonl ] && [ "$(wc -l <usr1/m.jsonl)" -ge 10 ] && break
  sleep 0.1
done
pid=$(rank_pids "$bin" usr1/ck | tail -1 | cut -d' ' -f1) # a rank, not mpirun: it would signal all
[ -n "$pid" ] && kill -USR1 "$pid" || fail "SIGUSR1: no rank process found to signal"
wait $lp
rc=$?
[ $rc = 0 ] && grep -q "preempted (signal received): checkpoint written at step" usr1.log \
  && "$bin" ckpt verify usr1/ck >/dev/null 2>&1 && pass "SIGUSR1 to one rank: all ranks checkpointed, exit 0" \
  || fail "SIGUSR1 to one rank (rc $rc): $(grep -E 'preempt|error' usr1.log | tail -3)"

# 8. A full disk: a tmpfs that holds one checkpoint of this model (about 1.45 MB at vocabulary
# 256), not two.
mkdir -p full
if mount -t tmpfs -o size=2500k tmpfs full 2>/dev/null; then
  "$bin" train "${common[@]}" --model.vocab_size 256 --steps 20 --set checkpoint.dir=full/ck --set checkpoint.max_failures=10 \
    --set logging.metrics= >full.log 2>&1
  rc=$?
  [ $rc = 1 ] && grep -q "step-00000010/.*No space left on device" full.log && grep -q "training goes on" full.log \
    && grep -q "the final checkpoint could not be written" full.log && [ "$(ls full/ck)" = "$(printf 'latest\nstep-00000005')" ] \
    && "$bin" ckpt verify full/ck >/dev/null 2>&1 \
    && pass "full disk: ENOSPC named, training went on, step 5 intact, failed final save fails the run" \
    || fail "full disk (rc $rc): $(grep -E 'error|warning' full.log | head -3); ls: $(ls full/ck)"
  umount full
else
  skip_case "full-disk case (cannot mount a tmpfs here)"
fi

# 9. logging.trace of a training run with asynchronous checkpoints: one well-nested timeline
#    per rank and thread, the checkpoint stage/commit on the main thread, the write on its own.
mkdir -p trace
"$bin" launch -n 2 -- train "${common[@]}" --steps 6 --set checkpoint.every=2 --set checkpoint.dir=trace/ck \
  --set logging.metrics= --set logging.trace=trace/t.json >trace.log 2>&1 || fail "traced run: $(tail -2 trace.log)"
out=$(/usr/bin/python3 "$src/tests/check_bench.py" trace trace/t.json 2 1 2>&1) && /usr/bin/python3 - trace/t.json <<'PY' \
  && pass "logging.trace: $out, checkpoint events on main and writer threads" || fail "trace: $out"
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("cat") == "ckpt"]
assert any(e["name"].startswith("checkpoint stage") and e["tid"] == 0 for e in ev), "no stage event"
assert any(e["name"].startswith("checkpoint write") and e["tid"] == 2 for e in ev), "no write event on tid 2"
PY

# 10. Checkpoint schedule and pruning on 1 rank: every 2 steps with keep_last 2 leaves exactly
#     the two newest; every_minutes (30 ms, steps slowed to 50 ms) saves without checkpoint.every.
mkdir -p sched
"$bin" train "${common[@]}" --steps 10 --set checkpoint.every=2 --set checkpoint.keep_last=2 \
  --set checkpoint.dir=sched/keep --set logging.metrics= >sched.log 2>&1 || fail "keep_last run: $(tail -2 sched.log)"
[ "$(ls sched/keep | tr '\n' ' ')" = "latest step-00000008 step-00000010 " ] && [ "$(cat sched/keep/latest)" = step-00000010 ] \
  && pass "checkpoint.keep_last=2 keeps steps 8 and 10" || fail "keep_last: $(ls sched/keep | tr '\n' ' ')"
DTRAIN_TEST_STEP_DELAY_MS=50 "$bin" train "${common[@]}" --steps 10 --set checkpoint.every=0 \
  --set checkpoint.every_minutes=0.0005 --set checkpoint.keep_last=0 --set checkpoint.dir=sched/min \
  --set logging.metrics= >>sched.log 2>&1 || fail "every_minutes run: $(tail -2 sched.log)"
n=$(ls -d sched/min/step-* 2>/dev/null | wc -l)
[ "$n" -ge 4 ] && pass "checkpoint.every_minutes: $n checkpoints in 10 slowed steps" || fail "every_minutes: $n checkpoints"
out=$("$bin" ckpt info sched/keep 2>&1)
[[ $out == *"step         10"* && $out == *"data cursor  80 samples"* && $out == *"optim-rank0-of-1.safetensors"* ]] \
  && pass "ckpt info: step, data cursor, files" || fail "ckpt info: $out"

# 11. Mistakes get one line and the right status: --resume without checkpoint.dir (2), a bad
#     --max-restarts (2), --resume of a directory without checkpoints (1), and a job that
#     fails every time makes the supervisor give up after K restarts with the job's status.
err=$("$bin" train "${common[@]}" --resume 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && [ "$(echo "$err" | wc -l)" = 1 ] && [[ $err == *"needs checkpoint.dir"* ]] \
  && pass "--resume without checkpoint.dir: exit 2, one line" || fail "--resume without dir: rc $rc '$err'"
err=$("$bin" launch -n 2 --max-restarts x -- train 2>&1 >/dev/null); rc=$?
[ $rc = 2 ] && [[ $err == *"--max-restarts expects a non-negative integer"* ]] \
  && pass "--max-restarts x: exit 2 naming the flag" || fail "--max-restarts x: rc $rc '$err'"
mkdir -p empty
err=$("$bin" train "${common[@]}" --resume empty 2>&1 >/dev/null); rc=$?
[ $rc = 1 ] && [[ $err == *"empty: no checkpoint"* ]] && pass "--resume of an empty directory: exit 1 naming it" \
  || fail "--resume empty: rc $rc '$err'"
"$bin" launch -n 2 --max-restarts 2 --backoff 0 -- train "${common[@]}" --data missing.bin \
  --set checkpoint.dir=giveup/ck >giveup.log 2>&1; rc=$?
[ $rc -ne 0 ] && [ "$(grep -c 'job failed after' giveup.log)" = 3 ] && grep -q "giving up: 2 restart(s) allowed" giveup.log \
  && grep -q "missing.bin" giveup.log && pass "a job failing every time: 3 attempts, then the supervisor gives up (rc $rc)" \
  || fail "give up: rc $rc, $(grep 'dtrain launch' giveup.log | tail -2)"

# 12. The supervisor does not retry what cannot succeed: a misspelt key exits 2 on every rank,
#     and the job ends after the first attempt with that status and the one error line.
start=$(date +%s)
"$bin" launch -n 2 --max-restarts 10 --backoff 0.5 -- train "${common[@]}" --set trainng.steps=5 >cfgerr.log 2>&1; rc=$?
took=$(( $(date +%s) - start ))
[ $rc = 2 ] && [ "$(grep -c 'job failed after' cfgerr.log)" = 1 ] && grep -q "unknown key 'trainng.steps'" cfgerr.log \
  && grep -q "usage or configuration error .*not restarting" cfgerr.log && [ $took -lt 30 ] \
  && pass "a configuration error under --max-restarts 10: one attempt, status 2, ${took}s" \
  || fail "config error under the supervisor: rc $rc, ${took}s, $(grep -c 'job failed after' cfgerr.log) attempt(s)"
# 13. A supervised run without checkpoint.dir: rank 1 hangs before step 6 in the first attempt
#     (the watchdog ends it), the restart trains again from step 0, says so, and finishes.
DTRAIN_TEST_HANG=6:1 "$bin" launch -n 2 --max-restarts 2 --backoff 0.1 -- train "${common[@]}" --steps 10 \
  --set schedule.decay_steps=10 --set fault.collective_timeout=2 --set logging.metrics=nockpt.jsonl >nockpt.log 2>&1; rc=$?
[ $rc = 0 ] && grep -q "job finished after 1 restart(s)" nockpt.log \
  && grep -q "restart 1: no checkpoint.dir, nothing to resume: training again from step 0" nockpt.log \
  && grep -q "a restart after a failure trains again from step 0" nockpt.log && [ "$(last_step nockpt.jsonl)" = 10 ] \
  && pass "restart without checkpoint.dir: trained again from step 0 and finished" \
  || fail "restart without checkpoint.dir: rc $rc, $(grep -E 'dtrain launch|error|warning' nockpt.log | tail -3)"

# 14. Readers of a checkpoint directory load only verified steps and say which: the newest
#     step's weights are damaged (same size, checksum wrong); sample, eval, export and
#     model.init_from skip it and load step 5, naming it.
small=(--steps 6 --set schedule.decay_steps=6 --set checkpoint.every=1 --set logging.metrics=)
"$bin" train "${common[@]}" "${small[@]}" --set checkpoint.dir=readers/ck >readers.log 2>&1 \
  || fail "readers: training run: $(tail -2 readers.log)"
printf '\xff\xff\xff\x7f%.0s' $(seq 64) | dd of=readers/ck/step-00000006/model.safetensors bs=1 seek=4096 conv=notrunc status=none
want="loading readers/ck/step-00000005 (checksums verified)"
"$bin" sample readers/ck --prompt "a" --max-tokens 4 >readers_sample.out 2>readers_sample.err; rc=$?
[ $rc = 0 ] && grep -qF "$want" readers_sample.err && grep -q "skipping checkpoint readers/ck/step-00000006" readers_sample.err \
  && pass "sample of a directory whose newest step is damaged: loads step 5, says so" \
  || fail "sample (rc $rc): $(cat readers_sample.err | head -3)"
"$bin" eval readers/ck --data.val tok.bin --set data.format=raw16 >readers_eval.log 2>&1; rc=$?
[ $rc = 0 ] && grep -qF "$want" readers_eval.log && pass "eval: loads the verified step 5" \
  || fail "eval (rc $rc): $(grep -E 'loading|error' readers_eval.log | head -3)"
"$bin" ckpt export --hf readers/ck readers/hf >readers_export.log 2>&1; rc=$?
[ $rc = 0 ] && grep -qF "$want" readers_export.log && pass "ckpt export --hf: exports the verified step 5" \
  || fail "export (rc $rc): $(grep -E 'loading|error' readers_export.log | head -3)"
"$bin" train "${common[@]}" --steps 1 --set logging.metrics= --set model.init_from=readers/ck >readers_init.log 2>&1; rc=$?
[ $rc = 0 ] && grep -qF "$want" readers_init.log && pass "model.init_from: starts from the verified step 5" \
  || fail "init_from (rc $rc): $(grep -E 'loading|error' readers_init.log | head -3)"

# 15. A rollback stays rolled back: resuming from step 4 with --steps 5 moves `latest` to the
#     new step 5; the abandoned step 6 is ignored by --resume, ckpt info and the readers.
"$bin" train "${common[@]}" "${small[@]}" --set checkpoint.dir=rollback/ck >rollback.log 2>&1 \
  || fail "rollback: first run: $(tail -2 rollback.log)"
"$bin" train "${common[@]}" "${small[@]}" --steps 5 --set checkpoint.dir=rollback/ck \
  --resume rollback/ck/step-00000004 >>rollback.log 2>&1 || fail "rollback: run from step 4: $(tail -2 rollback.log)"
info=$("$bin" ckpt info rollback/ck 2>&1)
verify=$("$bin" ckpt verify rollback/ck 2>&1)
"$bin" train "${common[@]}" "${small[@]}" --steps 7 --set checkpoint.dir=rollback/ck --resume >rollback2.log 2>&1; rc=$?
[ $rc = 0 ] && grep -q "resumed from rollback/ck/step-00000005" rollback2.log \
  && grep -q "ignoring rollback/ck/step-00000006: newer than latest" rollback2.log \
  && [[ $info == *"checkpoint   rollback/ck/step-00000005 "* ]] \
  && [[ $verify == *"step-00000006 (ignored: newer than latest"* && $verify == *"newest intact checkpoint: rollback/ck/step-00000005 "* ]] \
  && pass "rollback to step 4: the next --resume loads the new step 5, not the abandoned step 6" \
  || fail "rollback (rc $rc): $(grep -E 'resumed|ignoring|error' rollback2.log | head -3)"

# 16. Ctrl-C on a single-process run: the first SIGINT checkpoints and exits cleanly (0), a
#     second one stops at once (130). The runs are slowed (50 and 500 ms/step) so the signals
#     land mid-run.
sigint_run() { # NAME DELAY_MS: starts the run in the background; sets spid
  DTRAIN_TEST_STEP_DELAY_MS=$2 "$bin" train "${common[@]}" --steps 4000 --set schedule.decay_steps=4000 \
    --set checkpoint.every=0 --set checkpoint.dir="$1/ck" --set logging.metrics="$1/m.jsonl" >"$1.log" 2>&1 &
  spid=$!
  for _ in $(seq 300); do [ "$(last_step "$1/m.jsonl")" -ge 3 ] && break; sleep 0.1; done
}
mkdir -p int1 int2
sigint_run int1 50; kill -INT $spid; wait $spid; rc=$?
[ $rc = 0 ] && grep -q "interrupt: checkpointing at the next step boundary" int1.log \
  && grep -q "preempted (signal received): checkpoint written at step" int1.log && [ -s int1/ck/latest ] \
  && pass "Ctrl-C: checkpoint at step $(sed 's/step-0*//' int1/ck/latest), exit 0" \
  || fail "one SIGINT (rc $rc): $(grep -E 'interrupt|preempt|error' int1.log | tail -3)"
# The second SIGINT once the first is taken (its message is out), well inside the 500 ms step.
sigint_run int2 500; kill -INT $spid
for _ in $(seq 100); do grep -q "interrupt: checkpointing" int2.log && break; sleep 0.01; done
kill -INT $spid; wait $spid; rc=$?
[ $rc = 130 ] && grep -q "second interrupt: stopping now" int2.log \
  && pass "Ctrl-C twice: stops at once (130)" || fail "two SIGINTs (rc $rc): $(tail -2 int2.log)"

# 18. A plain `dtrain launch` (no supervisor) preempted with SIGTERM: the ranks checkpoint and
#     stop, the job ends with status 0 and says so (not "mpirun exited with status 1").
mkdir -p plainpre
DTRAIN_TEST_STEP_DELAY_MS=50 "$bin" launch -n 2 -- train "${common[@]}" --steps 4000 --set schedule.decay_steps=4000 \
  --set checkpoint.every=0 --set checkpoint.dir=plainpre/ck --set logging.metrics=plainpre/m.jsonl >plainpre.log 2>&1 &
lp=$!
for _ in $(seq 300); do [ "$(last_step plainpre/m.jsonl)" -ge 5 ] && break; sleep 0.1; done
kill -TERM $lp; wait $lp; rc=$?
[ $rc = 0 ] && grep -q "preempted (signal received): checkpoint written at step" plainpre.log \
  && grep -q "preempted by a signal: the ranks were asked to checkpoint" plainpre.log \
  && ! grep -q "mpirun exited with status" plainpre.log && [ -s plainpre/ck/latest ] \
  && pass "plain launch + SIGTERM: checkpoint at $(cat plainpre/ck/latest), exit 0" \
  || fail "plain launch preemption (rc $rc): $(grep -E 'preempt|exited|error' plainpre.log | tail -3)"

# 17. The log of a launched run written to a file holds plain lines: Open MPI gives the ranks a
#     pseudo-terminal, the launcher tells them its output is not one (DTRAIN_LAUNCH_TTY).
"$bin" launch -n 2 -- train "${common[@]}" --steps 5 --set logging.progress=auto --set checkpoint.dir= \
  --set logging.metrics= >plainlog.log 2>&1; rc=$?
[ $rc = 0 ] && grep -q "step 5/5" plainlog.log && ! grep -q $'\r' plainlog.log && ! grep -q $'\e' plainlog.log \
  && pass "launched run into a file: plain lines, no carriage returns or escape sequences" \
  || fail "launch log (rc $rc): $(grep -c $'\r' plainlog.log) CR, $(grep -c $'\e' plainlog.log) ESC"

echo "test_resume: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
