#!/usr/bin/env bash
# dtrain launch without running MPI: the mpirun command lines it builds (--dry-run), the
# exit status and signal forwarding (a fake mpirun), and one-line usage errors (exit 2).
set -uo pipefail
bin=$(readlink -f "$1")
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
unset OMP_NUM_THREADS DTRAIN_NODE_ID DTRAIN_DEBUG
cpus=$(nproc)                 # affinity-aware, like the launcher (OMP_NUM_THREADS unset above)
. "$(dirname "$0")/lib.sh"
per() { local t=$((cpus / $1)); echo $((t > 0 ? t : 1)); }   # cores per rank, at least 1
root=""; [ "$(id -u)" = 0 ] && root="--allow-run-as-root "

# The ssh options of remote launches depend on the caller's Open MPI settings (rsh agent and
# args, from the environment or parameter files): none here, so the lines are fixed.
unset OMPI_MCA_plm_rsh_agent OMPI_MCA_orte_rsh_agent OMPI_MCA_pls_rsh_agent OMPI_MCA_plm_rsh_args
dry() { OMPI_MCA_mca_base_param_files=/dev/null "$bin" launch --dry-run "$@" 2>&1; }
rsh="--mca plm_rsh_args '-o ConnectTimeout=30 -o BatchMode=yes -o ServerAliveInterval=15'"
expect_line() { # LABEL EXPECTED ARGS... : the dry-run line must equal EXPECTED
  local label=$1 want=$2 got; shift 2
  got=$(dry "$@")
  if [ "$got" = "$want" ]; then pass "$label: $got"; else fail "$label:
     got  $got
     want $want"; fi
}
bind() { # RANKS_ON_THIS_MACHINE [MAP]: the binding flags the launcher must choose
  if [ "$1" -gt "$cpus" ]; then echo "--oversubscribe --bind-to none"
  else echo "--map-by ${2:-slot}:PE=$(per "$1") --bind-to core"; fi
}
mpirun=$(command -v mpirun) || { echo "no mpirun in PATH"; exit 1; }

# Local ranks: threads = cores / ranks; binding unless more ranks than cores.
expect_line "-n 1" "$mpirun ${root}$(bind 1) -n 1 -x OMP_NUM_THREADS=$(per 1) $bin train cfg.yaml" \
  -n 1 -- train cfg.yaml
expect_line "-n 2" "$mpirun ${root}$(bind 2) -n 2 -x OMP_NUM_THREADS=$(per 2) $bin train cfg.yaml --steps 5" \
  -n 2 -- train cfg.yaml --steps 5
expect_line "-n 8 (oversubscribed here)" \
  "$mpirun ${root}$(bind 8) -n 8 -x OMP_NUM_THREADS=$(per 8) $bin eval --ckpt x" -n 8 -- eval --ckpt x

# Simulated nodes: one MPMD app context per node, consecutive blocks, all threads from this machine.
t=$(per 4)
expect_line "--simulate-nodes 2" \
  "$mpirun ${root}$(bind 4) -n 2 -x OMP_NUM_THREADS=$t -x DTRAIN_NODE_ID=node0 $bin train c.yaml : -n 2 -x OMP_NUM_THREADS=$t -x DTRAIN_NODE_ID=node1 $bin train c.yaml" \
  -n 4 --simulate-nodes 2 -- train c.yaml
t=$(per 5)
expect_line "--simulate-nodes 2 with 5 ranks (3 + 2)" \
  "$mpirun ${root}$(bind 5) -n 3 -x OMP_NUM_THREADS=$t -x DTRAIN_NODE_ID=node0 $bin train : -n 2 -x OMP_NUM_THREADS=$t -x DTRAIN_NODE_ID=node1 $bin train" \
  -n 5 --simulate-nodes 2 -- train
# A DTRAIN_NODE_ID already in the environment is replaced per context, not forwarded.
got=$(DTRAIN_NODE_ID=zzz dry -n 2 --simulate-nodes 2 -- train)
[[ $got != *zzz* && $got == *"DTRAIN_NODE_ID=node0"*" : "*"DTRAIN_NODE_ID=node1"* ]] \
  && pass "inherited DTRAIN_NODE_ID replaced" || fail "inherited DTRAIN_NODE_ID: $got"

