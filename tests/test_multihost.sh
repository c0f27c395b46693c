#!/usr/bin/env bash
# Several hosts on one machine (scripts/mnhosts.sh: network namespaces h1, h2 with their own
# address, hostname, /etc/hosts and /dev/shm; Open MPI over TCP between them):
#  - mpirun 2 hosts x 2 ranks: dtrain sees "4 rank(s) on 2 node(s)" (node = host name) and
#    the final weights are bitwise those of 1 process with --accum 4;
#  - the same through `dtrain launch -n 4 --hosts h1:2,h2:2`, run on h1;
#  - `dtrain launch -n 4 --simulate-nodes 2` on this machine (no namespaces): same checks;
#  - a rank on h2 stopped (SIGSTOP) in a supervised run: named with host h2, pid and state.
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
