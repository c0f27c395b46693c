#!/usr/bin/env bash
# Hugging Face tokenizer.json parity: dtrain's hf tokenizer (through tests/bpe_encode.c) against
# the npm packages llama-tokenizer-js 1.2.2 (Llama 2), mistral-tokenizer-js 1.0.0 (Mistral)
# and llama3-tokenizer-js 1.2.0 (Llama 3). tests/ref/hftok_ref.mjs writes each package's
# vocabulary and merges as a tokenizer.json in the hub's layout, which dtrain then reads; both
# encode a Unicode torture text (tests/ref/gen_hftok_torture.js: invalid bytes included) and
# a large text (README, docs/*.md and 2 MB of tests/ref/gen_bpe_corpus.js); the ids must be
# identical, serial and on 2 threads, and dtrain's decode must equal the package's decode of
# the same ids (Llama 3: also the text itself, as the package reads it).
#   run_hftok_parity.sh BPE_ENCODE WORKDIR
# The packages are installed once into WORKDIR/npm and reused. Without node the test fails
# (scripts/install-deps.sh installs it); exit 77 (skipped) only when the npm registry cannot
# be reached, and under CI=true not even then (tests/lib.sh: skip).
set -euo pipefail
enc=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
. "$here/lib.sh"
test_name=test_hftok_parity # the CTest name
npmdir=$work/npm
ref="node $here/ref/hftok_ref.mjs"
pkgs=(llama-tokenizer-js@1.2.2 mistral-tokenizer-js@1.0.0 llama3-tokenizer-js@1.2.0)

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "node/npm not found (scripts/install-deps.sh installs nodejs and npm)"
  exit 1
fi
mkdir -p "$work"
for p in "${pkgs[@]}"; do
  if ! grep -qs "\"version\": \"${p#*@}\"" "$npmdir/node_modules/${p%@*}/package.json"; then
    npm install --prefix "$npmdir" "${pkgs[@]}" --no-audit --no-fund --loglevel=error \
      || skip "cannot install ${pkgs[*]} from the npm registry"
    break
  fi
done
rm -f "$work"/*.ids "$work"/*.dec "$work"/*.txt "$work"/*.json

node "$here/ref/gen_hftok_torture.js" "$work/torture.txt" 320 # > 256 KB: the parallel encoder cuts it
node "$here/ref/gen_bpe_corpus.js" "$work/corpus.txt" 2 >/dev/null
cat "$root/README.md" "$root"/docs/*.md "$work/corpus.txt" > "$work/large.txt"
$ref text "$work/torture.txt" "$work/torture.read.txt"
export OMP_NUM_THREADS=2

status=0
for model in llama2 mistral llama3; do
  json=$work/$model.json
  $ref export $model "$npmdir" "$json"
  for text in torture large; do
    in=$work/$text.txt
    echo "== $model, $text text ($(wc -c < "$in") bytes)"
    $ref encode $model "$npmdir" "$in" "$work/$model.$text.ref.ids"
    "$enc" -d "$work/$model.$text.dec" "$json" "$in" "$work/$model.$text.serial.ids" | grep -v '^#'
    "$enc" -t 2 "$json" "$in" "$work/$model.$text.parallel.ids" | grep -v '^#'
    echo -n "serial encoder vs reference: "
    $ref compare $model "$npmdir" "$work/$model.$text.ref.ids" "$work/$model.$text.serial.ids" || status=1
    echo -n "parallel encoder (2 threads) vs reference: "
    $ref compare $model "$npmdir" "$work/$model.$text.ref.ids" "$work/$model.$text.parallel.ids" || status=1
    $ref decode $model "$npmdir" "$work/$model.$text.ref.ids" "$work/$model.$text.ref.dec"
    if cmp "$work/$model.$text.ref.dec" "$work/$model.$text.dec"; then
      echo "decode: identical to the package's ($(wc -c < "$work/$model.$text.dec") bytes)"
    else
      echo "decode: DIFFERS from the package's"; status=1
    fi
  done
  if [ $model = llama3 ]; then # byte-level: decode(encode(text)) is the text as read
    if cmp "$work/torture.read.txt" "$work/llama3.torture.dec"; then
      echo "llama3 round trip: decode(encode(torture)) == torture (invalid bytes as U+FFFD)"
    else
      echo "llama3 round trip: DIFFERS"; status=1
    fi
  fi
done
[ $status -eq 0 ] && echo "tokenizer.json parity: OK" || echo "tokenizer.json parity: FAILED"
exit $status
