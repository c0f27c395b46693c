#!/usr/bin/env bash
# Naming the rank that hangs (issue 17), end to end under `dtrain launch --max-restarts`:
#  - SIGSTOP of each rank in turn (2 ranks; 4 ranks on 2 simulated nodes): the supervisor's
#    failure line names the stopped rank - not the rank whose watchdog fired - with its host,
#    pid and state "stopped", within fault.collective_timeout + 2 s of the stop; the restarted
#    run finishes bitwise equal to an uninterrupted one (losses, weights);
#  - a rank slowed but alive (SIGSTOP/SIGCONT cycles shorter than the timeout) is not killed;
#  - a host that hangs twice is reported so;
#  - fault.collective_timeout auto: the chosen value is logged and in the metrics, and a
#    stopped rank is named within 30 s;
#  - under tensor parallelism (tp 2 x dp 2 on 2 simulated nodes) a stopped rank inside a TP
#    group is named alike (and a rank killed with SIGKILL), and the run resumes from its
#    tensor-parallel checkpoint bitwise;
#  - the log of a launched run holds no terminal control sequences.
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
fresh_dir "$dir"
mpi_env
now_ms() { date +%s%3N; }
host=$(hostname)

common=(--set model.preset=gpt2-tiny --seq 32 --batch 2 --set training.batch=8 --steps 400 --lr 1e-3
        --seed 5 --set logging.progress=lines --set checkpoint.every=25 --set checkpoint.keep_last=2
        --set logging.every=1)
# Slow the steps a little (1 ms of sleep per step) so a stop lands inside the run.
export DTRAIN_TEST_STEP_DELAY_MS=10

# The reference: uninterrupted, 2 and 4 ranks.
for n in 2 4; do
  mkdir -p ref$n
  "$bin" launch -n $n -- train "${common[@]}" --set checkpoint.dir=ref$n/ck --set logging.metrics=ref$n/m.jsonl \
    --save-weights ref$n/w.st >ref$n.log 2>&1 || fail "reference $n ranks: $(tail -3 ref$n.log)"
done

