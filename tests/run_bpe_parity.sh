#!/usr/bin/env bash
# GPT-2 BPE parity: dtrain's tokenizer (through tests/bpe_encode.c) against the reference, the
# npm package gpt-3-encoder 1.1.4, on a few MB of generated text (tests/ref/gen_bpe_corpus.js):
# the pre-tokenizer's pieces and the ids compared one for one (serial and parallel encoders),
# plus the decode round trip.
#   run_bpe_parity.sh BPE_ENCODE WORKDIR
# The package is installed once into WORKDIR/npm and reused. Without node the test fails
# (scripts/install-deps.sh installs it); exit 77 (skipped) only when the npm registry cannot
# be reached, and under CI=true not even then (tests/lib.sh: skip).
set -euo pipefail
enc=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
test_name=test_bpe_parity # the CTest name
npmdir=$work/npm
pkg=$npmdir/node_modules/gpt-3-encoder

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "node/npm not found (scripts/install-deps.sh installs nodejs and npm)"
  exit 1
fi
mkdir -p "$work"
if ! grep -qs '"version": "1.1.4"' "$pkg/package.json"; then
  npm install --prefix "$npmdir" gpt-3-encoder@1.1.4 --no-audit --no-fund --loglevel=error \
    || skip "cannot install gpt-3-encoder@1.1.4 from the npm registry"
fi
rm -f "$work"/*.ids "$work"/*.pieces "$work/corpus.txt"

corpus=$work/corpus.txt
node "$here/ref/gen_bpe_corpus.js" "$corpus" 3
node "$here/ref/bpe_ref.js" encode "$npmdir" "$corpus" "$work/ref.ids"
node "$here/ref/bpe_ref.js" pieces "$npmdir" "$corpus" "$work/ref.pieces"
"$enc" -p "$corpus" "$work/dtrain.pieces"
export OMP_NUM_THREADS=2
"$enc" -r 3 -c "$pkg" "$corpus" "$work/serial.ids"
"$enc" -r 3 -t 2 "$pkg" "$corpus" "$work/parallel.ids" | grep -v '^#'

status=0
echo "pre-tokenizer pieces vs the reference regex:"
node "$here/ref/bpe_ref.js" compare-pieces "$npmdir" "$corpus" "$work/ref.pieces" "$work/dtrain.pieces" || status=1
echo "serial encoder vs reference:"
node "$here/ref/bpe_ref.js" compare "$npmdir" "$corpus" "$work/ref.ids" "$work/serial.ids" || status=1
echo "parallel encoder (2 threads) vs reference:"
node "$here/ref/bpe_ref.js" compare "$npmdir" "$corpus" "$work/ref.ids" "$work/parallel.ids" || status=1
[ $status -eq 0 ] && echo "BPE parity: OK" || echo "BPE parity: FAILED"
exit $status
