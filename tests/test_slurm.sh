#!/usr/bin/env bash
# A real Slurm cluster on one machine (scripts/mnhosts.sh up 2 + slurm-up: munged, slurmctld
# on h1, one slurmd per host, each host a network namespace with its own address, hostname,
# /etc/hosts, /dev/shm and TMPDIR):
#  - `srun --mpi=pmix -N2 -n4 dtrain train` from h1: dtrain sees "4 rank(s) on 2 node(s)" and
#    the final weights are bitwise those of 1 process with --accum 4;
#  - a job whose rank 1 cannot open its data ends non-zero within 60 s, the log naming rank 1,
#    and leaves no job or dtrain process behind.
# Installs slurm-wlm slurmctld slurmd slurm-client munge (apt-get, services kept from starting)
# when they are missing. Everything is always torn down (trap). Exit 77 (skip) without root,
# network namespaces or the packages; under CI=true that is a failure (tests/lib.sh: skip).
set -uo pipefail
bin=$(readlink -f "$1")
dir=$(readlink -m "$2")
src=$(cd "$(dirname "$0")/.." && pwd)
mn=$src/scripts/mnhosts.sh
# Nothing from an enclosing job or launcher: our srun must talk to our cluster only.
for v in $(compgen -e | grep -E '^(SLURM_|SLURMD_|PMIX_|PMI_|OMPI_)' || true); do unset "$v"; done
unset DTRAIN_NODE_ID
export OMP_NUM_THREADS=1 PATH=$PATH:/usr/sbin:/sbin
# Own prefix and state: `down` touches only dtmns-* namespaces and the daemons of this state
# directory (test_multihost uses dtmnt-, so the two can run at the same time).
export MN_PREFIX=dtmns- MN_STATE=$dir/mn
start=$(date +%s.%N)
. "$(dirname "$0")/lib.sh"
elapsed() { awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

[ "$(id -u)" = 0 ] || skip "network namespaces and Slurm daemons need root"
for t in ip nsenter unshare runuser flock; do command -v $t >/dev/null || skip "'$t' is not installed"; done
mkdir -p "$dir"
ip netns add "${MN_PREFIX}probe" 2>"$dir/probe.err" || skip "cannot create a network namespace: $(cat "$dir/probe.err")"
ip netns del "${MN_PREFIX}probe"

# The packages, if missing. policy-rc.d (exit 101) keeps munge/slurmd/slurmctld from being
# started as system services by the install; ours is removed again if we put it there.
pkgs="slurm-wlm slurmctld slurmd slurm-client munge"
have() { for t in munged mungekey slurmctld slurmd srun sinfo; do command -v $t >/dev/null || return 1; done; }
if ! have; then
  command -v apt-get >/dev/null || skip "Slurm is not installed and there is no apt-get ($pkgs)"
  echo "installing $pkgs ..."
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && made_policy=1
  fi
  apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -q \
      --no-install-recommends $pkgs >>"$dir/apt.log" 2>&1
  }
  apt_install || { apt-get -o DPkg::Lock::Timeout=120 update -q >>"$dir/apt.log" 2>&1; apt_install; }
  rc=$?
  [ $made_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ $rc -eq 0 ] && have || skip "cannot install $pkgs: $(tail -n 2 "$dir/apt.log" | paste -sd' ')"
  echo "installed in $(elapsed) s"
  start=$(date +%s.%N)
fi

# One run at a time on this machine (fixed namespace names and state directory).
exec 9>/tmp/dtrain-test-slurm.lock
flock -w 120 9 || { echo "FAIL: another test_slurm holds /tmp/dtrain-test-slurm.lock"; exit 1; }
# What a killed earlier run may have left (found by namespace name and munged's --socket).
"$mn" down >/dev/null 2>&1
rm -rf "$dir" && mkdir -p "$dir"
save_logs() {   # `down` removes $MN_STATE/slurm: keep the logs and config for a post-mortem
  mkdir -p "$dir/slurm-logs"
  cp -r "$MN_STATE/slurm/log/." "$MN_STATE/slurm/munge/munged.log" "$MN_STATE/slurm/slurm.conf" \
    "$dir/slurm-logs/" 2>/dev/null
  return 0
}
trap 'save_logs; "$mn" down >/dev/null 2>&1' EXIT

"$mn" up 2 || { echo "FAIL: mnhosts.sh up 2"; exit 1; }
"$mn" slurm-up || { echo "FAIL: mnhosts.sh slurm-up (logs: $dir/slurm-logs)"; exit 1; }
nodes=$("$mn" exec h1 sinfo -h -N -o '%N %t' | sort | paste -sd,)
[ "$nodes" = "h1 idle,h2 idle" ] && pass "Slurm up: $nodes ($(elapsed) s)" || fail "sinfo: '$nodes'"
mpis=$("$mn" exec h1 srun --mpi=list 2>&1)
grep -qw pmix <<<"$mpis" || skip "this Slurm has no pmix plugin (srun --mpi=list: $(paste -sd' ' <<<"$mpis"))"