# stop_rank NAME N VICTIM TIMEOUT [launch args]: a supervised run; when the victim's record
# shows step progress, SIGSTOP it; check the report and the result. extra: more train flags
# (then ref names the reference directory).
extra=()
stop_rank() {
  local name=$1 n=$2 victim=$3 to=$4 refdir=${ref:-ref$2}
  shift 4
  mkdir -p $name
  "$bin" launch -n $n "$@" --max-restarts 2 --backoff 0.1 --run-dir $name/run -- train "${common[@]}" "${extra[@]}" \
    --set checkpoint.dir=$name/ck --set logging.metrics=$name/m.jsonl --set fault.collective_timeout=$to \
    --save-weights $name/w.st >$name.log 2>&1 &
  local lpid=$! pid="" t_stop=0
  # Wait for the victim's record (its pid) and for training to be well under way.
  for _ in $(seq 1 300); do
    pid=$(/usr/bin/python3 -c "
import struct,sys
try: d=open('$name/run/rank$victim.rec','rb').read()
except OSError: sys.exit(1)
print(struct.unpack_from('<i', d, 16)[0] if d[:8]==b'DTRANK01' else '')" 2>/dev/null)
    [ -n "$pid" ] && grep -q "step 60/" $name.log && break
    sleep 0.1
  done
  if [ -z "$pid" ]; then fail "$name: no record of rank $victim"; kill $lpid 2>/dev/null; wait $lpid; return; fi
  kill -STOP "$pid" && t_stop=$(now_ms)
  wait $lpid
  local rc=$? line t_line
  line=$(grep -m1 "job failed after" $name.log)
  t_line=$(grep -m1 "job failed after" $name.log | sed -E 's/.*\[([0-9:.]+)\].*/\1/')
  local ms=$(( $(date -d "$(date +%F) $t_line" +%s%3N) - t_stop ))
  if [ $rc -eq 0 ] && [[ $line == *"rank $victim on $host (pid $pid, stopped) hung"* ]] \
     && [ $ms -le $(( (to + 2) * 1000 )) ] && grep -q "job finished after 1 restart" $name.log; then
    pass "$name: stopped rank $victim named with host, pid and state $ms ms after the stop (timeout $to s)"
  else
    fail "$name (rc $rc, $ms ms): ${line:-no failure line} $(grep -E 'error|giving up' $name.log | head -2)"
  fi
  out=$(cmp_runs $name/m.jsonl $name/w.st $refdir/m.jsonl $refdir/w.st 0) && pass "$name: bitwise after the restart ($out)" \
    || fail "$name: result differs: $out"
}
stop_rank stop2_r1 2 1 3
stop_rank stop2_r0 2 0 3
for v in 0 1 2 3; do stop_rank stop4_r$v 4 $v 3 --simulate-nodes 2; done

# Tensor parallelism (tp 2 x dp 2 on 2 simulated nodes): a stopped rank inside a TP group is
# named (its TP peer waits in a TP collective, the other group in the gradient all-reduce), and
# the restarted run resumes from its tensor-parallel checkpoint to the uninterrupted run's bits.
extra=(--set parallel.tp=2)
mkdir -p reftp
"$bin" launch -n 4 --simulate-nodes 2 -- train "${common[@]}" "${extra[@]}" --set checkpoint.dir=reftp/ck \
  --set logging.metrics=reftp/m.jsonl --save-weights reftp/w.st >reftp.log 2>&1 || fail "reference tp 2 x dp 2: $(tail -3 reftp.log)"
ref=reftp stop_rank stoptp_r1 4 1 3 --simulate-nodes 2
ref=reftp stop_rank stoptp_r2 4 2 3 --simulate-nodes 2
# kill -9 of a rank inside a TP group: the supervisor names it, restarts, and the run resumes bitwise.
mkdir -p killtp
"$bin" launch -n 4 --simulate-nodes 2 --max-restarts 2 --backoff 0.1 --run-dir killtp/run -- train "${common[@]}" \
  "${extra[@]}" --set checkpoint.dir=killtp/ck --set logging.metrics=killtp/m.jsonl --save-weights killtp/w.st \
  >killtp.log 2>&1 &
lpid=$! kpid=""
for _ in $(seq 1 300); do
  kpid=$(/usr/bin/python3 -c "
import struct,sys
try: d=open('killtp/run/rank3.rec','rb').read()
except OSError: sys.exit(1)
print(struct.unpack_from('<i', d, 16)[0] if d[:8]==b'DTRANK01' else '')" 2>/dev/null)
  [ -n "$kpid" ] && grep -q "step 60/" killtp.log && break
  sleep 0.1
done
[ -n "$kpid" ] && kill -KILL "$kpid"
wait $lpid
rc=$?
if [ -n "$kpid" ] && [ $rc -eq 0 ] && grep -q "rank 3 killed by signal 9" killtp.log && grep -q "job finished after 1 restart" killtp.log; then
  pass "tp 2 x dp 2: rank 3 killed inside its TP group: named, restarted ($(grep -m1 'rank 3 killed' killtp.log | sed 's/.*\] //' | cut -c1-80))"
else fail "tp kill (rc $rc, pid ${kpid:-none}): $(grep -E 'error|failed|giving up' killtp.log | head -3)"; fi
out=$(cmp_runs killtp/m.jsonl killtp/w.st reftp/m.jsonl reftp/w.st 0) && pass "tp 2 x dp 2 after a killed rank: bitwise ($out)" ||
  fail "tp kill: result differs: $out"
extra=()

# A rank slowed but alive: 5 cycles of 1 s stopped, 0.5 s running, under a 3 s timeout.
mkdir -p slow
"$bin" launch -n 2 --max-restarts 2 --backoff 0.1 --run-dir slow/run -- train "${common[@]}" --steps 300 \
  --set checkpoint.dir=slow/ck --set fault.collective_timeout=3 >slow.log 2>&1 &
lpid=$!
for _ in $(seq 1 300); do grep -q "step 30/" slow.log && break; sleep 0.1; done
pid=$(/usr/bin/python3 -c "import struct; print(struct.unpack_from('<i', open('slow/run/rank1.rec','rb').read(), 16)[0])")
cycles=0
for _ in 1 2 3 4 5; do kill -STOP $pid && sleep 1 && kill -CONT $pid && cycles=$((cycles + 1)) && sleep 0.5; done
wait $lpid
rc=$?
if [ $rc -eq 0 ] && [ $cycles -eq 5 ] && ! grep -q "job failed" slow.log; then
  pass "a rank stopped 5 x 1 s under a 3 s timeout is slow, not hung: no restart"
else
  fail "slow rank (rc $rc, $cycles cycles): $(grep -E 'job failed|watchdog' slow.log | head -2)"
fi

# The same host hanging twice: reported (the restarts count against it).
mkdir -p twice
"$bin" launch -n 2 --max-restarts 3 --backoff 0.1 --run-dir twice/run -- train "${common[@]}" \
  --set checkpoint.dir=twice/ck --set fault.collective_timeout=2 >twice.log 2>&1 &
lpid=$!
for round in 1 2; do
  for _ in $(seq 1 300); do [ "$(grep -c 'step 60/' twice.log)" -ge $round ] && break; sleep 0.1; done
  pid=$(/usr/bin/python3 -c "import struct; print(struct.unpack_from('<i', open('twice/run/rank1.rec','rb').read(), 16)[0])")
  kill -STOP $pid
  for _ in $(seq 1 100); do [ "$(grep -c 'job failed' twice.log)" -ge $round ] && break; sleep 0.1; done
done
wait $lpid
grep -q "host $host has hung 2 times in this job" twice.log \
  && pass "a host that hangs twice is reported: $(grep -o "host $host has hung 2 times[^)]*)" twice.log | head -1)" \
  || fail "host hung twice: $(grep -E 'job failed|host' twice.log | head -3)"

