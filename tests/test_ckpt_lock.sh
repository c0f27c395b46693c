#!/usr/bin/env bash
# The lock on checkpoint.dir (issue 37, src/ckpt/lock.h), end to end:
#  1. a second `dtrain train` on the checkpoint.dir of a running one exits 2 in < 1 s with one
#     line naming the first's pid and host; so does a 2-rank one (one error line); `ckpt merge`
#     and `ckpt export` into it are refused and write nothing; the readers (ckpt verify, ckpt
#     info, eval, sample, export from it) work meanwhile; the first run then finishes with
#     its checkpoints intact and the lock file gone;
#  2. stale locks: the lock of a train killed with kill -9 is taken over with a warning naming
#     its pid, and so is a lock file naming another host that nobody holds;
#  3. the supervisor (`dtrain launch --max-restarts`) holds the lock across a restart: its
#     ranks accept it, a second train and a second supervisor on the directory are refused
#     naming the supervisor's pid, and the job finishes after the restart.
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
fresh_dir "$dir"
mpi_env
host=$(hostname)
raw16_tokens tok.bin
common=(--set model.preset=gpt2-tiny --seq 32 --batch 2 --lr 1e-3 --seed 5 --set logging.progress=lines
        --set checkpoint.every=5)
# wait_for CMD...: until CMD succeeds, at most 120 s (the host may be busy: no timing here).
wait_for() { for _ in $(seq 1200); do "$@" && return 0; sleep 0.1; done; return 1; }
lock_field() { sed -n "s/^$2: //p" "$1/.lock" 2>/dev/null; } # DIR KEY
lock_names() { [ "$(lock_field "$1" pid)" = "$2" ]; }         # DIR PID
has_latest() { [ -s "$1/latest" ]; }
now() { date +%s.%N; }
# one_error FILE PATTERN: FILE holds exactly one error line, and it matches PATTERN.
one_error() { [ "$(grep -c 'error:' "$1")" -eq 1 ] && grep 'error:' "$1" | grep -qE -- "$2"; }

# ---- 1. a second run on a running run's directory
DTRAIN_TEST_STEP_DELAY_MS=100 "$bin" train "${common[@]}" --steps 60 --set checkpoint.dir=ck \
  --set checkpoint.keep_last=3 >first.log 2>&1 &
first=$!
if ! wait_for lock_names ck $first || ! wait_for has_latest ck; then
  fail "the first run did not lock ck and save a checkpoint: $(tail -3 first.log)"
  kill $first 2>/dev/null
  wait $first
  echo "test_ckpt_lock: $fails failure(s)"
  exit 1
fi
t0=$(now)
"$bin" train "${common[@]}" --steps 60 --set checkpoint.dir=ck >second.out 2>second.err
rc=$?
t1=$(now)
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
alive=no
kill -0 $first 2>/dev/null && alive=yes
if [ $rc -eq 2 ] && awk -v s="$secs" 'BEGIN { exit !(s < 1) }' && [ $alive = yes ] &&
   one_error second.err "checkpoint.dir ck is in use by dtrain train pid $first on host $host \(started [0-9T:+-]+\): two runs must not share a checkpoint directory"; then
  pass "second train on a running run's checkpoint.dir: exit 2 in $secs s: $(cat second.err)"
else
  fail "second train: rc $rc in $secs s, first alive: $alive, stderr: $(cat second.err)"
fi
[ ! -s second.out ] && pass "the refused run printed nothing on stdout" || fail "refused run's stdout: $(head -3 second.out)"

# The first run stopped (SIGSTOP: it keeps its lock, saves and prunes nothing meanwhile).
kill -STOP $first
"$bin" launch -n 2 -- train "${common[@]}" --steps 60 --set checkpoint.dir=ck >mpi2.log 2>&1
rc=$?
# (then the launcher's own "mpirun exited with status 2")
[ $rc -eq 2 ] && [ "$(grep -c 'is in use by' mpi2.log)" -eq 1 ] &&
  grep -q "checkpoint.dir ck is in use by dtrain train pid $first on host $host" mpi2.log \
  && pass "2 ranks on it: exit 2, the refusal printed once: $(grep 'is in use by' mpi2.log | cut -c1-90)..." \
  || fail "2 ranks on a locked dir: rc $rc, $(grep -E 'error' mpi2.log | head -3)"
