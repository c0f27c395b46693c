#!/usr/bin/env bash
# dtrain launch --hosts to a host that never answers (issue 37): a TCP server on a spare
# loopback address that accepts and never speaks SSH. Real ssh and mpirun; no root, no sshd
# (ssh is pointed at the server's port through the user's own plm_rsh_args, which the
# launcher keeps in front of its options). Checked:
#  - plain and supervised launch: returns within the deadline (measured, < 20 s), non-zero,
#    one line naming the host; no ssh, mpirun or dtrain of the test left behind;
#  - SIGTERM or SIGHUP to the launcher during the start-up, and mpirun killed (-9) during it:
#    the launcher returns at once and leaves no ssh behind;
#  - a host that answers (an ssh stand-in running the command here) next to the silent one:
#    only the silent one is named; alone it runs, and the ranks' start-up reports are not
#    seen in the output;
#  - item 7: a configuration error under `dtrain launch -n 2` is one line, without mpirun's
#    abort banner; a runtime failure shows the ranks' lines only.
set -uo pipefail
bin=$(readlink -f "$1")
dir=$2
rm -rf "$dir" && mkdir -p "$dir/tmp"
. "$(dirname "$0")/lib.sh"
unset OMPI_MCA_plm_rsh_agent OMPI_MCA_orte_rsh_agent OMPI_MCA_pls_rsh_agent OMPI_MCA_plm_rsh_args DTRAIN_NODE_ID
export OMP_NUM_THREADS=1 TMPDIR=$dir/tmp   # the launcher's ssh marks directory goes here
for t in ssh mpirun python3; do command -v $t >/dev/null || skip "'$t' is not installed"; done

# A spare loopback address (Linux routes all of 127/8 to lo) and a free port on it.
H=127.$((100 + RANDOM % 100)).$((RANDOM % 250 + 1)).$((RANDOM % 250 + 2))
SILENT_HOST=$H python3 -c '
import os, socket, sys, time
s = socket.socket(); s.bind((os.environ["SILENT_HOST"], 0)); s.listen(64)
print(s.getsockname()[1], flush=True)
held = []
while True:
    c, _ = s.accept(); held.append(c)        # accepts and never says a word
' >"$dir/port" 2>"$dir/server.err" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 1 100); do [ -s "$dir/port" ] && break; sleep 0.05; done
port=$(cat "$dir/port")
[ -n "$port" ] || { echo "FAIL: silent server did not start: $(cat "$dir/server.err")"; exit 1; }
# The user's own ssh options come first and win (ssh keeps an option's first value): the
# port, and a ConnectTimeout longer than the deadline, so it is the launcher that stops ssh.
export OMPI_MCA_plm_rsh_args="-p $port -o ConnectTimeout=120 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
echo "silent host $H:$port"

ms() { date +%s%3N; }
left() { pgrep -af -- "$H" | grep -v "^$server " || true; }   # processes of this test still there
no_leftovers() { # LABEL
  local l
  l=$(left)
  [ -z "$l" ] && pass "$1: nothing left behind" || fail "$1: left behind: $l"
  l=$(ls -d "$TMPDIR"/dtrain-launch-* 2>/dev/null)   # (a killed mpirun's own ompi.* may stay)
  [ -z "$l" ] && pass "$1: marks directory removed" || fail "$1: left $l"
}
ssh_pid() { pgrep -f -- "ssh .*$H" | head -1; }
wait_for_ssh() { for _ in $(seq 1 200); do [ -n "$(ssh_pid)" ] && return 0; sleep 0.05; done; return 1; }

# 1. The deadline: plain launch.
t0=$(ms)
"$bin" launch -n 2 --hosts "$H:2" --connect-timeout 3 -- train --steps 1 >"$dir/plain.out" 2>"$dir/plain.err"
rc=$?
el=$(($(ms) - t0))
echo "plain launch to the silent host: rc $rc after $el ms; stderr: $(cat "$dir/plain.err")"
if [ $rc = 1 ] && [ $el -ge 2900 ] && [ $el -lt 20000 ] && [ "$(wc -l <"$dir/plain.err")" = 1 ] &&
   grep -q "dtrain launch: host $H did not answer within 3 s (--connect-timeout)" "$dir/plain.err"; then
  pass "silent host: rc 1 after $el ms (deadline 3 s), one line naming $H"
else
  fail "silent host: rc $rc after $el ms, stderr: $(cat "$dir/plain.err")"
fi
no_leftovers "deadline"

# 2. The same under the supervisor: the attempt fails naming the host, restarts are bounded.
t0=$(ms)
"$bin" launch -n 1 --hosts "$H" --connect-timeout 2 --max-restarts 1 --backoff 0.1 -- train >"$dir/sv.out" 2>"$dir/sv.err"
rc=$?
el=$(($(ms) - t0))
n=$(grep -c "job failed after .*: host $H did not answer within 2 s (--connect-timeout)" "$dir/sv.err")
if [ $rc != 0 ] && [ "$n" = 2 ] && [ $el -lt 20000 ]; then
  pass "supervised: both attempts name $H, rc $rc after $el ms"
else
  fail "supervised: rc $rc after $el ms, $n naming lines: $(cat "$dir/sv.err")"
fi
no_leftovers "supervised deadline"

