# Shared by the shell tests: result lines and the failure count, the common set-up (the
# repository root, work directories, MPI's environment, run comparison, token files). Source
# it, then end with
#   echo "NAME: $fails failure(s)$(skipped)"; [ $fails -eq 0 ]
fails=0
skips=()
test_name=$(basename "$0" .sh)
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
# A missing dependency or privilege: the whole test is skipped (CTest SKIP_RETURN_CODE 77),
# named. Under CI=true a skip is a failure with the same message: CI must not go green on it.
skip() {
  if [ "${CI:-}" = true ]; then
    echo "FAIL $test_name: $* (CI=true: a skip is a failure)"
    exit 1
  fi
  echo "skip: $test_name: $*"
  exit 77
}
# The same for one case of a script that goes on: under CI=true it counts as a failure, so
# the script's final [ $fails -eq 0 ] fails; otherwise it is named now and in the summary.
skip_case() {
  if [ "${CI:-}" = true ]; then
    fail "$test_name: $* (CI=true: a skipped case is a failure)"
  else
    echo "skip: $test_name: $*"
    skips+=("$*")
  fi
}
# For the summary line: ", N case(s) skipped: ..." when there were any.
skipped() {
  [ ${#skips[@]} -eq 0 ] && return 0
  local s
  s=$(printf '%s; ' "${skips[@]}")
  printf ', %d case(s) skipped: %s' ${#skips[@]} "${s%; }"
}

# out_has PATTERN CMD...: CMD's whole stdout contains PATTERN (grep -E). Never write
# `CMD | grep -q` under pipefail: grep -q exits at the first match, CMD may then die of
# SIGPIPE and the pipeline fails although the text was there (CI failed on exactly that).
out_has() {
  local pat=$1 out; shift
  out=$("$@") || return 1
  grep -qE -- "$pat" <<<"$out"
}

# ---- set-up

# The repository's root (this file is tests/lib.sh); a script that set src before keeps it.
src=${src:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
# fresh_dir DIR: DIR emptied (made if missing) and made the working directory.
fresh_dir() { rm -rf "$1" && mkdir -p "$1" && cd "$1" || { echo "FAIL cannot make and enter $1"; exit 1; }; }
# tmp_dir [MKTEMP_ARGS...]: dir = a new temporary directory, removed when the script exits.
tmp_dir() {
  dir=$(mktemp -d "$@") || { echo "FAIL mktemp -d $*"; exit 1; }
  trap 'rm -rf "$dir"' EXIT
}
# mpi_env: MPI jobs allowed as root (containers), one OpenMP thread per rank; mpi = mpiexec
# oversubscribed and unbound (more ranks than cores), passing OMP_NUM_THREADS to the ranks.
mpi_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
  mpi=(mpiexec --oversubscribe --bind-to none -x OMP_NUM_THREADS)
}
# cmp_runs METRICS_A WEIGHTS_A METRICS_B WEIGHTS_B TOL [losses-only]: two runs' losses and
# final weights compared (tests/ref/compare_runs.py; TOL 0: bitwise); status 1 if they differ.
cmp_runs() { /usr/bin/python3 "$src/tests/ref/compare_runs.py" "$@"; }
# raw16_tokens FILE: 400 x 32 + 1 random tokens below 256 (numpy seed 7) as raw uint16, for
# data.format=raw16 runs of 32-token sequences.
raw16_tokens() {
  /usr/bin/python3 -c "
import sys
import numpy as np
np.random.default_rng(7).integers(0, 256, 400 * 32 + 1, dtype=np.uint16).tofile(sys.argv[1])" "$1"
}

# ---- kill tests (test_resume.sh, long/kill_storm.sh)

# "PID RANK" of each rank process of a running job whose command line contains MARK: the
# dtrain binary BIN running `train` with the MPI rank in its environment, started by the MPI
# launcher. Not mpirun (its command line holds the same words) nor dtrain launch: killing
# those is not a rank failure.
rank_pids() { # BIN MARK
  local exe p parent rank argv
  exe=$(readlink -f "$1")
  for p in $(pgrep -f -- "$2"); do
    [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$exe" ] || continue
    mapfile -d '' -t argv <"/proc/$p/cmdline" 2>/dev/null || continue
    [ "${argv[1]:-}" = train ] || continue
    parent=$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2>/dev/null)
    [ -n "$parent" ] && [ "$(readlink "/proc/$parent/exe" 2>/dev/null)" != "$exe" ] || continue
    rank=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$rank" ] && echo "$p $rank"
  done
}
# The last step a metrics file logged (0: none yet).
last_step() {
  local s
  s=$(grep -o '"type":"step","step":[0-9]*' "$1" 2>/dev/null | tail -1)
  s=${s##*:}
  echo "${s:-0}"
}
# Waits until an incarnation of the job whose ranks are none of OLD (" PID PID ") has logged
# a step >= STEP itself, then kill -9's one of its N ranks at random, at a random instant of
# the next DELAY_MS (so inside a step: its delay, compute, all-reduce or checkpoint save).
# Prints "PID RANK STEP" (STEP: the last step logged when it died); returns 1, printing
# why, if the job (LAUNCH_PID) ended or no rank could be killed.
kill_rank_at() { # BIN MARK METRICS N STEP DELAY_MS LAUNCH_PID OLD
  local bin=$1 mark=$2 m=$3 n=$4 step=$5 delay=$6 lp=$7 old=$8 lines=-1 ranks r fresh v
  while kill -0 "$lp" 2>/dev/null; do
    mapfile -t ranks < <(rank_pids "$bin" "$mark")
    fresh=1
    for r in "${ranks[@]}"; do case "$old" in *" ${r%% *} "*) fresh=0 ;; esac; done
    if [ ${#ranks[@]} -ne "$n" ] || [ $fresh = 0 ]; then lines=-1; sleep 0.02; continue; fi
    # Lines logged before these ranks were seen are the previous incarnation's.
    [ $lines -ge 0 ] || lines=$(cat "$m" 2>/dev/null | wc -l)
    if [ "$(cat "$m" 2>/dev/null | wc -l)" -le $lines ] || [ "$(last_step "$m")" -lt "$step" ]; then
      sleep 0.01
      continue
    fi
    sleep "$(printf '0.%03d' $((RANDOM % (delay + 1))))"
    v=${ranks[RANDOM % n]}
    r=$(last_step "$m")
    if kill -9 "${v%% *}" 2>/dev/null; then
      echo "$v $r"
      return 0
    fi
    echo "kill -9 ${v%% *} (rank ${v#* }) failed at step $r"
    return 1
  done
  echo "the job ended before a rank could be killed at step $step (last step logged: $(last_step "$m"))"
  return 1
}
