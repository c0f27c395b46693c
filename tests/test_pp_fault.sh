#!/usr/bin/env bash
# Faults of a pipeline (issue 32 item 3; ARCHITECTURE decision 78), under `dtrain launch`:
#  - a stage stopped (SIGSTOP) in pp 4 on 4 ranks: its neighbours block in point-to-point
#    waits on it, theirs on them; the supervisor names the stopped stage - host, pid, state
#    "stopped" - at the end of the chain of waits and prints the chain: the last stage
#    (rank 0 -> rank 1 -> rank 2 -> rank 3) and a middle one (rank 0 -> rank 1 -> rank 2, and
#    rank 3 waiting on rank 2 from the other side);
#  - kill -9 of a middle stage: the supervisor names the killed rank, restarts from the last
#    checkpoint, and the run ends with the losses and the final weights file of an
#    uninterrupted run, bitwise.
# The stop lands where the stage has more to send: inside its forward (DTRAIN_TEST_SLOW holds
# each forward for SLOW_MS right after the activations arrived); the record after the stop
# confirms it (else the stage is woken and stopped again at its next forward).
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
fresh_dir "$dir"
mpi_env
host=$(hostname)

pp=(--set model.preset=llama-tiny --set model.untied_embeddings=1 --set model.n_layer=4 --seq 32 --batch 2
    --set training.grad_accum=4 --set parallel.pp=4 --lr 1e-3 --seed 5 --set logging.progress=lines
    --set logging.every=1)

# stop_stage VICTIM SLOW_MS RUN_DIR: waits for the victim's record to show it inside a forward
# (out of every operation, its last a receive from the previous stage, less than SLOW_MS ago),
# stops it, and confirms from the record that it stopped there (same operation, left less than
# SLOW_MS before the stop); otherwise wakes it and tries at its next forward. Prints its pid.
stop_stage() {
  /usr/bin/python3 - "$@" <<'PY'
import os, signal, struct, sys, time
victim, slow, run = int(sys.argv[1]), float(sys.argv[2]) / 1e3, sys.argv[3]
def rec():
    try: d = open(f'{run}/rank{victim}.rec', 'rb').read()
    except OSError: return None
    if len(d) < 232 or d[:8] != b'DTRANK01': return None
    op = d[168:192].split(b'\0')[0].decode()
    t_left, = struct.unpack_from('<d', d, 200)
    entered, left = struct.unpack_from('<QQ', d, 208)
    peer, = struct.unpack_from('<i', d, 224)
    return struct.unpack_from('<i', d, 16)[0], op, t_left, entered, left, peer
deadline = time.time() + 120
while time.time() < deadline:
    r = rec()
    if r and r[3] > 0 and r[3] == r[4] and r[1] == 'recv' and r[5] == victim - 1 and time.time() - r[2] < slow / 2:
        os.kill(r[0], signal.SIGSTOP)
        t_stop = time.time()
        s = rec()
        if s and s[3] == r[3] and s[4] == r[4] and t_stop - s[2] < slow:
            print(r[0])
            sys.exit(0)
        os.kill(r[0], signal.SIGCONT)
    time.sleep(0.01)
sys.exit(1)
PY
}

