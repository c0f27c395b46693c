#!/usr/bin/env bash
# Several hosts on one machine (scripts/mnhosts.sh: network namespaces h1, h2 with their own
# address, hostname, /etc/hosts and /dev/shm; Open MPI over TCP between them):
#  - mpirun 2 hosts x 2 ranks: dtrain sees "4 rank(s) on 2 node(s)" (node = host name) and
#    the final weights are bitwise those of 1 process with --accum 4;
#  - the same through `dtrain launch -n 4 --hosts h1:2,h2:2`, run on h1;
#  - `dtrain launch -n 4 --simulate-nodes 2` on this machine (no namespaces): same checks;
#  - a rank on h2 stopped (SIGSTOP) in a supervised run: named with host h2, pid and state;
#  - elastic restart: h2's link cut mid-run, the job continues on h1 (--min-ranks), detection
#    <= 20 s (about 8 s on a quiet host), recovery <= 30 s, the same training.
# The hosts are always torn down (trap). Exit 77 (skip) where namespaces cannot be made; under
# CI=true that is a failure (tests/lib.sh: skip).
set -uo pipefail
bin=$(readlink -f "$1")
dir=$2
src=$(cd "$(dirname "$0")/.." && pwd)
mn=$src/scripts/mnhosts.sh
rm -rf "$dir" && mkdir -p "$dir"
unset DTRAIN_NODE_ID OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
export OMP_NUM_THREADS=1
# Own prefix and state: `down` removes only dtmnt-* namespaces, never another user's hosts.
export MN_PREFIX=dtmnt- MN_STATE=$dir/mn
start=$(date +%s.%N)
. "$(dirname "$0")/lib.sh"
elapsed() { awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

[ "$(id -u)" = 0 ] || skip "network namespaces need root"
for t in ip nsenter unshare; do command -v $t >/dev/null || skip "'$t' is not installed"; done
command -v mpirun >/dev/null || { echo "FAIL: no mpirun"; exit 1; }
ip netns add "${MN_PREFIX}probe" 2>"$dir/probe.err" || skip "cannot create a network namespace: $(cat "$dir/probe.err")"
ip netns del "${MN_PREFIX}probe"

# One run at a time on this machine (the namespace names are fixed, see above).
exec 9>/tmp/dtrain-test-multihost.lock
flock -w 120 9 || { echo "FAIL: another test_multihost holds /tmp/dtrain-test-multihost.lock"; exit 1; }
trap '"$mn" down >/dev/null 2>&1' EXIT
"$mn" down >/dev/null 2>&1   # what a killed earlier run may have left
"$mn" up 2 || { echo "FAIL: mnhosts.sh up 2"; exit 1; }
[ "$("$mn" hosts | paste -sd,)" = "h1,h2" ] && pass "hosts up: h1,h2" || fail "hosts: $("$mn" hosts)"
[ "$("$mn" exec h2 hostname)" = h2 ] && pass "h2 has its own hostname" || fail "hostname on h2"

common=(--set model.preset= --model.n_layer 2 --model.d_model 48 --model.n_head 4 --model.vocab_size 300
        --model.context 32 --seq 32 --batch 2 --steps 10 --set logging.progress=lines)
outs() { out=(--set "logging.metrics=$dir/$1.jsonl" --save-weights "$dir/$1.st"); }   # sets out
check() { # NAME: 4 ranks on 2 nodes, weights bitwise equal to the single-process run
  local name=$1
  if ! grep -q "4 rank(s) on 2 node(s)" "$dir/$name.log"; then
    fail "$name: no '4 rank(s) on 2 node(s)' in the log: $(grep -m1 "rank(s)" "$dir/$name.log")"
  elif ! cmp -s "$dir/$name.st" "$dir/one.st"; then
    fail "$name: weights differ from 1 process x 4 accumulation: $(cmp "$dir/$name.st" "$dir/one.st" 2>&1)"
  else
    pass "$name: 4 ranks on 2 nodes, weights bitwise equal to 1 process x 4 ($(elapsed) s so far)"
  fi
}

outs one
"$bin" train "${common[@]}" --accum 4 "${out[@]}" >"$dir/one.log" 2>&1 || fail "one: $(tail -2 "$dir/one.log")"

# 2 hosts x 2 ranks, plain mpirun from h1 (rsh agent, TCP between hosts, vader inside).
outs hosts
timeout 120 "$mn" mpirun --host h1:2,h2:2 -n 4 --bind-to none -x OMP_NUM_THREADS \
  "$bin" train "${common[@]}" "${out[@]}" >"$dir/hosts.log" 2>&1 || fail "hosts: $(tail -3 "$dir/hosts.log")"
check hosts
grep -q "^h1:0 " "$dir/hosts.log" && pass "rank 0 logs as h1:0" || fail "rank 0 prefix: $(head -1 "$dir/hosts.log")"

# The launcher across the hosts: run on h1, mnhosts exports the MCA settings for the namespaces.
outs launch_hosts
timeout 120 "$mn" exec h1 "$bin" launch -n 4 --hosts h1:2,h2:2 -- train "${common[@]}" "${out[@]}" \
  >"$dir/launch_hosts.log" 2>&1 || fail "launch_hosts: $(tail -3 "$dir/launch_hosts.log")"
check launch_hosts

# A rank on h2 stops (SIGSTOP) in a supervised run across the hosts: the report names it
# with h2, its pid and "stopped" (one kernel: its /proc is visible from h1), and the
# restarted run finishes with the weights of an uninterrupted one.
hang=(--set model.preset= --model.n_layer 2 --model.d_model 48 --model.n_head 4 --model.vocab_size 300
      --model.context 32 --seq 32 --batch 2 --steps 300 --set logging.progress=lines
      --set checkpoint.every=25 --set fault.collective_timeout=3)
timeout 300 "$mn" exec h1 "$bin" launch -n 4 --hosts h1:2,h2:2 -- train "${hang[@]}" \
  --set checkpoint.dir="$dir/href" --save-weights "$dir/href.st" >"$dir/href.log" 2>&1 || fail "hang reference: $(tail -3 "$dir/href.log")"
DTRAIN_TEST_STEP_DELAY_MS=10 timeout 300 "$mn" exec h1 env DTRAIN_TEST_STEP_DELAY_MS=10 "$bin" launch -n 4 \
  --hosts h1:2,h2:2 --max-restarts 2 --backoff 0.1 --run-dir "$dir/hrun" -- train "${hang[@]}" \
  --set checkpoint.dir="$dir/hck" --save-weights "$dir/hstop.st" >"$dir/hstop.log" 2>&1 &
lpid=$!
pid=""
for _ in $(seq 1 300); do
  pid=$(/usr/bin/python3 -c "
import struct; d=open('$dir/hrun/rank3.rec','rb').read()
print(struct.unpack_from('<i', d, 16)[0] if d[:8]==b'DTRANK01' else '')" 2>/dev/null)
  [ -n "$pid" ] && grep -q "step 60/" "$dir/hstop.log" && break
  sleep 0.1
done
[ -n "$pid" ] && kill -STOP "$pid"
wait $lpid
if [ -n "$pid" ] && grep -q "job failed after .*: rank 3 on h2 (pid $pid, stopped) hung" "$dir/hstop.log" \
   && grep -q "job finished after 1 restart" "$dir/hstop.log" && cmp -s "$dir/hstop.st" "$dir/href.st"; then
  pass "a stopped rank on h2 is named (host h2, pid, stopped); the restarted run is bitwise"
else
  fail "stopped rank on h2 (pid '$pid'): $(grep -E 'job failed|error' "$dir/hstop.log" | head -2)"
fi

# Elastic restart: h2's link is cut mid-run (its switch port goes down). Open MPI (keepalive
# 5 s + 3 x 2 s, set by mnhosts.sh) ends the job; the supervisor (--min-ranks 2) probes the
# hosts, drops h2 and resumes on h1's 2 ranks, resharded, with training.batch keeping the
# global batch (accumulation 1 -> 2). Asserted and measured: detection <= 20 s after the cut,
# the first step after the restart <= 30 s after the detection, the same training as the
# uninterrupted 4-rank run (the accumulation order differs: losses to 1e-5, weights to 1e-3).
el=(--set model.preset= --model.n_layer 2 --model.d_model 48 --model.n_head 4 --model.vocab_size 300
    --model.context 32 --seq 32 --batch 2 --set training.batch=8 --steps 300 --set logging.progress=lines
    --set checkpoint.every=25 --set logging.every=1)
timeout 300 "$mn" exec h1 "$bin" launch -n 4 --hosts h1:2,h2:2 -- train "${el[@]}" --set checkpoint.dir="$dir/eref" \
  --set logging.metrics="$dir/eref.jsonl" --save-weights "$dir/eref.st" >"$dir/eref.log" 2>&1 || fail "elastic reference: $(tail -3 "$dir/eref.log")"
timeout 300 "$mn" exec h1 env DTRAIN_TEST_STEP_DELAY_MS=20 "$bin" launch -n 4 --hosts h1:2,h2:2 --max-restarts 3 \
  --min-ranks 2 --backoff 0.1 --run-dir "$dir/erun" -- train "${el[@]}" --set checkpoint.dir="$dir/eck" \
  --set logging.metrics="$dir/el.jsonl" --save-weights "$dir/el.st" >"$dir/el.log" 2>&1 &
lpid=$!
for _ in $(seq 1 600); do grep -q "step 60/" "$dir/el.log" && break; sleep 0.1; done
ip -n "${MN_PREFIX}sw" link set sw-h2 down && t_cut=$(date +%s%3N)
wait $lpid
rc=$?
ip -n "${MN_PREFIX}sw" link set sw-h2 up 2>/dev/null
ms() { local t; t=$(grep -m1 "$1" "$dir/el.log" | sed -E 's/.*\[([0-9:.]+)\].*/\1/'); [ -n "$t" ] && echo $(( $(date -d "$(date +%F) $t" +%s%3N) - t_cut )); }
det=$(ms "job failed after")
rec=$(grep -o "first step after restart 1 logged [0-9.]* s after" "$dir/el.log" | awk '{print $7}')
# Losses to 1e-5; weights to 1e-3 normwise (--normwise: not element by element): the key bias's
# gradient is mathematically zero, and Adam turns its rounding noise (another summation order
# here) into lr-sized steps (measured 2.2e-4 of the tensor's largest): elements of that bias
# near zero can differ by more than themselves.
out=$(/usr/bin/python3 "$src/tests/ref/compare_runs.py" "$dir/el.jsonl" "$dir/el.st" "$dir/eref.jsonl" "$dir/eref.st" 1e-5 losses-only 2>&1) \
  && out="$out; $(/usr/bin/python3 "$src/tests/ref/compare_runs.py" "$dir/el.jsonl" "$dir/el.st" "$dir/eref.jsonl" "$dir/eref.st" 1e-3 --normwise 2>&1)"
cmpok=$?
# detection: about 8 s quiet (the keepalive settings); bounded at 20 s so that a loaded, shared
# host (hosts differ 2x; 10.4 s was seen with the suite and two valgrind runs beside it) does
# not fail what is a "the job does not hang" check, not a speed measurement
if [ $rc -eq 0 ] && [ -n "$det" ] && [ "$det" -le 20000 ] && grep -q "host(s) h2 did not answer a probe" "$dir/el.log" \
   && grep -q "continuing on 2 rank(s) of h1:2" "$dir/el.log" && [ -n "$rec" ] && awk -v r="$rec" 'BEGIN{exit !(r <= 30)}' \
   && grep -q "(resharded)" "$dir/el.log" && [ $cmpok -eq 0 ]; then
  pass "elastic: h2's link cut; detected in $det ms, h2 dropped, first step on 2 ranks $rec s after the detection; same training ($out)"
else
  fail "elastic (rc $rc, detection '${det}' ms, recovery '${rec}' s): $(grep -E 'job failed|host|giving|error' "$dir/el.log" | head -4) $out"
fi

"$mn" down
ns=$(ip netns list | awk '{print $1}')
! grep -q "^$MN_PREFIX" <<<"$ns" && pass "hosts torn down" \
  || fail "namespaces left: $(ip netns list | grep "^$MN_PREFIX")"

# Simulated nodes on this machine: DTRAIN_NODE_ID per MPMD app context.
outs simulated
timeout 120 "$bin" launch -n 4 --simulate-nodes 2 -- train "${common[@]}" "${out[@]}" \
  >"$dir/simulated.log" 2>&1 || fail "simulated: $(tail -3 "$dir/simulated.log")"
check simulated

echo "test_multihost: $fails failure(s) in $(elapsed) s"
[ $fails -eq 0 ]