# Writers into it: refused before reading their source, nothing written.
"$bin" ckpt merge ck ck >merge.log 2>&1
rc=$?
[ $rc -eq 2 ] && one_error merge.log "dtrain ckpt merge: ck is in use by dtrain train pid $first on host $host" \
  && pass "ckpt merge into it: exit 2: $(grep 'error:' merge.log)" || fail "ckpt merge into ck: rc $rc, $(cat merge.log)"
"$bin" ckpt export --hf ck ck >export_in.log 2>&1
rc=$?
[ $rc -eq 2 ] && one_error export_in.log "dtrain ckpt export: ck is in use by dtrain train pid $first" \
  && pass "ckpt export into it: exit 2" || fail "ckpt export into ck: rc $rc, $(cat export_in.log)"
[ ! -e ck/model.safetensors ] && [ ! -e ck/config.json ] && pass "the refused merge and export wrote nothing into ck" \
  || fail "refused writers left files in ck: $(ls ck)"
# Readers need no lock.
out=$("$bin" ckpt verify ck 2>&1) && grep -q "^newest intact checkpoint: ck/step-" <<<"$out" \
  && pass "ckpt verify while locked: $(tail -1 <<<"$out" | cut -c1-60)" || fail "ckpt verify while locked: $out"
out=$("$bin" ckpt info ck 2>&1) && pass "ckpt info while locked" || fail "ckpt info while locked: $out"
out=$("$bin" eval ck --data.val tok.bin --set data.format=raw16 --seq 32 --batch 2 --set training.eval_batches=2 2>&1) \
  && grep -qi "loss" <<<"$out" && pass "eval while locked: $(tail -1 <<<"$out" | tr -s " ")" || fail "eval while locked: $out"
out=$("$bin" sample ck --prompt "ab" --max-tokens 4 2>&1) && pass "sample while locked" || fail "sample while locked: $out"
out=$("$bin" ckpt export --hf ck hf 2>&1) && [ -s hf/model.safetensors ] && pass "ckpt export from it while locked" \
  || fail "export from a locked dir: $out"
lock_names ck $first && pass "the readers left the lock alone (.lock still names pid $first)" \
  || fail "after the readers .lock says: $(cat ck/.lock 2>&1)"
kill -CONT $first
wait $first
rc=$?
steps=$(cd ck && ls -d step-* | tr '\n' ' ')
if [ $rc -eq 0 ] && [ "$(cat ck/latest)" = step-00000060 ] && [ "$steps" = "step-00000050 step-00000055 step-00000060 " ] &&
   "$bin" ckpt verify ck >verify.log 2>&1 && [ ! -e ck/.lock ]; then
  pass "the first run finished: exit 0, $steps(keep_last 3) verified, .lock removed"
else
  fail "first run: rc $rc, steps '$steps', latest $(cat ck/latest), lock: $(ls -a ck | grep -c '^\.lock$'), $(tail -2 first.log)"
fi

# ---- 2. stale locks
DTRAIN_TEST_STEP_DELAY_MS=100 "$bin" train "${common[@]}" --steps 40 --set checkpoint.dir=killed >killed1.log 2>&1 &
victim=$!
if wait_for lock_names killed $victim; then
  started=$(lock_field killed started)
  kill -9 $victim
  wait $victim 2>/dev/null
  "$bin" train "${common[@]}" --steps 5 --set checkpoint.dir=killed >killed2.log 2>&1
  rc=$?
  pat="warning: checkpoint.dir killed: taking over the stale lock of dtrain train pid $victim on host $host (started $started): that process is no longer running"
  [ $rc -eq 0 ] && grep -qF -- "$pat" killed2.log && [ ! -e killed/.lock ] && "$bin" ckpt verify killed >/dev/null 2>&1 \
    && pass "the lock of a train killed with -9 taken over: $(grep 'stale lock' killed2.log)" \
    || fail "stale lock after kill -9: rc $rc, $(grep -E 'warning|error' killed2.log)"
