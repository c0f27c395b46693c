#!/usr/bin/env bash
# Top-K gradient compression against none on slow links (issue 14's table in
# docs/benchmarks.md): 2 simulated hosts x 2 ranks (scripts/mnhosts.sh), every host's link
# shaped by tc's token bucket to each RATE in turn; per rate, `dtrain bench` of a
# 10.6M-parameter GPT (bench-small with 4 layers and a vocabulary of 8192, micro-batch 2 x 64,
# DDP, 1 thread a rank) with parallel.compression=none and topk (ratio 0.01, the default
# compression_adam), the two alternated REPEATS times (this machine drifts: a ratio is only
# worth its alternations). Prints per rate and mode the mean step over the repeats, tokens/s,
# bytes per step (rank 0) and exposed communication (rank 0), then topk's step time and bytes
# as ratios to none's.
#   bash bench/compress.sh build/dtrain [RATE...]     (default: 1gbit 10gbit; root)
# Env: STEPS (4 timed steps a run), WARMUP (2), REPEATS (2), OUT (keep the files there).
set -euo pipefail
bin=$(readlink -f "${1:-build/dtrain}")
shift || true
rates=("$@")
[ ${#rates[@]} -eq 0 ] && rates=(1gbit 10gbit)
steps=${STEPS:-4} warmup=${WARMUP:-2} repeats=${REPEATS:-2}
for v in "$steps" "$warmup" "$repeats"; do
  [[ $v =~ ^[1-9][0-9]*$ ]] || { echo "compress.sh: STEPS, WARMUP and REPEATS must be whole numbers >= 1 (got '$v')"; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "compress.sh: needs root (network namespaces and tc, scripts/mnhosts.sh)"; exit 2; }
src=$(cd "$(dirname "$0")/.." && pwd)
mn=$src/scripts/mnhosts.sh
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
export MN_PREFIX=dtmnz- MN_STATE=${TMPDIR:-/tmp}/dtrain-mn-compress
trap '"$mn" down >/dev/null 2>&1 || true' EXIT
"$mn" down >/dev/null 2>&1 || true # what a killed earlier run may have left
"$mn" up 2 >/dev/null
echo "# host: $(grep -o -w 'avx512[a-z_0-9]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores; 2 hosts x 2 ranks, links shaped with tc tbf; $steps steps after $warmup, $repeats alternation(s); files in $out"
model=(--model bench-small --set model.n_layer=4 --set model.vocab_size=8192 --seq 64 --batch 2)
for rate in "${rates[@]}"; do
  for h in h1 h2; do
    "$mn" exec "$h" tc qdisc replace dev mn0 root tbf rate "$rate" burst 1mbit latency 100ms
  done
  for r in $(seq 1 "$repeats"); do
    for mode in none topk; do
      id=$rate-$mode-$r
      "$mn" mpirun --host h1:2,h2:2 -n 4 -x OMP_NUM_THREADS=1 "$bin" bench "${model[@]}" --bench-steps "$steps" \
        --warmup-steps "$warmup" --repeats 1 --peak 100 --set parallel.compression="$mode" \
        --json "$out/$id.json" >"$out/$id.log" 2>&1 ||
        { echo "FAILED at $rate $mode (repeat $r): $(tail -3 "$out/$id.log")"; exit 1; }
    done
  done
done
python3 - "$out" "$repeats" "${rates[@]}" <<'PY'
import json, os, statistics, sys
out, repeats, rates = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"# {'link':8} {'mode':5} {'step_s':>8} {'tokens/s':>9} {'bytes/step':>12} {'exposed_s':>9}   per repeat: step_s")
for rate in rates:
    res = {}
    for mode in ("none", "topk"):
        runs = [json.load(open(os.path.join(out, f"{rate}-{mode}-{r}.json"))) for r in range(1, repeats + 1)]
        su = [j["summary"] for j in runs]
        res[mode] = {k: statistics.mean(s[k]["mean"] if isinstance(s[k], dict) else s[k] for s in su)
                     for k in ("step_s", "tokens_per_s", "comm_bytes_step", "comm_exposed_s")}
        m = res[mode]
        each = " ".join(f"{s['step_s']['mean']:.3f}" for s in su)
        print(f"  {rate:8} {mode:5} {m['step_s']:8.3f} {m['tokens_per_s']:9.0f} {m['comm_bytes_step']:12,.0f} "
              f"{m['comm_exposed_s']:9.3f}   {each}")
    n, t = res["none"], res["topk"]
    print(f"# {rate}: topk step time {t['step_s'] / n['step_s']:.3f}x none's (speed-up {n['step_s'] / t['step_s']:.2f}x), "
          f"bytes {n['comm_bytes_step'] / t['comm_bytes_step']:.1f}x fewer")
PY
