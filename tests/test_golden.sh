#!/usr/bin/env bash
# Stored reference hashes: a fixed training run per model family (gpt2, llama, vit) and per
# kernel path the host has (scalar, avx2, avx512; neon on aarch64) must reproduce the losses,
# the final weights and the Adam moments that the reviewed code produced, bit for bit. Any
# change of numerics (kernel order, init, data order, optimizer) fails here until the hash
# in tests/ref/golden.txt is deliberately updated (bash tests/test_golden.sh BIN DIR --update,
# on a host with every path of its architecture: it refuses to drop a stored line).
#
# The runs use DTRAIN_MATMUL=ref (plain loops): oneDNN's GEMM blocking is tuned per CPU, the
# reference matmul is not, so with the portable build and -ffp-contract=off a path's
# arithmetic is the same on every CPU that has it (an AVX-512 Zen 4, Xeon or EPYC computes
# the avx512 hash alike). A path the host lacks is named and not checked (a host has scalar
# and, on x86-64, avx2 at least). Two threads, as everywhere in the tests (the sums are split
# over rows only, so the thread count does not matter either).
set -uo pipefail
bin=$1
dir=$2
update=${3:-}
ref=$(cd "$(dirname "$0")" && pwd)/ref/golden.txt
rm -rf "$dir" && mkdir -p "$dir"
. "$(dirname "$0")/lib.sh"

# run NAME ISA ARGS...: trains on kernel path ISA, prints "NAME ISA SHA256" over the loss
# sequence and the final model and optimizer files.
run() {
  local name=$1 isa=$2; shift 2
  local d="$dir/$name-$isa"
  if ! DTRAIN_ISA=$isa DTRAIN_MATMUL=ref OMP_NUM_THREADS=2 "$bin" train "$@" \
      --set checkpoint.dir="$d" >"$d.log" 2>&1; then
    fail "$name on $isa: training failed: $(tail -3 "$d.log")"
    return 1
  fi
  grep -q "^vm:0 kernels $isa " "$d.log" || { fail "$name: ran on another path than $isa: $(grep kernels "$d.log")"; return 1; }
  local step
  step=$(cat "$d/latest")
  if [ ! -f "$d/$step/model.safetensors" ]; then
    fail "$name on $isa: no final checkpoint in $d"
    return 1
  fi
  local h
  h=$( { grep '"type":"step"' "$d/metrics.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/';
         sha256sum <"$d/$step/model.safetensors"; cat "$d/$step"/optim-rank*.safetensors |
         sha256sum; } | sha256sum | cut -c1-64)
  echo "$name $isa $h"
}

# The paths this binary and CPU can run: a path the CPU lacks is refused in one line.
paths=()
for isa in scalar avx2 avx512 neon; do
  if DTRAIN_ISA=$isa "$bin" train --set training.steps=1 --set checkpoint.dir= --set logging.peak_gflops=1 \
      >"$dir/isa-$isa.log" 2>&1; then
    paths+=("$isa")
  fi
done
echo "kernel paths on this host: ${paths[*]}"

cases=(
  "gpt2-tiny --set model.preset=gpt2-tiny --set training.steps=30 --set training.grad_accum=2 --set checkpoint.every=30"
  "llama-tiny --set model.preset=llama-tiny --set training.steps=10 --set training.grad_accum=2 --set checkpoint.every=10"
  "vit-tiny --set model.preset=vit-tiny --set training.steps=10 --set training.grad_accum=2 --set checkpoint.every=10"
)

out="$dir/golden.txt"
: >"$out"
for c in "${cases[@]}"; do
  read -r -a args <<<"$c"
  for isa in "${paths[@]}"; do
    run "${args[0]}" "$isa" "${args[@]:1}" >>"$out" || true
  done
done

if [ "$update" = --update ]; then
  # every stored line must be computed again: a host without a path cannot drop its hashes
  while read -r name isa want; do
    grep -q "^$name $isa " "$out" || { echo "--update: this host cannot compute $name on $isa; not updated"; exit 1; }
  done <"$ref"
  cp "$out" "$ref"
  echo "updated $ref:"; cat "$ref"
  exit 0
fi

checked=0
while read -r name isa want; do
  if [[ " ${paths[*]} " != *" $isa "* ]]; then
    echo "note: $name on $isa: this host has no $isa path (not checked here)"
    continue
  fi
  got=$(awk -v n="$name" -v i="$isa" '$1 == n && $2 == i {print $3}' "$out")
  checked=$((checked + 1))
  if [ -z "$got" ]; then
    fail "$name on $isa: no hash computed"
  elif [ "$got" = "$want" ]; then
    pass "$name on $isa: losses, weights and moments as stored ($want)"
  else
    fail "$name on $isa: numerics changed: $got, stored $want (if deliberate: --update, and say why in the commit)"
  fi
done <"$ref"
# every computed family and path has a stored hash, and at least scalar of each family was checked
while read -r name isa h; do
  grep -q "^$name $isa " "$ref" || fail "$name on $isa: no stored hash (run --update on a host with every path)"
done <"$out"
for c in "${cases[@]}"; do
  n=${c%% *}
  grep -q "^$n scalar " "$ref" || fail "$n: no stored scalar hash"
done
[ $checked -ge ${#cases[@]} ] || fail "only $checked stored hashes checked"
# The hash must see a change: the first case with one more seed bit gives another hash.
read -r -a args <<<"${cases[0]}"
other=$(run "${args[0]}-seed" "${paths[-1]}" "${args[@]:1}" --set training.seed=1338 | cut -d' ' -f3)
first=$(awk -v i="${paths[-1]}" '$1 == "gpt2-tiny" && $2 == i {print $3}' "$out")
if [ -n "$other" ] && [ "$other" != "$first" ]; then
  pass "a different seed changes the hash"
else
  fail "the hash did not change with the seed ($other)"
fi
echo "$test_name: $fails failure(s)"
[ $fails -eq 0 ]