# 3. SIGTERM to the launcher while ssh hangs: it returns at once (nothing to checkpoint yet).
"$bin" launch -n 1 --hosts "$H" --connect-timeout 60 -- train >"$dir/term.out" 2>"$dir/term.err" &
lp=$!
if wait_for_ssh; then
  args=$(tr '\0' ' ' <"/proc/$(ssh_pid)/cmdline" 2>/dev/null)
  [[ $args == *"-p $port -o ConnectTimeout=120 "*"-o ConnectTimeout=60 -o BatchMode=yes -o ServerAliveInterval=15"* ]] \
    && pass "ssh gets the user's options first, then ConnectTimeout, BatchMode, ServerAliveInterval" \
    || fail "ssh's arguments: $args"
  t0=$(ms)
  kill -TERM $lp
  wait $lp
  rc=$?
  el=$(($(ms) - t0))
  [ $rc = 143 ] && [ $el -lt 10000 ] && grep -q "signal 15 (Terminated) before all ranks had started (0 of 1)" "$dir/term.err" \
    && pass "SIGTERM during the start-up: rc 143 after $el ms" || fail "SIGTERM: rc $rc after $el ms: $(cat "$dir/term.err")"
else
  fail "no ssh to $H appeared: $(cat "$dir/term.err")"
  kill -KILL $lp
  wait $lp
fi
no_leftovers "SIGTERM mid-start"

# 4. SIGHUP (the terminal went away) during the start-up.
"$bin" launch -n 1 --hosts "$H" --connect-timeout 60 -- train >"$dir/hup.out" 2>"$dir/hup.err" &
lp=$!
wait_for_ssh
kill -HUP $lp
wait $lp
rc=$?
[ $rc = 129 ] && pass "SIGHUP during the start-up: rc 129" || fail "SIGHUP: rc $rc: $(cat "$dir/hup.err")"
no_leftovers "SIGHUP mid-start"

# 5. mpirun killed during the start-up (the old way to an orphaned ssh): the launcher ends it.
"$bin" launch -n 1 --hosts "$H" --connect-timeout 60 -- train >"$dir/k9.out" 2>"$dir/k9.err" &
lp=$!
wait_for_ssh
mp=$(pgrep -f -- "mpirun .*--host $H" | head -1)
kill -KILL "$mp"
wait $lp
rc=$?
[ $rc = 137 ] && pass "mpirun killed during the start-up: rc 137" || fail "mpirun -9: rc $rc: $(cat "$dir/k9.err")"
no_leftovers "mpirun killed mid-start"

# 6. A host that answers next to the silent one. An ssh stand-in (first in PATH, so Open MPI
# still takes it for ssh and the launcher adds its options) runs LocalCommand as ssh does once
# a session is up, then the command here; the silent host goes to the real ssh.
G=127.$((100 + RANDOM % 100)).$((RANDOM % 250 + 1)).1
mkdir -p "$dir/fakebin"
cat >"$dir/fakebin/ssh" <<EOF
#!/bin/sh
for a in "\$@"; do case \$a in $H) exec $(command -v ssh) "\$@" ;; esac; done
lc=""
while [ \$# -gt 0 ]; do
  case \$1 in
    -o) case \$2 in LocalCommand=*) lc=\${2#LocalCommand=} ;; esac; shift 2 ;;
    -p|-i|-l|-F) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=\$1; shift
[ -n "\$lc" ] && sh -c "\$(printf '%s' "\$lc" | sed "s/%n/\$host/g")"
exec sh -c "\$*"
EOF
chmod +x "$dir/fakebin/ssh"
PATH=$dir/fakebin:$PATH "$bin" launch -n 2 --hosts "$G:1,$H:1" --connect-timeout 3 -- --version >"$dir/mixed.out" 2>"$dir/mixed.err"
rc=$?
if [ $rc = 1 ] && grep -q "host $H did not answer within 3 s" "$dir/mixed.err" && ! grep -q "$G" "$dir/mixed.err"; then
  pass "$G answers, $H does not: only $H is named"
else
  fail "mixed hosts: rc $rc: $(cat "$dir/mixed.err")"
fi
no_leftovers "mixed hosts"
PATH=$dir/fakebin:$PATH "$bin" launch -n 2 --hosts "$G:2" --connect-timeout 10 -- --version >"$dir/good.out" 2>"$dir/good.err"
rc=$?
[ $rc = 0 ] && [ "$(grep -c '^dtrain ' "$dir/good.out")" = 2 ] && [ ! -s "$dir/good.err" ] \
  && pass "a host that answers: both ranks run, no start-up report in the output" \
  || fail "good host: rc $rc, out $(cat "$dir/good.out"), err $(cat "$dir/good.err")"

# 7. Item 7: a rank's own error line is not followed by mpirun's banners.
(cd "$dir" && "$bin" launch -n 2 -- train --set nosuch.key=1 >/dev/null 2>"$dir/cfg.err")
rc=$?
if [ $rc = 2 ] && [ "$(wc -l <"$dir/cfg.err")" = 1 ] && grep -q "unknown key 'nosuch.key'" "$dir/cfg.err"; then
  pass "config error under launch -n 2: rc 2, one line: $(cat "$dir/cfg.err")"
else
  fail "config error under launch: rc $rc: $(cat "$dir/cfg.err")"
fi
(cd "$dir" && "$bin" launch -n 2 -- train --set data.train="$dir/none.bin" --steps 1 >/dev/null 2>"$dir/run.err")
rc=$?
if [ $rc = 1 ] && ! grep -qE "MPI_ABORT|Primary job|mpirun detected|help message|ORTE_ERROR_LOG|^-----" "$dir/run.err" &&
   grep -q "none.bin: cannot open" "$dir/run.err"; then
  pass "runtime failure under launch -n 2: rc 1, the ranks' lines only ($(wc -l <"$dir/run.err") lines)"
else
  fail "runtime failure under launch: rc $rc: $(cat "$dir/run.err")"
fi

echo "test_launch_deadline: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
