#!/usr/bin/env bash
# fuzz/run.sh BUILD_DIR [SECONDS] [TARGET...] - runs each libFuzzer harness of BUILD_DIR/fuzz
# for SECONDS (default 60) on one core, starting from its seed corpus fuzz/corpus/<target>.
# New coverage goes to BUILD_DIR/fuzz/work/<target>, crashes to BUILD_DIR/fuzz/artifacts/.
# Prints one summary line per target (seconds, executions, coverage) and fails on a finding.
set -uo pipefail
build=$1
secs=${2:-60}
shift $(( $# >= 2 ? 2 : $# ))
src=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=($(cd "$build/fuzz" && ls fuzz_* 2>/dev/null | sed 's/^fuzz_//'))
[ ${#targets[@]} -eq 0 ] && { echo "no fuzz_* in $build/fuzz (build with CC=clang -DFUZZ=ON)"; exit 1; }
export OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
bad=0
printf "# %-12s %8s %12s %10s %8s %s\n" target seconds execs exec/s cov result
for t in "${targets[@]}"; do
  work=$build/fuzz/work/$t art=$build/fuzz/artifacts
  mkdir -p "$work" "$art"
  log=$build/fuzz/$t.log
  start=$(date +%s)
  "$build/fuzz/fuzz_$t" "$work" "$src/corpus/$t" -max_total_time="$secs" -max_len=16384 \
      -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 -artifact_prefix="$art/$t-" > "$log" 2>&1
  rc=$?
  end=$(date +%s)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  result=ok; [ $rc -ne 0 ] && { result="FINDING (see $log)"; bad=1; }
  printf "  %-12s %8d %12s %10s %8s %s\n" "$t" $((end - start)) "${execs:-?}" \
    "$(( ${execs:-0} / (end - start > 0 ? end - start : 1) ))" "${cov:-?}" "$result"
done
exit $bad
