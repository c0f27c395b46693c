#!/usr/bin/env bash
# Mixed precision and activation checkpointing, every number a ratio to fp32 without
# checkpointing measured in the same run (one process, all cores):
#   for each workload, training.precision fp32|bf16 x memory.activation_checkpointing
#   none|selective|full (with the fused loss, the default), and first fp32 `stored` (no
#   checkpointing, memory.fused_loss=false: the logits of the whole micro-batch stored, as
#   before the fused loss): median step tokens/s, the allocator's activation bytes, and both as
#   ratios to the workload's first row.
#   bash bench/precision.sh build/dtrain [workload...]   (default: gpt2:4:256 llama-100m:4:256 vit-b16:8:0)
#   a workload is MODEL:MICRO_BATCH:SEQ (SEQ 0: the model's own, e.g. one image)
# Env: STEPS (timed steps, default 6), WARMUP (default 2), PRECISIONS (default "fp32 bf16"),
#      MODES (default "stored none selective full"; stored = none with memory.fused_loss=false).
set -euo pipefail
bin=${1:-build/dtrain}
shift || true
work=("$@")
[ ${#work[@]} -eq 0 ] && work=(gpt2:4:256 llama-100m:4:256 vit-b16:8:0)
steps=${STEPS:-6}
warmup=${WARMUP:-2}
read -r -a precs <<<"${PRECISIONS:-fp32 bf16}"
read -r -a modes <<<"${MODES:-stored none selective full}"
echo "# host: $(grep -o -w 'avx512[a-z_0-9]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, STEPS=$steps WARMUP=$warmup"
for w in "${work[@]}"; do
  IFS=: read -r model b seq <<<"$w"
  seqarg=(); [ "$seq" != 0 ] && seqarg=(--seq "$seq")
  echo "## $model, micro-batch $b${seqarg[1]:+, seq $seq}"
  printf '# %-6s %-10s %-10s %-10s %-10s %-12s %-10s\n' prec ckpt tokens/s speed step_ms act_MiB act_ratio
  base_t="" base_a=""
  for p in "${precs[@]}"; do
    for r in "${modes[@]}"; do
      ck=$r fused=true
      [ "$r" = stored ] && { ck=none fused=false; [ "$p" = "${precs[0]}" ] || continue; }
      out=$("$bin" bench --model "$model" --batch "$b" "${seqarg[@]}" --warmup-steps "$warmup" --bench-steps "$steps" \
            --repeats 1 --peak 210 --set training.precision="$p" --set memory.activation_checkpointing="$ck" \
            --set memory.fused_loss="$fused" 2>&1) ||
        { echo "FAILED: $model $p $r: $(tail -2 <<<"$out")"; continue; }
      row=$(grep -A1 '^# median_ms' <<<"$out" | tail -1)
      med=$(awk '{print $1}' <<<"$row")
      tps=$(awk '{print $5}' <<<"$row")
      act=$(grep -A1 '^# rank  *params' <<<"$out" | tail -1 | awk '{print $5}')
      [ -z "$base_t" ] && base_t=$tps base_a=$act
      printf '  %-6s %-10s %-10s %-10s %-10s %-12s %-10s\n' "$p" "$r" "$tps" \
        "$(awk -v a="$tps" -v b="$base_t" 'BEGIN{printf "%.2f", a/b}')" "$med" "$act" \
        "$(awk -v a="$act" -v b="$base_a" 'BEGIN{printf "%.2f", a/b}')"
    done
  done
done
