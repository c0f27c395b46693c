#!/usr/bin/env bash
# LoRA against PyTorch (tests/ref/lora_ref.py, float64, LoRA written from the paper): lora_dump
# writes the frozen base, the adapters (lora_B non-zero), one batch and dtrain's loss and
# adapter gradients for LLaMA (grouped-query attention, untied head, every target; multi-query,
# tied head, q,v) and GPT-2 (q,k,v,o,up,down on the fused c_attn; k,v). Then the oracle's
# self-test: a corrupted adapter gradient must fail the comparison.
set -euo pipefail
dump=$1
out=$2
rc=0
dirs=()
for c in llama llama-mqa gpt2 gpt2-kv; do
  dir=$out/$c
  rm -rf "$dir" && mkdir -p "$dir"
  if OMP_NUM_THREADS=2 "$dump" "$dir" "$c" > "$dir/lora_dump.log" 2>&1; then
    dirs+=("$dir")
  else
    cat "$dir/lora_dump.log"
    echo "FAIL lora_dump $c"
    rc=1
  fi
done
ref="$(dirname "$0")/ref/lora_ref.py"
/usr/bin/python3 "$ref" "${dirs[@]}" || rc=1
/usr/bin/python3 "$ref" --self-test "$out/llama" || rc=1
exit $rc
