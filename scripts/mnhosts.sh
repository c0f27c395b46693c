#!/usr/bin/env bash
# mnhosts.sh - several "hosts" on one machine, for dtrain's multi-host tests (Linux, root).
#
# Host hK is network namespace ${MN_PREFIX}hK, address $MN_NET.K/24 on a bridge that lives in
# namespace ${MN_PREFIX}sw (no default route, nothing added to the root namespace). A command
# run "on" hK also gets, in a mount + UTS namespace of its own: hostname hK, an /etc/hosts
# naming h1..hN, resolv.conf pointing at 127.0.0.1 (no DNS waits), its own /dev/shm (so
# ranks on different hosts cannot share memory) and its own TMPDIR (Open MPI session
# directories). Everything else, the build tree included, is shared like an NFS home.
#
#   mnhosts.sh up N              create h1..hN (idempotent; undone if it fails half-way)
#   mnhosts.sh down              remove all of it, killing what runs inside (idempotent)
#   mnhosts.sh exec H CMD...     run CMD on host H (Open MPI's MCA settings for these hosts are
#                                exported, so mpirun or `dtrain launch --hosts` inside work)
#   mnhosts.sh mpirun ARGS...    mpirun on h1 ($MN_HEAD) across the hosts; ARGS name them:
#                                mnhosts.sh mpirun --host h1:2,h2:2 -n 4 ./prog
#   mnhosts.sh rsh [opts] H CMD  ssh stand-in that Open MPI uses (plm_rsh_agent) to start orted
#   mnhosts.sh hosts             the hosts that are up
#   mnhosts.sh slurm-up          start a Slurm cluster on the hosts that are up (restarts one
#                                already running): munged in this namespace with a path socket
#                                under $MN_STATE/slurm, slurmctld on h1, one slurmd per host;
#                                returns when every node is idle. Then e.g.
#                                mnhosts.sh exec h1 srun --mpi=pmix -N2 -n4 ./prog
#   mnhosts.sh slurm-down        stop it (running steps are killed); `down` does this too
#
# env: MN_STATE  state directory (default /tmp/dtrain-mn)
#      MN_PREFIX namespace name prefix (default dtmn-), so that `down` only ever touches
#                namespaces this harness made, and other users' h1, h2... are left alone
#      MN_NET    first three octets of the /24 inside the namespaces (default 10.79.0)
#      MN_CPUS   CPUs each Slurm node offers (default: this machine's, at least 2)
# Failure detection is fast: OOB keepalive 5 s + 3 x 2 s and tcp_retries2=5 in every host,
# so a cut link aborts a job in about 10 s instead of hanging for 8 minutes.
# Slurm (slurm-wlm slurmctld slurmd slurm-client munge): config, munge key, spool, state and
# logs in $MN_STATE/slurm (munged's socket in /run when user munge cannot reach that); no
# cgroups (proctrack/linuxproc, task/none), SlurmdTimeout 30;
# TmpFS and the tasks' TMPDIR are the host's own directory, like /tmp on separate machines.
# `exec` exports SLURM_CONF once slurm-up has written it.
set -euo pipefail
SELF=$(readlink -f "$0")
export MN_STATE=${MN_STATE:-/tmp/dtrain-mn} MN_PREFIX=${MN_PREFIX:-dtmn-} MN_NET=${MN_NET:-10.79.0}
# Absolute: the state directory goes into config files of daemons that run in /.
MN_STATE=$(readlink -m -- "$MN_STATE")
ST=$MN_STATE P=$MN_PREFIX NET=$MN_NET
die() { echo "mnhosts: $*" >&2; exit 1; }
# The prefix goes into a regex and into rm -rf globs: keep it to harmless characters.
[[ $P =~ ^[A-Za-z0-9_-]{1,20}$ ]] || die "MN_PREFIX must be 1-20 of [A-Za-z0-9_-] (got '$P')"
[[ $NET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "MN_NET must look like 10.79.0 (got '$NET')"

# Our namespaces only: exactly ${P}sw and ${P}h<digits>.
our_netns() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${P}(sw|h[0-9]+)\$" | sort -V || true; }
hosts() { our_netns | sed -n "s/^${P}\\(h[0-9]*\\)\$/\\1/p"; }

up_failed() {
  [ "$1" -eq 0 ] && return 0
  echo "mnhosts: up failed, cleaning up" >&2
  cmd_down >/dev/null 2>&1
}

cmd_up() {
  local n=${1:-2} k h ns
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] || die "up: N must be 1..250 (got '$n')"
  # Any failure from here on exits (set -e); the trap then removes the half-built hosts.
  trap 'up_failed $?' EXIT
  mkdir -p "$ST/hosts"
  if ! ip netns list | awk '{print $1}' | grep -qx "${P}sw"; then
    ip netns add "${P}sw"
    ip -n "${P}sw" link set lo up
    ip -n "${P}sw" link add br0 type bridge
    ip -n "${P}sw" link set br0 up
  fi
  for k in $(seq 1 "$n"); do
    h=h$k ns=$P$h
    # Plain directories in the shared state dir, not under /dev/shm: a command started from
    # inside another host (orted via rsh) sees that host's /dev/shm, not the real one.
    mkdir -p "$ST/hosts/$h/tmp" "$ST/hosts/$h/shm"
    chmod 1777 "$ST/hosts/$h/tmp" "$ST/hosts/$h/shm"
    { echo "127.0.0.1 localhost"; for i in $(seq 1 "$n"); do echo "$NET.$i h$i"; done; } >"$ST/hosts/$h/hosts"
    echo "nameserver 127.0.0.1" >"$ST/hosts/$h/resolv.conf"
    ip netns list | awk '{print $1}' | grep -qx "$ns" && continue
    ip netns add "$ns"
    # Both ends are created directly inside our namespaces: no name or address in the root one.
    ip link add "sw-$h" netns "${P}sw" type veth peer name mn0 netns "$ns"
    ip -n "${P}sw" link set "sw-$h" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$NET.$k/24" dev mn0
    ip -n "$ns" link set mn0 up
    # Per-namespace sysctl: data connections to a vanished host give up after ~10 s.
    nsenter --net="/run/netns/$ns" sysctl -qw net.ipv4.tcp_retries2=5
  done
  trap - EXIT
}

cmd_down() {
  local ns p all="" i left
  cmd_slurm_down   # munged lives outside the namespaces: stop it first
  for ns in $(our_netns); do
    p=$(ip netns pids "$ns" 2>/dev/null || true)
    # shellcheck disable=SC2086 # $p is a list of pids
    if [ -n "$p" ]; then kill -9 $p 2>/dev/null || true; all="$all $p"; fi
    ip netns del "$ns" 2>/dev/null || true
  done
  for i in $(seq 1 50); do   # up to 5 s for the killed processes to be gone (or zombies)
    left=""
    for p in $all; do
      [ -e "/proc/$p" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$p/stat" 2>/dev/null && left="$left $p"
    done
    [ -z "$left" ] && break
    sleep 0.1
  done
  rm -rf "$ST/hosts" "$ST/slurm"
  rmdir "$ST" 2>/dev/null || true
  return 0
}

cmd_exec() {
  [ $# -ge 2 ] || die "usage: mnhosts.sh exec HOST CMD..."
  local h=$1; shift
  [[ $h =~ ^h[0-9]+$ ]] && [ -e "/run/netns/$P$h" ] || die "exec: no host '$h' (mnhosts.sh up N first)"
  export TMPDIR=$ST/hosts/$h/tmp
  export OMPI_MCA_plm_rsh_agent="$SELF rsh"
  export OMPI_MCA_oob_tcp_if_include=$NET.0/24 OMPI_MCA_btl_tcp_if_include=$NET.0/24
  export OMPI_MCA_btl=self,vader,tcp
  export OMPI_MCA_oob_tcp_keepalive_time=5 OMPI_MCA_oob_tcp_keepalive_intvl=2 OMPI_MCA_oob_tcp_keepalive_probes=3
  [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  if [ -f "$ST/slurm/slurm.conf" ]; then export SLURM_CONF=$ST/slurm/slurm.conf; fi
  # Not `ip netns exec`: it remounts /sys, which breaks cgroup users such as slurmd.
  # shellcheck disable=SC2016 # the inner script expands its own positional parameters
  exec nsenter --net="/run/netns/$P$h" unshare --mount --uts --propagation private -- /bin/sh -c '
    set -e
    h=$1 s=$2 w=$PWD; shift 2
    mount --bind "$s/hosts/$h/hosts" /etc/hosts
    if [ -e /etc/resolv.conf ]; then mount --bind "$s/hosts/$h/resolv.conf" /etc/resolv.conf; fi
    mount --bind "$s/hosts/$h/shm" /dev/shm
    hostname "$h"
    cd "$w" 2>/dev/null || cd /
    exec "$@"' mnhosts "$h" "$ST" "$@"
}

cmd_rsh() {  # rsh [ssh options] HOST WORDS... : what Open MPI runs to start orted on HOST
  while [ $# -gt 0 ]; do
    case $1 in
      -[1246AaCfgKkMNnqsTtVXxYy]) shift ;;   # ssh flags without a value
      -*) shift 2 ;;                         # ssh options with one (-o X, -p N, ...)
      *) break ;;
    esac
  done
  [ $# -ge 2 ] || die "rsh: usage: rsh HOST CMD..."
  local h=$1; shift
  cmd_exec "$h" /bin/sh -c "$*"
}

cmd_mpirun() {
  local root=()
  [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
  cmd_exec "${MN_HEAD:-h1}" mpirun "${root[@]}" --mca plm_rsh_agent "$SELF rsh" \
    --mca oob_tcp_if_include "$NET.0/24" --mca btl_tcp_if_include "$NET.0/24" --mca btl self,vader,tcp \
    --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3 "$@"
}

# ---- Slurm on the hosts -------------------------------------------------------------------
SD=$ST/slurm              # everything Slurm and munge: conf, key, socket, spool, state, logs
# munged's directory (key, socket, pid, seed, log) is $SD/munge when the munge user can reach
# it; otherwise (state under /root, say) one in /run named after the state directory.
MD_ST=$SD/munge MD_RUN=/run/mnhosts-munge.$(printf '%s' "$ST" | cksum | cut -d' ' -f1)
MD=$MD_ST
[ -S "$MD_RUN/munge.socket" ] && MD=$MD_RUN

# Our daemons only: munged started with our socket (found even when its pid file is gone), and
# slurmctld / slurmd / slurmstepd inside our namespaces.
our_munged() {
  local d p
  for d in /proc/[0-9]*; do
    [ "$(cat "$d/comm" 2>/dev/null)" = munged ] || continue
    tr '\0' '\n' 2>/dev/null <"$d/cmdline" |
      grep -qxF -e "--socket=$MD_ST/munge.socket" -e "--socket=$MD_RUN/munge.socket" && echo "${d#/proc/}"
  done
  return 0
}
our_slurm_pids() {  # [NAMES]: pids in our namespaces whose command is one of NAMES (regex)
  local re=${1:-slurmctld|slurmd|slurmstepd} ns p
  for ns in $(our_netns); do
    for p in $(ip netns pids "$ns" 2>/dev/null || true); do
      grep -qxE "$re" "/proc/$p/comm" 2>/dev/null && echo "$p"
    done
  done
  return 0
}
tree() {  # PID...: them and all processes below them
  local p c
  for p in "$@"; do
    echo "$p"
    for c in $(ps -o pid= --ppid "$p" 2>/dev/null || true); do tree "$c"; done
  done
  return 0
}
wait_gone() {  # SECONDS PID...: wait until the pids are gone or zombies; prints those left
  local t=$1 i p left=""; shift
  for i in $(seq 1 $((t * 10))); do
    left=""
    for p in "$@"; do
      [ -e "/proc/$p" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$p/stat" 2>/dev/null && left="$left $p"
    done
    [ -z "$left" ] && break
    sleep 0.1
  done
  echo "$left"
}

cmd_slurm_down() {
  local steps daemons left p
  # Job steps first, with their tasks (no cgroups here to find those later), then the daemons.
  # shellcheck disable=SC2046 # lists of pids, here and below
  steps=$(tree $(our_slurm_pids slurmstepd))
  # shellcheck disable=SC2086
  if [ -n "$steps" ]; then kill -9 $steps 2>/dev/null || true; fi
  daemons=$(our_slurm_pids 'slurmctld|slurmd')
  # shellcheck disable=SC2086
  if [ -n "$daemons" ]; then
    kill -TERM $daemons 2>/dev/null || true
    left=$(wait_gone 3 $daemons)
    [ -n "$left" ] && { kill -9 $left 2>/dev/null || true; wait_gone 2 $left >/dev/null; }
  fi
  # shellcheck disable=SC2046 # one a dying slurmd may have started meanwhile
  steps=$(tree $(our_slurm_pids slurmstepd))
  # shellcheck disable=SC2086
  if [ -n "$steps" ]; then kill -9 $steps 2>/dev/null || true; fi
  p=$(our_munged)
  # shellcheck disable=SC2086
  if [ -n "$p" ]; then
    kill -TERM $p 2>/dev/null || true
    left=$(wait_gone 3 $p)
    [ -n "$left" ] && { kill -9 $left 2>/dev/null || true; wait_gone 2 $left >/dev/null; }
  fi
  if [ -f "$MD_RUN/munged.log" ] && [ -d "$SD/log" ]; then cp "$MD_RUN/munged.log" "$SD/log/"; fi
  rm -rf "$SD/run" "$SD/spool" "$SD/state" "$MD_ST/munge.socket"* "$MD_RUN"
  return 0
}

slurm_up_failed() {
  [ "$1" -eq 0 ] && return 0
  echo "mnhosts: slurm-up failed; logs: $SD/log, $MD/munged.log" >&2
  tail -n 5 "$SD"/log/*.log "$MD/munged.log" >&2 2>/dev/null || true
  cmd_slurm_down
}

cmd_slurm_up() {
  local hs h t nodes cpus s=""
  hs=$(hosts)
  [ -n "$hs" ] || die "slurm-up: no hosts (mnhosts.sh up N first)"
  [ "$(id -u)" = 0 ] || die "slurm-up: needs root"
  for t in munged mungekey slurmctld slurmd sinfo srun; do
    PATH=$PATH:/usr/sbin:/sbin command -v "$t" >/dev/null ||
      die "slurm-up: '$t' not found (apt-get install --no-install-recommends slurm-wlm slurmctld slurmd slurm-client munge)"
  done
  id munge >/dev/null 2>&1 || die "slurm-up: no 'munge' user (is the munge package installed?)"
  cmd_slurm_down
  trap 'slurm_up_failed $?' EXIT
  rm -rf "$SD"
  mkdir -p "$SD"/{log,run,spool,state}
  # munged: its own key, socket, pid, seed and log; it insists on owning the directory and on
  # everybody being able to reach the socket (x on every parent directory).
  MD=$MD_ST
  runuser -u munge -- test -x "$SD" || MD=$MD_RUN
  [ ${#MD} -le 90 ] || die "slurm-up: munge socket path too long for a unix socket: $MD/munge.socket (use a shorter MN_STATE)"
  mkdir -p "$MD"
  PATH=$PATH:/usr/sbin mungekey --create --keyfile="$MD/munge.key"
  chown -R munge:munge "$MD"
  chmod 0755 "$MD"
  chmod 0600 "$MD/munge.key"
  runuser -u munge -- /usr/sbin/munged --socket="$MD/munge.socket" --key-file="$MD/munge.key" \
    --pid-file="$MD/munged.pid" --log-file="$MD/munged.log" --seed-file="$MD/munged.seed" ||
    die "slurm-up: munged did not start: $(tail -n 2 "$MD/munged.log" 2>/dev/null)"

  nodes=$(echo "$hs" | paste -sd,)
  cpus=${MN_CPUS:-$(nproc)}
  [ "$cpus" -ge 2 ] 2>/dev/null || cpus=2
  # Each task learns its host's TMPDIR (srun would otherwise pass on h1's).
  # shellcheck disable=SC2016 # $SLURMD_NODENAME is the prolog's
  printf '#!/bin/sh\necho "export TMPDIR=%s/hosts/$SLURMD_NODENAME/tmp"\n' "$ST" >"$SD/taskprolog.sh"
  chmod 755 "$SD/taskprolog.sh"
  {
    echo "# generated by mnhosts.sh slurm-up"
    echo "ClusterName=dtmn"
    echo "SlurmctldHost=h1($NET.1)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$MD/munge.socket"
    echo "MpiDefault=none"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "SlurmdParameters=config_overrides"
    echo "ReturnToService=2"
    echo "SlurmdTimeout=30"
    echo "SlurmctldTimeout=30"
    echo "MessageTimeout=5"
    echo "KillWait=5"
    echo "InactiveLimit=0"
    echo "MailProg=/bin/true"
    echo "SlurmctldPidFile=$SD/run/slurmctld.pid"
    echo "SlurmdPidFile=$SD/run/slurmd-%n.pid"
    echo "SlurmdSpoolDir=$SD/spool/%n"
    echo "StateSaveLocation=$SD/state"
    echo "SlurmctldLogFile=$SD/log/slurmctld.log"
    echo "SlurmdLogFile=$SD/log/slurmd-%n.log"
    echo "TmpFS=$ST/hosts/%n/tmp"
    echo "TaskProlog=$SD/taskprolog.sh"
    for h in $hs; do
      echo "NodeName=$h NodeAddr=$NET.${h#h} CPUs=$cpus RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=$nodes Default=YES MaxTime=INFINITE State=UP"
  } >"$SD/slurm.conf"
  for h in $hs; do mkdir -p "$SD/spool/$h"; done

  # Daemons fork into the background inside the host's namespaces; -c: no state from before.
  "$SELF" exec h1 /usr/sbin/slurmctld -c -f "$SD/slurm.conf"
  for h in $hs; do "$SELF" exec "$h" /usr/sbin/slurmd -f "$SD/slurm.conf"; done
  t=$((SECONDS + 30))
  while [ $SECONDS -lt $t ]; do
    s=$(timeout 5 "$SELF" exec h1 sinfo -h -o '%t' 2>/dev/null | sort -u | paste -sd' ') || true
    [ "$s" = idle ] && { trap - EXIT; return 0; }
    sleep 0.25
  done
  die "slurm-up: nodes not idle after 30 s (sinfo: '$s')"
}

sub=${1:-}
[ $# -gt 0 ] && shift
case $sub in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  exec) cmd_exec "$@" ;;
  rsh) cmd_rsh "$@" ;;
  mpirun) cmd_mpirun "$@" ;;
  hosts) hosts ;;
  slurm-up) cmd_slurm_up ;;
  slurm-down) cmd_slurm_down ;;
  *) sed -n '2,36p' "$SELF" >&2; exit 2 ;;
esac