else
  fail "the run to kill did not lock: $(tail -2 killed1.log)"
  kill $victim 2>/dev/null
fi
mkdir -p elsewhere
printf 'dtrain-lock 1\nhost: %s\npid: %s\nstarted: %s\ncommand: %s\ntoken: %s\n' other-host 4242 \
  2026-01-02T03:04:05+0000 "dtrain train" 0123456789abcdef >elsewhere/.lock
"$bin" train "${common[@]}" --steps 5 --set checkpoint.dir=elsewhere >elsewhere.log 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "taking over the stale lock of dtrain train pid 4242 on host other-host (started 2026-01-02T03:04:05+0000): its process ended without releasing it, or its host lost the lock" elsewhere.log \
  && pass "an unheld lock file naming another host taken over with a warning" \
  || fail "unheld lock of another host: rc $rc, $(grep -E 'warning|error' elsewhere.log)"

# ---- 3. the supervisor holds the lock across a restart (rank 0 killed at its 20th
#         checkpoint I/O point, in the first attempt only)
DTRAIN_TEST_STEP_DELAY_MS=50 DTRAIN_CKPT_FAULT=crash@20:0 "$bin" launch -n 2 --max-restarts 2 --backoff 1 -- \
  train "${common[@]}" --steps 40 --set checkpoint.dir=sv >sv.log 2>&1 &
lp=$!
if wait_for lock_names sv $lp; then
  [ "$(lock_field sv command)" = "dtrain launch (supervisor)" ] && pass "the supervisor (pid $lp) holds sv/.lock" \
    || fail "sv/.lock: $(cat sv/.lock)"
  if wait_for grep -q "restart 1 of 2" sv.log; then
    "$bin" train "${common[@]}" --steps 40 --set checkpoint.dir=sv >sv_second.log 2>&1
    rc=$?
    [ $rc -eq 2 ] && one_error sv_second.log "checkpoint.dir sv is in use by dtrain launch \(supervisor\) pid $lp on host $host" \
      && pass "during the restart a second train is refused naming the supervisor" \
      || fail "second train during the restart: rc $rc, $(cat sv_second.log)"
    "$bin" launch -n 1 --max-restarts 1 -- train "${common[@]}" --steps 40 --set checkpoint.dir=sv >sv_second2.log 2>&1
    rc=$?
    [ $rc -eq 2 ] && one_error sv_second2.log "checkpoint.dir sv is in use by dtrain launch \(supervisor\) pid $lp" \
      && ! grep -q "mpirun" sv_second2.log && pass "a second supervisor is refused before it starts mpirun" \
      || fail "second supervisor: rc $rc, $(cat sv_second2.log)"
  else
    fail "no restart: $(grep 'dtrain launch' sv.log | tail -3)"
  fi
else
  fail "the supervisor did not lock sv: $(tail -3 sv.log)"
fi
wait $lp
rc=$?
n=$(grep -c "checkpoint.dir sv: locked by this run's supervisor, dtrain launch (supervisor) pid $lp on host $host" sv.log)
[ $rc -eq 0 ] && grep -q "job finished after 1 restart" sv.log && [ "$n" -eq 2 ] && [ "$(cat sv/latest)" = step-00000040 ] &&
  "$bin" ckpt verify sv >/dev/null 2>&1 && [ ! -e sv/.lock ] \
  && pass "supervised run: rank 0 of both attempts accepted the supervisor's lock, finished after 1 restart, .lock removed" \
  || fail "supervised run: rc $rc, $n acceptances, $(grep 'dtrain launch' sv.log | tail -3)"

echo "test_ckpt_lock: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