# Hosts: threads and binding from the busiest host; DTRAIN_* forwarded by name.
got=$(DTRAIN_DEBUG=1 dry -n 4 --hosts h1:2,h2:2 -- train)
want="$mpirun ${root}--host h1:2,h2:2 $rsh $(bind 2) -n 4 -x OMP_NUM_THREADS=$(per 2) -x DTRAIN_DEBUG $bin train"
[ "$got" = "$want" ] && pass "--hosts h1:2,h2:2 + DTRAIN_DEBUG: $got" || fail "--hosts: got $got, want $want"
expect_line "--hosts h1,h2,h3 (one slot each)" \
  "$mpirun ${root}--host h1:1,h2:1,h3:1 $rsh $(bind 1) -n 3 -x OMP_NUM_THREADS=$(per 1) $bin train" \
  -n 3 --hosts h1,h2,h3 -- train
expect_line "--hosts with --ranks-per-node 1" \
  "$mpirun ${root}--host a:4,b:4 $rsh $(bind 1 ppr:1:node) -n 2 -x OMP_NUM_THREADS=$(per 1) $bin train" \
  -n 2 --hosts a:4,b:4 --ranks-per-node 1 -- train
printf '# cluster\nnode-a slots=2   # first\n\nnode-b slots=2 max_slots=4\n' >"$dir/hostfile"
expect_line "--hostfile" \
  "$mpirun ${root}--hostfile $dir/hostfile $rsh $(bind 2) -n 3 -x OMP_NUM_THREADS=$(per 2) $bin train" \
  -n 3 --hostfile "$dir/hostfile" -- train
# ssh's options go after the user's own plm_rsh_args (ssh keeps an option's first value, so
# the user's win); --connect-timeout sets ConnectTimeout (0: none); another agent gets none.
expect_line "--connect-timeout 7" \
  "$mpirun ${root}--host h1:1 --mca plm_rsh_args '-o ConnectTimeout=7 -o BatchMode=yes -o ServerAliveInterval=15' $(bind 1) -n 1 -x OMP_NUM_THREADS=$(per 1) $bin train" \
  -n 1 --hosts h1 --connect-timeout 7 -- train
got=$(OMPI_MCA_plm_rsh_args="-p 2222" dry -n 1 --hosts h1 --connect-timeout 7 -- train)
[[ $got == *"--mca plm_rsh_args '-p 2222 -o ConnectTimeout=7 -o BatchMode=yes -o ServerAliveInterval=15' "* ]] \
  && pass "OMPI_MCA_plm_rsh_args kept first: $got" || fail "user plm_rsh_args: $got"
printf '# site\nplm_rsh_args = -l admin\n' >"$dir/mca.conf"
got=$(OMPI_MCA_mca_base_param_files="$dir/mca.conf" "$bin" launch --dry-run -n 1 --hosts h1 --connect-timeout 0 -- train)
[[ $got == *"--mca plm_rsh_args '-l admin -o BatchMode=yes -o ServerAliveInterval=15' "* ]] \
  && pass "plm_rsh_args of an MCA parameter file kept first; --connect-timeout 0: no ConnectTimeout" \
  || fail "param file plm_rsh_args / --connect-timeout 0: $got"
got=$(OMPI_MCA_plm_rsh_agent="rsh" dry -n 1 --hosts h1 -- train)
[[ $got != *plm_rsh_args* && $got == *"--host h1:1 "* ]] && pass "rsh agent: no ssh options" || fail "rsh agent: $got"
got=$(dry -n 2 -- train)
[[ $got != *plm_rsh_args* ]] && pass "local launch: no ssh options" || fail "local launch: $got"
got=$(OMP_NUM_THREADS=3 dry -n 2 -- train)
[[ $got == *"-x OMP_NUM_THREADS $bin"* ]] && pass "user's OMP_NUM_THREADS forwarded as is" || fail "user OMP_NUM_THREADS: $got"