# fault.collective_timeout auto (the default): warm-up bound, then 25 s floor here; the value
# is logged and in the metrics; a stopped rank is named within 30 s of the stop.
mkdir -p auto
"$bin" launch -n 2 --max-restarts 1 --backoff 0.1 --run-dir auto/run -- train "${common[@]}" --steps 2000 \
  --set checkpoint.dir=auto/ck --set logging.metrics=auto/m.jsonl >auto.log 2>&1 &
lpid=$!
for _ in $(seq 1 300); do grep -q "step 60/" auto.log && break; sleep 0.1; done
pid=$(/usr/bin/python3 -c "import struct; print(struct.unpack_from('<i', open('auto/run/rank1.rec','rb').read(), 16)[0])")
kill -STOP $pid && t_stop=$(now_ms)
for _ in $(seq 1 400); do grep -q "job failed" auto.log && break; sleep 0.1; done
t_line=$(grep -m1 "job failed after" auto.log | sed -E 's/.*\[([0-9:.]+)\].*/\1/')
ms=$(( $(date -d "$(date +%F) ${t_line:-00:00:00}" +%s%3N) - t_stop ))
kill -TERM $lpid 2>/dev/null; kill -CONT $pid 2>/dev/null; wait $lpid
if grep -q "fault.collective_timeout auto: 25.0 s from step 10" auto.log \
   && grep -q '"type":"watchdog","step":10,"collective_timeout_s":25.000' auto/m.jsonl \
   && grep -q "rank 1 on $host (pid $pid, stopped) hung" auto.log && [ $ms -le 30000 ]; then
  pass "auto timeout: 25 s chosen at step 10 (logged, in the metrics); the stopped rank named $ms ms after the stop"
else
  fail "auto timeout ($ms ms): $(grep -E 'auto|job failed' auto.log | head -3)"
fi

# Launched runs write plain lines to their log files.
if ! grep -q $'\r\|\x1b' ref2.log stop2_r1.log; then
  pass "launched runs' logs hold no carriage returns or escape sequences"
else
  fail "control sequences in a launched run's log"
fi

echo "test_hang: $fails failure(s)"
[ $fails -eq 0 ]