# stop_case NAME VICTIM CHAIN...: pp 4, the victim stopped in a forward of step 3 or later;
# the supervisor's report must name it (host, pid, stopped) and show each CHAIN.
stop_case() {
  local name=$1 victim=$2 slow=600
  shift 2
  DTRAIN_TEST_SLOW=$victim:$slow "$bin" launch -n 4 --max-restarts 0 --run-dir $name/run -- train "${pp[@]}" \
    --steps 1000 --set fault.collective_timeout=4 >$name.log 2>&1 &
  local lpid=$! pid=""
  for _ in $(seq 1 600); do grep -q "step 3/" $name.log && break; sleep 0.1; done
  pid=$(stop_stage $victim $slow $name/run)
  if [ -z "$pid" ]; then
    fail "$name: rank $victim never stopped inside a forward: $(tail -2 $name.log)"
    kill $lpid 2>/dev/null; wait $lpid; return
  fi
  wait $lpid
  local line ok=1 c
  line=$(grep -m1 "job failed after" $name.log)
  [[ $line == *"rank $victim on $host (pid $pid, stopped) hung: at the end of a chain of point-to-point waits"* ]] || ok=0
  for c in "$@"; do grep -q "hang: chain of waits: .*$c" $name.log || ok=0; done
  if [ $ok = 1 ]; then
    pass "$name: stopped stage $victim named (pid $pid, stopped) at the end of: $(grep -m1 -o 'hang: chain of waits: .*' $name.log | cut -c23-)"
  else
    fail "$name: ${line:-no failure line} / $(grep -m1 'hang: chain of waits' $name.log) / $(grep -m1 'watchdog: rank' $name.log)"
  fi
  kill -CONT $pid 2>/dev/null
}
mkdir -p stop_last stop_mid
# The last stage: every other stage waits on the next one.
stop_case stop_last 3 "rank 0 -> rank 1 -> rank 2 -> rank 3\b"
# A middle stage: the stages before it wait down the chain, the last one waits on it from above.
stop_case stop_mid 2 "rank 0 -> rank 1 -> rank 2\b" "rank 3 -> rank 2\b"

# kill -9 of a middle stage under the supervisor (after step 6, a checkpoint committed): named,
# restarted from the checkpoint, bitwise the uninterrupted run (losses of every step, the
# final weights file).
export DTRAIN_TEST_STEP_DELAY_MS=100
kill_args=(--steps 16 --set checkpoint.every=4 --set checkpoint.keep_last=2)
mkdir -p ref kill
"$bin" launch -n 4 -- train "${pp[@]}" "${kill_args[@]}" --set checkpoint.dir=ref/ck \
  --set logging.metrics=ref/m.jsonl --save-weights ref/w.st >ref.log 2>&1 || fail "reference: $(tail -3 ref.log)"
"$bin" launch -n 4 --max-restarts 2 --backoff 0.1 --run-dir kill/run -- train "${pp[@]}" "${kill_args[@]}" \
  --set checkpoint.dir=kill/ck --set logging.metrics=kill/m.jsonl --save-weights kill/w.st >kill.log 2>&1 &
lpid=$! kpid=""
for _ in $(seq 1 600); do
  kpid=$(/usr/bin/python3 -c "
import struct,sys
try: d=open('kill/run/rank1.rec','rb').read()
except OSError: sys.exit(1)
print(struct.unpack_from('<i', d, 16)[0] if d[:8]==b'DTRANK01' else '')" 2>/dev/null)
  # a checkpoint committed (its name in latest) and steps run since
  [ -n "$kpid" ] && grep -q "step 6/" kill.log && grep -qs "step-" kill/ck/latest && break
  sleep 0.1
done
[ -n "$kpid" ] && kill -KILL "$kpid"
wait $lpid
rc=$?
resumed=$(grep -m1 -o "resumed from kill/ck/step-[0-9]*: step [0-9]*" kill.log)
if [ -n "$kpid" ] && [ $rc -eq 0 ] && grep -q "rank 1 killed by signal 9" kill.log && [ -n "$resumed" ] &&
   grep -q "job finished after 1 restart" kill.log; then
  pass "pp 4: middle stage (rank 1) killed with SIGKILL: named, restarted, $resumed"
else
  fail "pp 4 kill (rc $rc, pid ${kpid:-none}): $(grep -E 'error|failed|giving up' kill.log | head -3)"
fi
out=$(cmp_runs kill/m.jsonl kill/w.st ref/m.jsonl ref/w.st 0) && cmp -s kill/w.st ref/w.st &&
  pass "pp 4 after a killed middle stage: bitwise the uninterrupted run ($out; the weights files identical)" ||
  fail "pp 4 kill: result differs: $out"

echo "test_pp_fault: $fails failure(s)"
[ $fails -eq 0 ]
