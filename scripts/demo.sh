#!/usr/bin/env bash
# make demo: tokenize the Debian `fortunes` corpus (byte tokenizer), train a small GPT on it
# for a few minutes with 2 data-parallel ranks (configs/demo.yaml), the validation loss
# printed as it falls, then sample from the final checkpoint.
set -euo pipefail
bin=${1:-build/dtrain}
cd "$(dirname "$0")/.."
corpus=/usr/share/games/fortunes
mapfile -t files < <(find "$corpus" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' \
                     ! -name '*art' | sort)
[ ${#files[@]} -gt 0 ] || { echo "demo: no fortune files in $corpus (install package fortunes)" >&2; exit 1; }
mkdir -p build/demo
rm -rf build/demo/ckpt
echo "== prepare: ${#files[@]} fortune files -> build/demo/fortunes_{train,val}_*.bin"
"$bin" prepare --tokenizer byte --doc-sep % --val-fraction 0.05 --out build/demo/fortunes "${files[@]}"
echo "== train: configs/demo.yaml (4 layers, d 192, byte vocabulary) on 2 ranks (DDP)"
"$bin" launch -n 2 -- train configs/demo.yaml --set logging.progress=lines
echo "== sample from build/demo/ckpt"
for prompt in "Q: What is the meaning of life?
A:" "The computer"; do
  "$bin" sample build/demo/ckpt --prompt "$prompt" --max-tokens 300 --temperature 0.8 --top-k 40 --seed 7
  echo "--"
done
