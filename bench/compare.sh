#!/usr/bin/env bash
# dtrain vs PyTorch (fp32, same model, optimizer, batch and thread count), measured one
# after the other in the same run and reported as a ratio of tokens/s.
#   bash bench/compare.sh build/dtrain [WORKLOAD ...]
# Workloads: bench-small (micro-batch 8) and gpt2 (micro-batch 4), context 256, 2 threads.
# Env: STEPS (timed steps, default 5), WARMUP (default 2), THREADS (default 2); DTRAIN_ISA
# (scalar|avx2|avx512|neon) forces dtrain's kernel path (and caps its oneDNN); with
# DTRAIN_ISA=avx2 PyTorch is capped alike (ATen AVX2 kernels, OpenBLAS Haswell kernels,
# oneDNN AVX2): both sides then run as on an AVX2-only CPU. Each workload's row is followed
# by the kernel path that ran, the share of the step spent in non-matmul kernels (everything
# but matmul, lm_head and communication waits) and dtrain's per-kernel table.
set -euo pipefail
bin=${1:-build/dtrain}
shift || true
workloads=("$@")
[ ${#workloads[@]} -eq 0 ] && workloads=(bench-small gpt2)
steps=${STEPS:-5}
warmup=${WARMUP:-2}
threads=${THREADS:-2}
here=$(cd "$(dirname "$0")" && pwd)

peer_env=()
if [ "${DTRAIN_ISA:-}" = avx2 ]; then
  peer_env=(ATEN_CPU_CAPABILITY=avx2 OPENBLAS_CORETYPE=Haswell DNNL_MAX_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=AVX2)
  echo "# DTRAIN_ISA=avx2: PyTorch runs with ${peer_env[*]}"
fi
printf '# %-12s %-6s %-5s %-8s %-14s %-14s %-8s %-8s\n' workload batch seq threads \
  dtrain_tok/s pytorch_tok/s ratio MFU_%
for w in "${workloads[@]}"; do
  case $w in
    bench-small) b=8 ;;
    gpt2) b=4 ;;
    *) b=${BATCH:-4} ;;
  esac
  out=$(OMP_NUM_THREADS=$threads "$bin" bench --model "$w" --batch "$b" --seq 256 --lr 3e-4 \
        --threads "$threads" --warmup-steps "$warmup" --bench-steps "$steps")
  row=$(grep -A1 '^# median_ms' <<<"$out" | tail -1)
  d_tps=$(awk '{print $5}' <<<"$row")
  mfu=$(awk '{print $7}' <<<"$row")
  p_json=$(env "${peer_env[@]}" /usr/bin/python3 "$here/pytorch_gpt2.py" --model "$w" --batch "$b" --seq 256 \
           --threads "$threads" --warmup "$warmup" --steps "$steps" --json)
  p_tps=$(/usr/bin/python3 -c 'import json,sys; print("%.1f" % json.loads(sys.argv[1])["tokens_per_s"])' "$p_json")
  ratio=$(awk -v a="$d_tps" -v b="$p_tps" 'BEGIN{printf "%.2f", a/b}')
  printf '  %-12s %-6s %-5s %-8s %-14s %-14s %-8s %-8s\n' "$w" "$b" 256 "$threads" "$d_tps" \
    "$p_tps" "$ratio" "$mfu"
  echo "  [$w] $(grep -m1 '^# kernels ' <<<"$out" | sed 's/^# //')"
  share=$(sed -n '/^# kernel time per step/,/^# step breakdown/p' <<<"$out" \
          | awk '/^  [a-z_]+ / && $1 != "matmul" && $1 != "lm_head" && $1 != "grad_sync_wait" {s += $5} END {printf "%.1f", s}')
  echo "  [$w] non-matmul kernels: ${share}% of the step"
  sed -n '/^# kernel time per step/,/^# step breakdown/p' <<<"$out" | sed '$d' | sed "s/^/  [$w] /"
done
