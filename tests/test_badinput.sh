#!/usr/bin/env bash
# Bad input that used to work but mislead (issue 37): each is refused with one line naming
# the file or key and the cause, and a non-zero exit where the run cannot be right.
#  - an empty YAML config (or one with no keys); a directory given as the config;
#  - a text file given as token data (named .bin: raw uint16 would take it); data.format=raw16
#    on an llm.c shard;
#  - training.batch not a multiple of micro_batch x ranks under 2 ranks names 2 ranks;
#  - non-finite weights in model.init_from (train and eval) name the tensor and the file;
#  - training.nonfinite=skip with every step skipped exits non-zero;
#  - a loss far above ln(vocab) from step 1 (lr 9.9, no clipping) is a divergence;
#  - a tokenizer.json whose vocabulary is larger than the model's is refused before sampling.
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
export OMP_NUM_THREADS=2

# refused NAME RC EXPECTED_TEXT ARGS...: exit RC, stderr exactly one line, containing the text.
refused() {
  local name=$1 want_rc=$2 text=$3; shift 3
  "$bin" "$@" >"$dir/out" 2>"$dir/err"; local rc=$?
  if [ $rc -eq "$want_rc" ] && grep -qF -- "$text" "$dir/err" && [ "$(wc -l <"$dir/err")" -eq 1 ]; then
    pass "$name: $(cat "$dir/err")"
  else
    fail "$name (rc=$rc, want $want_rc; stderr: $(head -c 2000 "$dir/err"))"
  fi
}

# ---- configuration files
: >"$dir/empty.yaml"
refused "empty config" 2 "$dir/empty.yaml: the config file sets no keys" train "$dir/empty.yaml" --steps 2
printf '# only a comment\n' >"$dir/comments.yaml"
refused "config of comments" 2 "$dir/comments.yaml: the config file sets no keys" train "$dir/comments.yaml"
mkdir -p "$dir/conf.yaml"
refused "directory as config" 2 "$dir/conf.yaml: is a directory, not a config file" train "$dir/conf.yaml"

# ---- token files
for i in $(seq 200); do echo "The quick brown fox jumps over the lazy dog, line $i."; done >"$dir/corpus.bin"
[ $(($(stat -c %s "$dir/corpus.bin") % 2)) = 0 ] || echo >>"$dir/corpus.bin" # even: raw16 would take it
refused "text file as tokens (vocab 50304)" 1 \
  "$dir/corpus.bin: this is a text file, not tokens (" train --data "$dir/corpus.bin" --set model.vocab_size=50304 --steps 2
grep -qF "tokenize it first: dtrain prepare --out PREFIX $dir/corpus.bin" "$dir/err" \
  && pass "text file: the message names dtrain prepare" || fail "text file hint: $(cat "$dir/err")"
refused "text file as raw16" 1 "$dir/corpus.bin: this is a text file, not tokens" \
  train --data "$dir/corpus.bin" --set data.format=raw16 --steps 2
/usr/bin/python3 - "$dir/shard.bin" <<'PY'
import struct, sys
toks = [(i * 7 + i // 13) % 256 for i in range(5000)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
    f.write(struct.pack("<%dH" % len(toks), *toks))
PY
refused "raw16 on an llm.c shard" 1 \
  "$dir/shard.bin has an llm.c shard header (magic 20240520, version 1); use data.format=llmc (or auto), not raw16" \
  train --data "$dir/shard.bin" --set data.format=raw16 --steps 2
"$bin" train --data "$dir/shard.bin" --set data.format=llmc --steps 2 >"$dir/out" 2>&1 \
  && pass "the same shard trains with data.format=llmc" || fail "llmc shard: $(tail -2 "$dir/out")"

# ---- training.batch under 2 ranks: the message names the world size the run has
mpi_env
"${mpi[@]}" -n 2 "$bin" train --set training.batch=5 --steps 2 >"$dir/out" 2>"$dir/err"; rc=$?
line="training.batch (5) must be a multiple of training.micro_batch (4) x the world size (2 ranks) = 8"
if [ $rc -ne 0 ] && [ "$(grep -cF "$line" "$dir/err")" = 1 ] && [ "$(grep -c "training.batch" "$dir/err")" = 1 ]; then
  pass "training.batch=5 on 2 ranks (rc $rc): $line"
else
  fail "training.batch=5 on 2 ranks (rc $rc): $(grep -v '^-' "$dir/err" | head -5)"
fi
export OMP_NUM_THREADS=2

echo "test_badinput: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
