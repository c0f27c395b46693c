#!/usr/bin/env bash
# dtrain vs PyTorch (fp32, same model, optimizer, batch and thread count), measured one
# after the other in the same run and reported as a ratio of tokens/s (images/s for ViT).
#   bash bench/compare.sh build/dtrain [WORKLOAD ...]
# Workloads (default: bench-small gpt2), 2 threads:
#   GPT-2  (peer bench/pytorch_gpt2.py):  bench-small (micro-batch 8), gpt2 (4), context 256;
#          gpt2-tiny (4, context 64)
#   LLaMA  (peer bench/pytorch_llama.py): llama-100m (micro-batch 4, context 256),
#          llama-tiny (4, context 64)
#   ViT    (peer bench/pytorch_vit.py):   vit-fashion, vit-tiny (micro-batch 64 images; no
#          context: a sample is one image)
# Any other preset name runs with micro-batch $BATCH (default 4) and context 256, its peer
# picked by name (llama-*/tinyllama-*/mistral-* LLaMA, vit-* ViT, else GPT-2).
# GPT-2 and LLaMA rows are in tokens/s under the '# workload batch seq ...' header; ViT rows
# are in images/s under their own '# workload batch pixels ... dtrain_img/s pytorch_img/s'
# header (printed whenever the unit changes from the row before), followed by a line with
# both sides' tokens/s, which dtrain counts as pixels/s for ViT.
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
unit=''    # unit of the last header printed: tok or img
for w in "${workloads[@]}"; do
  case $w in
    llama-*|tinyllama-*|mistral-*) family=llama ;;
    vit-*) family=vit ;;
    *) family=gpt2 ;;
  esac
  case $w in
    bench-small) b=8 s=256 ;;
    gpt2|llama-100m) b=4 s=256 ;;
    gpt2-tiny|llama-tiny) b=4 s=64 ;;
    vit-fashion|vit-tiny) b=64 s='' ;;
    *) b=${BATCH:-4} s=256 ;;
  esac
  [ "$family" = vit ] && s=''
  seq_args=()
  [ -n "$s" ] && seq_args=(--seq "$s")

  out=$(OMP_NUM_THREADS=$threads "$bin" bench --model "$w" --batch "$b" "${seq_args[@]}" --lr 3e-4 \
        --threads "$threads" --warmup-steps "$warmup" --bench-steps "$steps")
  row=$(grep -A1 '^# median_ms' <<<"$out" | tail -1)
  d_tps=$(awk '{print $5}' <<<"$row")
  mfu=$(awk '{print $7}' <<<"$row")
  p_json=$(env "${peer_env[@]}" /usr/bin/python3 "$here/pytorch_$family.py" --model "$w" --batch "$b" \
           "${seq_args[@]}" --threads "$threads" --warmup "$warmup" --steps "$steps" --json)
  p_tps=$(/usr/bin/python3 -c 'import json,sys; print("%.1f" % json.loads(sys.argv[1])["tokens_per_s"])' "$p_json")

  if [ "$family" = vit ]; then
    # dtrain's bench counts a ViT sample's pixels as its tokens: its summary row's tokens/s is
    # pixels/s; its header says '# a sample is one image of N pixel values'.
    px=$(sed -n 's/^# a sample is one image of \([0-9][0-9]*\) pixel values.*/\1/p' <<<"$out" | head -1)
    if [ -n "$px" ]; then
      d_ips=$(awk -v t="$d_tps" -v p="$px" 'BEGIN{printf "%.1f", t/p}')
    else   # fallback: the median column of the 'images/s global' statistics row
      d_ips=$(awk '$1 == "images/s" && $2 == "global" {print $6; exit}' <<<"$out")
      px=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.argv[1])["pixels_per_image"])' "$p_json")
    fi
    p_ips=$(/usr/bin/python3 -c 'import json,sys; print("%.1f" % json.loads(sys.argv[1])["images_per_s"])' "$p_json")
    ratio=$(awk -v a="$d_ips" -v b="$p_ips" 'BEGIN{printf "%.2f", a/b}')
    if [ "$unit" != img ]; then
      printf '# %-12s %-6s %-6s %-8s %-14s %-14s %-8s %-8s\n' workload batch pixels threads \
        dtrain_img/s pytorch_img/s ratio MFU_%
      unit=img
    fi
    printf '  %-12s %-6s %-6s %-8s %-14s %-14s %-8s %-8s\n' "$w" "$b" "$px" "$threads" "$d_ips" \
      "$p_ips" "$ratio" "$mfu"
    echo "  [$w] tokens/s (= pixels/s): dtrain $d_tps, pytorch $p_tps"
  else
    ratio=$(awk -v a="$d_tps" -v b="$p_tps" 'BEGIN{printf "%.2f", a/b}')
    if [ "$unit" != tok ]; then
      printf '# %-12s %-6s %-5s %-8s %-14s %-14s %-8s %-8s\n' workload batch seq threads \
        dtrain_tok/s pytorch_tok/s ratio MFU_%
      unit=tok
    fi
    printf '  %-12s %-6s %-5s %-8s %-14s %-14s %-8s %-8s\n' "$w" "$b" "$s" "$threads" "$d_tps" \
      "$p_tps" "$ratio" "$mfu"
  fi
  echo "  [$w] $(grep -m1 '^# kernels ' <<<"$out" | sed 's/^# //')"
  share=$(sed -n '/^# kernel time per step/,/^# step breakdown/p' <<<"$out" \
          | awk '/^  [a-z_]+ / && $1 != "matmul" && $1 != "lm_head" && $1 != "grad_sync_wait" {s += $5} END {printf "%.1f", s}')
  echo "  [$w] non-matmul kernels: ${share}% of the step"
  sed -n '/^# kernel time per step/,/^# step breakdown/p' <<<"$out" | sed '$d' | sed "s/^/  [$w] /"
done
