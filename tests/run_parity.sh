#!/usr/bin/env bash
# PyTorch parity: parity_dump writes dtrain's weights, batches and results; the PyTorch
# oracle (Debian's python3-torch, float64) rebuilds the model and compares.
set -euo pipefail
dump=$1
out=$2
# GPT-2, then LLaMA with grouped-query attention and an untied head, then LLaMA with
# multi-query attention and a tied head (tests/ref/llama_torch.py), then LLaMA with a mixture of
# experts and both router losses (tests/ref/mixtral_torch.py), dropless, with a capacity, and with the
# layer-wise load-balancing loss (training.moe_aux_loss_type=layer), then ViT (tests/ref/vit_torch.py),
# in fp32; then mixed precision (training.precision): bf16 for every family, fp16 (with its loss
# scaling) for GPT-2 and LLaMA, against the float64 emulation of dtrain's 16-bit matmuls
# (tests/ref/mixed_ref.py) and, for bf16, torch.autocast (MIXED_NOTE, AUTOCAST_NOTE in
# tests/ref/gpt2_ref.py). One oracle process checks every directory: importing torch is most of
# an oracle run's time.
rc=0
dirs=()
for run in gpt2 llama llama-mqa mixtral mixtral-cap mixtral-layer vit \
           gpt2:bf16 llama:bf16 llama-mqa:bf16 vit:bf16 gpt2:fp16 llama:fp16; do
  fam=${run%%:*}
  prec=fp32
  [[ $run == *:* ]] && prec=${run#*:}
  dir=$out/$fam
  [[ $prec != fp32 ]] && dir=$out/$fam-$prec
  rm -rf "$dir" && mkdir -p "$dir"
  echo "== parity_dump $fam $prec"
  if OMP_NUM_THREADS=2 "$dump" "$dir" "$fam" "$prec" > "$dir/parity_dump.log" 2>&1; then
    dirs+=("$dir")
  else
    cat "$dir/parity_dump.log"
    echo "FAIL parity_dump $fam $prec"
    rc=1
  fi
done
if ((${#dirs[@]})); then
  /usr/bin/python3 "$(dirname "$0")/ref/gpt2_ref.py" "${dirs[@]}" || rc=1
fi
exit $rc
