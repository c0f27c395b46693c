#!/usr/bin/env bash
# Hierarchical vs flat all-reduce across 2 simulated hosts x 2 ranks (scripts/mnhosts.sh:
# network namespaces, TCP between them, each host its own /dev/shm), with every host's link
# shaped by tc's token bucket to each RATE in turn. One `dtrain bench comm` per rate:
# allreduce_ordered (hierarchical: shared memory inside each host, one copy of each part down
# the chain of hosts and back) and allreduce_ordered_mpi (the same call over MPI alone: flat),
# measured in the same run; the script prints both and their ratio per size.
#   bash bench/hier.sh build/dtrain [RATE...]     (default: 1gbit 10gbit 25gbit; root)
# Env: MIN (default 4M), MAX (default 32M), ITERS (default 5).
set -euo pipefail
bin=$(readlink -f "${1:-build/dtrain}")
shift || true
rates=("$@")
[ ${#rates[@]} -eq 0 ] && rates=(1gbit 10gbit 25gbit)
src=$(cd "$(dirname "$0")/.." && pwd)
mn=$src/scripts/mnhosts.sh
export MN_PREFIX=dtmnb- MN_STATE=${TMPDIR:-/tmp}/dtrain-mn-bench
trap '"$mn" down >/dev/null 2>&1 || true' EXIT
"$mn" up 2 >/dev/null
echo "# host: $(grep -o -w 'avx512[a-z_0-9]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores; 2 hosts x 2 ranks, links shaped with tc tbf"
for rate in "${rates[@]}"; do
  for h in h1 h2; do
    "$mn" exec "$h" tc qdisc replace dev mn0 root tbf rate "$rate" burst 1mbit latency 100ms
  done
  out=$("$mn" mpirun --host h1:2,h2:2 -n 4 -x OMP_NUM_THREADS=1 "$bin" bench comm --min-bytes "${MIN:-4M}" \
        --max-bytes "${MAX:-32M}" --iters "${ITERS:-5}" 2>&1) || { echo "FAILED at $rate: $(tail -3 <<<"$out")"; exit 1; }
  echo "## link $rate"
  printf '# %-10s %-14s %-14s %-8s\n' size hier_busbw flat_busbw ratio
  awk '$1 == "allreduce_ordered" {h[$2] = $6} $1 == "allreduce_ordered_mpi" {f[$2] = $6}
       END {for (s in h) if (s in f) printf "  %-10d %-14.3f %-14.3f %-8.2f\n", s, h[s], f[s], h[s] / f[s]}' <<<"$out" | sort -n
  grep -q "over the node's shared memory" <<<"$out" || echo "# warning: no shared memory on the hosts"
done
