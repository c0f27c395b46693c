#!/usr/bin/env bash
# The shared-memory ordered all-reduce against this host's memcpy and against MPI, in one run
# (issue 14: busbw >= 6 GB/s at >= 4 MiB with 2 ranks on a host whose memcpy runs at 16.7 GB/s,
# i.e. >= 35% of the host's memcpy). One thread's memcpy (bench_memcpy: 64 MiB, best of 10)
# before and after `mpirun -n RANKS dtrain bench comm`, then per size: dtrain's ordered
# all-reduce over shared memory, the same call over MPI, MPI's own (unordered) all-reduce, all
# busbw GB/s, and the shared-memory one as a fraction of memcpy (the lower of the two memcpy
# runs' best, so a fast spell in one of them does not flatter the ratio).
#   bash bench/shm.sh build          (the build directory holding dtrain and bench_memcpy)
# Env: RANKS (default 2), ITERS (default 10), MIN (default 1M), MAX (default 64M).
set -euo pipefail
build=${1:-build}
for b in dtrain bench_memcpy; do
  [ -x "$build/$b" ] || { echo "bench/shm.sh: $build/$b is missing (cmake --build $build)" >&2; exit 2; }
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "# host: $(grep -o -w 'avx512[a-z_0-9]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, ${RANKS:-2} ranks"
m1=$("$build/bench_memcpy")
mpirun --oversubscribe --bind-to none -n "${RANKS:-2}" -x OMP_NUM_THREADS=1 "$build/dtrain" bench comm \
  --min-bytes "${MIN:-1M}" --max-bytes "${MAX:-64M}" --iters "${ITERS:-10}" --json "$out/comm.json" >"$out/comm.log" 2>&1 ||
  { echo "bench comm failed: $(tail -3 "$out/comm.log")" >&2; exit 1; }
m2=$("$build/bench_memcpy")
echo "# before: $m1"
echo "# after:  $m2"
python3 - "$out/comm.json" "$m1" "$m2" <<'PY'
import json, re, sys
rows = json.load(open(sys.argv[1]))["rows"]
best = min(float(re.search(r"best ([0-9.]+)", m).group(1)) for m in sys.argv[2:4])
bw = {}
for r in rows:
    if r.get("group", "world") == "world": bw[(r["op"], r["bytes"])] = r["busbw_gbs"]
print(f"# memcpy (lower best): {best:.2f} GB/s")
print(f"# {'size':>8} {'shm ordered':>12} {'MPI ordered':>12} {'MPI own':>9} {'shm/memcpy':>11} {'shm/MPI ordered':>16}")
for b in sorted({k[1] for k in bw}):
    s, m, o = bw.get(("allreduce_ordered", b)), bw.get(("allreduce_ordered_mpi", b)), bw.get(("allreduce", b))
    if s is None or m is None or o is None: continue
    print(f"  {b / 2**20:6.0f}Mi {s:12.2f} {m:12.2f} {o:9.2f} {s / best:11.0%} {s / m:15.2f}x")
PY
