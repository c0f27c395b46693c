#!/usr/bin/env bash
# PyTorch parity: parity_dump writes dtrain's weights, batches and results; the PyTorch
# oracle (Debian's python3-torch, float64) rebuilds the model and compares.
set -euo pipefail
dump=$1
out=$2
# GPT-2, then LLaMA with grouped-query attention and an untied head, then LLaMA with
# multi-query attention and a tied head (tests/ref/llama_torch.py), then ViT (tests/ref/vit_torch.py).
rc=0
for fam in gpt2 llama llama-mqa vit; do
  rm -rf "$out/$fam" && mkdir -p "$out/$fam"
  echo "== $fam"
  OMP_NUM_THREADS=2 "$dump" "$out/$fam" "$fam" || { echo "FAIL parity_dump $fam"; rc=1; continue; }
  /usr/bin/python3 "$(dirname "$0")/ref/gpt2_ref.py" "$out/$fam" || rc=1
done
exit $rc
