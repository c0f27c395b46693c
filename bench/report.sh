#!/usr/bin/env bash
# Runs the benchmark suite of the scaling report and renders it:
#   bench-small on 1 and 2 ranks with DDP, ZeRO-1 and ZeRO-3 (dtrain bench --json), one
#   bucket-size and one micro-batch variant at 2 ranks, 1 rank with 2 accumulation steps (the
#   strong-scaling baseline and a bitwise loss check), and bench comm on 2 ranks; then
#   dtrain report over all of them.
#
#   bash bench/report.sh [--bin build/dtrain] [--out docs/report] [--quick] [--report-only]
#
#   --bin PATH      the dtrain binary (default build/dtrain)
#   --out DIR       results (DIR/json/*.json) and the page (DIR/report.html); default docs/report
#   --quick         2 warm-up, 5 measured steps, 2 repeats (a smoke run, not numbers to publish)
#   --report-only   skip the benchmarks; render DIR/json/*.json again
# Env: STEPS (default 50), WARMUP (10), REPEATS (3), THREADS (OpenMP threads per rank, 1),
#      SEQ (tokens per sequence, 256),
#      MEM_BUDGET (passed to dtrain report --mem-budget, e.g. 2GiB; default unset).
# A screenshot for the docs: chromium --headless --no-sandbox --screenshot=DIR/report.png
#   --window-size=1440,2600 file://$PWD/DIR/report.html
set -euo pipefail
bin=build/dtrain out=docs/report only=0
steps=${STEPS:-50} warmup=${WARMUP:-10} repeats=${REPEATS:-3} threads=${THREADS:-1} seq=${SEQ:-256}
while [ $# -gt 0 ]; do
  case $1 in
  --bin) bin=$2; shift 2 ;;
  --out) out=$2; shift 2 ;;
  --quick) steps=5 warmup=2 repeats=2; shift ;;
  --report-only) only=1; shift ;;
  -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "bench/report.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$bin" ] || { echo "bench/report.sh: no dtrain binary at $bin (build it, or --bin PATH)" >&2; exit 2; }
mkdir -p "$out/json"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=$threads
mpi=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS)

# bench NAME RANKS [dtrain bench flags...]: one result file DIR/json/NAME.json
bench() {
  local name=$1 n=$2; shift 2
  local cmd=("$bin" bench --model bench-small --seq "$seq" --threads "$threads" --warmup-steps "$warmup"
             --bench-steps "$steps" --repeats "$repeats" --json "$out/json/$name.json" "$@")
  echo "== $name ($n rank(s)): ${cmd[*]}"
  if [ "$n" -eq 1 ]; then "${cmd[@]}"; else "${mpi[@]}" -n "$n" "${cmd[@]}"; fi
}

if [ $only -eq 0 ]; then
  rm -f "$out"/json/*.json
  bench ddp-w1        1 --batch 8
  bench ddp-w1-acc2   1 --batch 8 --set training.grad_accum=2
  bench zero1-w1      1 --batch 8 --set parallel.strategy=zero1
  bench zero3-w1      1 --batch 8 --set parallel.strategy=zero3
  bench ddp-w2        2 --batch 8 --set parallel.strategy=ddp
  bench zero1-w2      2 --batch 8 --set parallel.strategy=zero1
  bench zero3-w2      2 --batch 8 --set parallel.strategy=zero3
  bench ddp-w2-bk4    2 --batch 8 --set parallel.strategy=ddp --set parallel.bucket_mb=4
  bench ddp-w2-mb4    2 --batch 4 --set training.grad_accum=2 --set parallel.strategy=ddp
  echo "== comm (2 ranks)"
  "${mpi[@]}" -n 2 "$bin" bench comm --json "$out/json/comm-w2.json"
fi
budget=()
[ -n "${MEM_BUDGET:-}" ] && budget=(--mem-budget "$MEM_BUDGET")
"$bin" report "$out"/json/*.json -o "$out/report.html" "${budget[@]}"