# Placement: block distribution, 2 tasks per host, each with its host's own TMPDIR (task
# prolog) and PMIx directory (TmpFS: with one shared by both hosts the step fails, "File exists").
where=$(timeout 30 "$mn" exec h1 srun --mpi=pmix -N2 -n4 -l sh -c 'echo "$(hostname) $TMPDIR $PMIX_SYSTEM_TMPDIR"' 2>&1 | sort)
want=$(for r in 0 1 2 3; do h=h$((r / 2 + 1)); echo "$r: $h $MN_STATE/hosts/$h/tmp $MN_STATE/hosts/$h/tmp"; done)
if [ "$where" = "$want" ]; then
  pass "srun -N2 -n4: tasks 0,1 on h1 and 2,3 on h2, each with its host's TMPDIR and PMIx directory"
else
  fail "placement: got '$(paste -sd'|' <<<"$where")', want '$(paste -sd'|' <<<"$want")'"
fi

common=(--set model.preset= --model.n_layer 2 --model.d_model 48 --model.n_head 4 --model.vocab_size 300
        --model.context 32 --seq 32 --batch 2 --steps 10 --set logging.progress=lines)
outs() { out=(--set "logging.metrics=$dir/$1.jsonl" --save-weights "$dir/$1.st"); }   # sets out

outs one
"$bin" train "${common[@]}" --accum 4 "${out[@]}" >"$dir/one.log" 2>&1 || fail "one: $(tail -2 "$dir/one.log")"

# 2 nodes x 2 ranks, direct launch by srun from h1 (PMIx wire-up, TCP between hosts).
outs srun
timeout 120 "$mn" exec h1 srun --mpi=pmix -N2 -n4 "$bin" train "${common[@]}" "${out[@]}" \
  >"$dir/srun.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  fail "srun: rc $rc: $(tail -3 "$dir/srun.log")"
elif ! grep -q "4 rank(s) on 2 node(s)" "$dir/srun.log"; then
  fail "srun: no '4 rank(s) on 2 node(s)' in the log: $(grep -m1 "rank(s)" "$dir/srun.log")"
elif ! cmp -s "$dir/srun.st" "$dir/one.st"; then
  fail "srun: weights differ from 1 process x 4 accumulation: $(cmp "$dir/srun.st" "$dir/one.st" 2>&1)"
else
  pass "srun --mpi=pmix -N2 -n4: 4 ranks on 2 nodes, weights bitwise equal to 1 process x 4 ($(elapsed) s so far)"
fi
grep -q "^h1:0 " "$dir/srun.log" && pass "rank 0 logs as h1:0" || fail "rank 0 prefix: $(head -1 "$dir/srun.log")"

# Rank 1 cannot open its data: the job ends (non-zero) well within 60 s, naming the rank.
cat >"$dir/rank1-bad.sh" <<'EOF'
#!/bin/sh
if [ "$SLURM_PROCID" = 1 ]; then exec "$@" --data /nonexistent/shard.bin; fi
exec "$@"
EOF
chmod 755 "$dir/rank1-bad.sh"
t0=$(date +%s.%N)
timeout 60 "$mn" exec h1 srun --mpi=pmix -N2 -n4 "$dir/rank1-bad.sh" "$bin" train "${common[@]}" \
  --set logging.metrics= >"$dir/fail.log" 2>&1
rc=$?
took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q ":1 error: .*nonexistent" "$dir/fail.log" \
   && grep -q "rank 1 failed" "$dir/fail.log"; then
  pass "a failing rank ends the job in ${took} s (rc $rc): $(grep -m1 ':1 error' "$dir/fail.log")"
else
  fail "failing rank (rc $rc, ${took} s): $(tail -5 "$dir/fail.log")"
fi
# ...and nothing of it stays: no job in the queue, no dtrain process on either host.
left=""
for _ in $(seq 1 50); do
  q=$("$mn" exec h1 squeue -h -o '%i %T' 2>&1)
  left=$q
  for ns in "${MN_PREFIX}h1" "${MN_PREFIX}h2"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do
      [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$bin" ] && left="$left dtrain:$p@$ns"
    done
  done
  [ -z "$left" ] && break
  sleep 0.2
done
[ -z "$left" ] && pass "no job or rank left after the failure" || fail "left after the failing job: $left"

save_logs
"$mn" down
stale=""
ns=$(ip netns list | awk '{print $1}')
grep -q "^$MN_PREFIX" <<<"$ns" && stale="namespaces: $(ip netns list | grep "^$MN_PREFIX" | paste -sd' ')"
# Our daemons name the state directory on their command line (-f slurm.conf, --socket=...).
for p in /proc/[0-9]*; do
  cmd=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline")
  [[ $cmd == *"$MN_STATE/"* ]] && stale="$stale ${p#/proc/}:$(cat "$p/comm" 2>/dev/null)"
done
[ -z "$stale" ] && pass "torn down: no namespaces, munged or Slurm daemons left" || fail "left behind: $stale"

echo "test_slurm: $fails failure(s) in $(elapsed) s"
[ $fails -eq 0 ]