# The line is shell-quoted: evaluating it gives back the exact words.
got=$(dry -n 1 -- train "a b" "it's" '$HOME' 'x"y')
words=$(eval "set -- $got; printf '[%s]' \"\$@\"")
want_tail="[$bin][train][a b][it's][\$HOME][x\"y]"
[[ $words == *"$want_tail" ]] && pass "shell quoting round-trips: $got" || fail "quoting: $got -> $words"

# Running: a fake mpirun records its argv; its exit status and death by signal come back.
fake=$dir/fake-mpirun
cat >"$fake" <<'EOF'
#!/bin/sh
printf '%s\n' "$@" >"$FAKE_OUT"
case $FAKE_MODE in
  exit3) exit 3 ;;
  kill9) kill -9 $$ ;;
  term) trap 'echo term >>"$FAKE_OUT.sig"; exit 7' TERM
        trap 'echo int >>"$FAKE_OUT.sig"; exit 8' INT
        trap 'echo usr1 >>"$FAKE_OUT.sig"' USR1
        : >"$FAKE_OUT.ready"
        while :; do sleep 0.05; done ;;
esac
EOF
chmod +x "$fake"
export FAKE_OUT=$dir/fake.out
FAKE_MODE=ok "$bin" launch -n 2 --mpirun "$fake" -- train x >/dev/null 2>&1
rc=$?
[ $rc = 0 ] && [ "$(tail -2 "$FAKE_OUT" | paste -sd' ')" = "train x" ] && grep -qx -- "-n" "$FAKE_OUT" \
  && pass "runs --mpirun with the planned argv (rc 0)" || fail "fake mpirun ok: rc $rc, $(paste -sd' ' "$FAKE_OUT")"
FAKE_MODE=exit3 "$bin" launch -n 1 --mpirun "$fake" -- train >/dev/null 2>"$dir/exit3.err"
rc=$?
[ $rc = 3 ] && grep -q "mpirun exited with status 3" "$dir/exit3.err" && pass "mpirun's exit status returned (3)" \
  || fail "exit status: rc $rc $(cat "$dir/exit3.err")"
FAKE_MODE=kill9 "$bin" launch -n 1 --mpirun "$fake" -- train >/dev/null 2>&1
rc=$?
[ $rc = 137 ] && pass "mpirun killed by SIGKILL -> 137" || fail "signal death: rc $rc"
rm -f "$FAKE_OUT".*
FAKE_MODE=term "$bin" launch -n 1 --mpirun "$fake" -- train >/dev/null 2>&1 &
lp=$!
for _ in $(seq 1 100); do [ -e "$FAKE_OUT.ready" ] && break; sleep 0.05; done
# The first SIGTERM becomes SIGUSR1 (ranks checkpoint and stop), the second is forwarded.
kill -TERM $lp
for _ in $(seq 1 100); do [ -s "$FAKE_OUT.sig" ] && break; sleep 0.05; done
kill -TERM $lp
wait $lp
rc=$?
[ $rc = 7 ] && [ "$(paste -sd' ' "$FAKE_OUT.sig")" = "usr1 term" ] \
  && pass "SIGTERM to launch: first passed as SIGUSR1 (preemption), second as SIGTERM, status (7) returned" \
  || fail "SIGTERM forwarding: rc $rc, signals $(paste -sd' ' "$FAKE_OUT.sig" 2>&1)"

# SIGINT from another process is forwarded too. A script's background job starts with SIGINT
# ignored (and the launcher keeps it so); python restores the default before exec.
if command -v python3 >/dev/null; then
  rm -f "$FAKE_OUT".*
  FAKE_MODE=term python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
    "$bin" launch -n 1 --mpirun "$fake" -- train >/dev/null 2>&1 &
  lp=$!
  for _ in $(seq 1 100); do [ -e "$FAKE_OUT.ready" ] && break; sleep 0.05; done
  kill -INT $lp
  for _ in $(seq 1 100); do [ -s "$FAKE_OUT.sig" ] && break; sleep 0.05; done
  kill -INT $lp
  wait $lp
  rc=$?
  [ $rc = 8 ] && [ "$(paste -sd' ' "$FAKE_OUT.sig" 2>/dev/null)" = "usr1 int" ] \
    && pass "SIGINT to launch: first as SIGUSR1, second forwarded to mpirun (status 8)" \
    || fail "SIGINT forwarding: rc $rc, $(paste -sd' ' "$FAKE_OUT.sig" 2>&1)"
