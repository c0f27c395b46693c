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
#
# env: MN_STATE  state directory (default /tmp/dtrain-mn)
#      MN_PREFIX namespace name prefix (default dtmn-), so that `down` only ever touches
#                namespaces this harness made, and other users' h1, h2... are left alone
#      MN_NET    first three octets of the /24 inside the namespaces (default 10.79.0)
# Failure detection is fast: OOB keepalive 5 s + 3 x 2 s and tcp_retries2=5 in every host,
# so a cut link aborts a job in about 10 s instead of hanging for 8 minutes.
set -euo pipefail
SELF=$(readlink -f "$0")
export MN_STATE=${MN_STATE:-/tmp/dtrain-mn} MN_PREFIX=${MN_PREFIX:-dtmn-} MN_NET=${MN_NET:-10.79.0}
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
  rm -rf "$ST/hosts"
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

sub=${1:-}
[ $# -gt 0 ] && shift
case $sub in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  exec) cmd_exec "$@" ;;
  rsh) cmd_rsh "$@" ;;
  mpirun) cmd_mpirun "$@" ;;
  hosts) hosts ;;
  *) sed -n '2,25p' "$SELF" >&2; exit 2 ;;
esac
