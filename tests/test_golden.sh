#!/usr/bin/env bash
# Stored reference hashes: a fixed training run per model family must reproduce the losses,
# the final weights and the Adam moments that the reviewed code produced, bit for bit. Any
# change of numerics (kernel order, init, data order, optimizer) fails here until the hash
# in tests/ref/golden.txt is deliberately updated (bash tests/test_golden.sh BIN DIR --update).
#
# The runs use the scalar kernels and DTRAIN_MATMUL=ref (plain loops): with the portable
# build and -ffp-contract=off that arithmetic is the same on every x86-64 CPU (AVX-512 or
# AVX2 hosts), which oneDNN's CPU-tuned GEMM blocking is not. Two threads, as everywhere in
# the tests (the sums are split over rows only, so the thread count does not matter either).
set -uo pipefail
bin=$1
dir=$2
update=${3:-}
ref=$(cd "$(dirname "$0")" && pwd)/ref/golden.txt
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "$0")/lib.sh"

# run NAME ARGS...: trains, prints "NAME SHA256" over the loss sequence and the final
# model and optimizer files.
run() {
  local name=$1; shift
  local d="$dir/$name"
  if ! DTRAIN_ISA=scalar DTRAIN_MATMUL=ref OMP_NUM_THREADS=2 "$bin" train "$@" \
      --set checkpoint.dir="$d" >"$d.log" 2>&1; then
    fail "$name: training failed: $(tail -3 "$d.log")"
    return 1
  fi
  local step
  step=$(cat "$d/latest")
  if [ ! -f "$d/$step/model.safetensors" ]; then
    fail "$name: no final checkpoint in $d"
    return 1
  fi
  local h
  h=$( { grep '"type":"step"' "$d/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/';
         sha256sum <"$d/$step/model.safetensors"; cat "$d/$step"/optim-rank*.safetensors |
         sha256sum; } | sha256sum | cut -c1-64)
  echo "$name $h"
}

cases=(
  "gpt2-tiny --set model.preset=gpt2-tiny --set training.steps=30 --set training.grad_accum=2 --set checkpoint.every=30"
)

out="$dir/golden.txt"
: >"$out"
for c in "${cases[@]}"; do
  read -r -a args <<<"$c"
  run "${args[@]}" >>"$out" || true
done

if [ "$update" = --update ]; then
  cp "$out" "$ref"
  echo "updated $ref:"; cat "$ref"
  exit 0
fi

while read -r name want; do
  got=$(awk -v n="$name" '$1 == n {print $2}' "$out")
  if [ -z "$got" ]; then
    fail "$name: no hash computed"
  elif [ "$got" = "$want" ]; then
    pass "$name: losses, weights and moments as stored ($want)"
  else
    fail "$name: numerics changed: $got, stored $want (if deliberate: --update, and say why in the commit)"
  fi
done <"$ref"
[ "$(wc -l <"$ref")" -ge 1 ] || fail "no stored hashes in $ref"
# The hash must see a change: the first case with one more seed bit gives another hash.
read -r -a args <<<"${cases[0]}"
other=$(run "${args[0]}-seed" "${args[@]:1}" --set training.seed=1338 | cut -d' ' -f2)
first=$(awk 'NR == 1 {print $2}' "$out")
if [ -n "$other" ] && [ "$other" != "$first" ]; then
  pass "a different seed changes the hash"
else
  fail "the hash did not change with the seed ($other)"
fi
echo "$test_name: $fails failure(s)"
[ $fails -eq 0 ]