else
  skip_case "SIGINT forwarding (no python3 to start launch with SIGINT at its default)"
fi

# Usage errors: exit 2, exactly one line on stderr, naming the flag.
err() { # PATTERN ARGS...
  local pat=$1 out rc; shift
  out=$("$bin" launch "$@" 2>&1 >/dev/null); rc=$?
  if [ $rc = 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && [[ $out == *"$pat"* ]]; then
    pass "error (rc 2): $out"
  else
    fail "launch $*: rc $rc, want 2 and one line with '$pat'; got: $out"
  fi
}
printf 'good slots=2\nbad slots=x\n' >"$dir/badslots"
printf 'good\nother cpus=2\n' >"$dir/badfield"
printf '# nothing\n' >"$dir/empty"
err "-n expects a positive integer" -n 0 -- train
err "-n expects a positive integer" -n two -- train
err "-n N (the number of ranks) is required" -- train
err "missing '--'" -n 2 train cfg.yaml
err "missing '--'" -n 2
err "nothing to run after '--'" -n 2 --
err "--hosts: bad slot count" -n 2 --hosts h1:0 -- train
err "--hosts: empty host name in 'h1:2,,h2'" -n 2 --hosts "h1:2,,h2" -- train
err "--hosts: bad host name in 'h;1'" -n 2 --hosts "h;1" -- train
err "--hosts: host 'h1' appears twice" -n 2 --hosts h1,h1 -- train
err "exceeds the 4 slot(s) of --hosts" -n 5 --hosts h1:2,h2:2 -- train
err "--hostfile $dir/badslots:2" -n 2 --hostfile "$dir/badslots" -- train
err "--hostfile $dir/badfield:2: unknown field 'cpus=2'" -n 2 --hostfile "$dir/badfield" -- train
err "--hostfile: no hosts" -n 2 --hostfile "$dir/empty" -- train
err "--hostfile: cannot open" -n 2 --hostfile "$dir/none" -- train
err "--hosts and --hostfile" -n 2 --hosts h1 --hostfile "$dir/hostfile" -- train
err "--ranks-per-node expects a positive integer" -n 2 --ranks-per-node 0 -- train
err "--ranks-per-node 1 x 2 host(s)" -n 3 --hosts a:2,b:2 --ranks-per-node 1 -- train
err "--simulate-nodes 3 exceeds -n 2" -n 2 --simulate-nodes 3 -- train
err "--ranks-per-node 3 x --simulate-nodes 2" -n 4 --simulate-nodes 2 --ranks-per-node 3 -- train
err "--simulate-nodes splits" -n 2 --simulate-nodes 2 --hosts h1:2 -- train
err "--mpirun: '$dir/none' is not an executable file" -n 2 --mpirun "$dir/none" -- train
err "--mpirun: 'no-such-mpirun' not found in PATH" -n 2 --mpirun no-such-mpirun -- train
err "unknown flag '--nodes'" -n 2 --nodes 2 -- train
err "--hosts needs a value" -n 2 --hosts
err "other than launch" -n 2 -- launch -n 2 -- train
err "--connect-timeout expects whole seconds" -n 2 --hosts h1:2 --connect-timeout -1 -- train
err "--connect-timeout expects whole seconds" -n 2 --hosts h1:2 --connect-timeout 1.5 -- train
err "--connect-timeout expects whole seconds" -n 2 --hosts h1:2 --connect-timeout=soon -- train
err "--connect-timeout needs a value" -n 2 --connect-timeout
out=$(PATH=/nonexistent "$bin" launch -n 2 -- train 2>&1); rc=$?
[ $rc = 2 ] && [[ $out == *"mpirun: 'mpirun' not found in PATH"* ]] && pass "no mpirun in PATH (rc 2): $out" \
  || fail "missing mpirun: rc $rc $out"

out_has "simulate-nodes" "$bin" launch --help && pass "--help" || fail "--help"
out_has "launch" "$bin" --help && pass "launch in dtrain --help" || fail "dtrain --help lacks launch"

echo "test_launch: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
