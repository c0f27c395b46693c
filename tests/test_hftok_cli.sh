#!/usr/bin/env bash
# dtrain prepare / train / sample with Hugging Face tokenizer.json files, end to end: bad files
# and missing flags refused with one line naming the file and key (exit 2); prepare with the
# Llama 3 file (128256 ids: uint32 shards, version 7) and the Llama 2 file (32000: uint16,
# version 1) writes [bos] ids eos with exactly the reference package's ids; a tiny model trains
# on each and `sample --hf-tokenizer` prints the prompt and continues it.
#   test_hftok_cli.sh DTRAIN WORKDIR PARITY_DIR
# PARITY_DIR is test_hftok_parity's work directory: its exported tokenizer.json files and npm
# packages (CTest runs that test first).
set -uo pipefail
bin=$1
dir=$2
par=$3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
rm -rf "$dir" && mkdir -p "$dir"
export OMP_NUM_THREADS=2
. "$here/lib.sh"

# expect_refused NAME TEXT... -- ARGS: exit 2 and one error line containing every TEXT (sample
# may log the checkpoint it loads first).
expect_refused() {
  local name=$1; shift
  local texts=()
  while [ "$1" != -- ]; do texts+=("$1"); shift; done
  shift
  "$bin" "$@" >"$dir/out" 2>"$dir/err"; local rc=$? ok=1
  for t in "${texts[@]}"; do grep "error:" "$dir/err" | grep -q -- "$t" || ok=0; done
  if [ $rc -eq 2 ] && [ $ok = 1 ] && [ "$(grep -c "error:" "$dir/err")" -eq 1 ]; then
    pass "$name: $(cat "$dir/err")"
  else
    fail "$name (rc=$rc, stderr: $(cat "$dir/err"))"
  fi
}

printf 'Hello world\n' >"$dir/t.txt"
bad=$dir/bad
mkdir -p "$bad"
printf '{"model": {"type": "BPE", "vocab": {"a": 0}' >"$bad/truncated.json"
printf '{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}' >"$bad/unigram.json"
printf '{"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"a": 0}}}' >"$bad/nomerges.json"
expect_refused "malformed JSON" "$bad/truncated.json" "not valid JSON" -- \
  prepare --tokenizer hf --hf-tokenizer "$bad/truncated.json" --out "$dir/x" "$dir/t.txt"
expect_refused "unsupported model type" "$bad/unigram.json" "model.type" "Unigram" -- \
  prepare --tokenizer hf --hf-tokenizer "$bad/unigram.json" --out "$dir/x" "$dir/t.txt"
expect_refused "missing merges" "$bad/nomerges.json" "model.merges" -- \
  prepare --tokenizer hf --hf-tokenizer "$bad/nomerges.json" --out "$dir/x" "$dir/t.txt"
expect_refused "missing tokenizer.json" "$bad/none.json" "cannot open" -- \
  prepare --tokenizer hf --hf-tokenizer "$bad/none.json" --out "$dir/x" "$dir/t.txt"
expect_refused "hf without its file" "--hf-tokenizer" -- prepare --tokenizer hf --out "$dir/x" "$dir/t.txt"
expect_refused "unknown tokenizer" "byte, gpt2 or hf" -- prepare --tokenizer llama --out "$dir/x" "$dir/t.txt"
[ -e "$dir/x_train_000000.bin" ] && fail "a refused prepare wrote a shard" || pass "no shard after a refusal"

# shard_ids SHARD OUT: the llm.c shard's version, then its tokens one a line.
shard_ids() {
  python3 - "$1" "$2" <<'EOF'
import struct, sys
b = open(sys.argv[1], 'rb').read()
h = struct.unpack('<256i', b[:1024])
assert h[0] == 20240520, 'magic'
w = {1: 'H', 7: 'I'}[h[1]]
ids = struct.unpack('<%d%s' % (h[2], w), b[1024:])
open(sys.argv[2], 'w').write('%d\n' % h[1] + ''.join('%d\n' % i for i in ids))
EOF
}

for f in llama2 llama3; do
  if [ ! -s "$par/$f.json" ]; then
    fail "$par/$f.json not found (test_hftok_parity exports it)"
    echo "test_hftok_cli: $fails failure(s)$(skipped)"
    exit 1
  fi
done

doc=$root/README.md
for m in "llama3 7 128000 128001 128256" "llama2 1 1 2 32000"; do
  set -- $m
  model=$1 version=$2 bos=$3 eos=$4 vocab=$5
  "$bin" prepare --tokenizer hf --hf-tokenizer "$par/$model.json" --val-fraction 0 --out "$dir/$model" "$doc" \
    >"$dir/$model.prep" 2>&1 || fail "prepare $model: $(cat "$dir/$model.prep")"
  node "$here/ref/hftok_ref.mjs" encode $model "$par/npm" "$doc" "$dir/$model.ref" >/dev/null
  { echo $version; echo $bos; cat "$dir/$model.ref"; echo $eos; } >"$dir/$model.want"
  shard_ids "$dir/${model}_train_000000.bin" "$dir/$model.got"
  if cmp -s "$dir/$model.want" "$dir/$model.got"; then
    pass "prepare $model: version $version shard = [bos] + the package's $(wc -l <"$dir/$model.ref") ids + [eos]"
  else
    fail "prepare $model: shard differs from version $version, [$bos] reference ids [$eos]"
  fi
  "$bin" train --set model.preset= --model.n_layer 1 --model.d_model 16 --model.n_head 2 \
    --model.vocab_size $vocab --model.context 32 --data "$dir/${model}_train_*.bin" --batch 2 --seq 32 \
    --steps 2 --set data.tokenizer=hf --set checkpoint.dir="$dir/$model.ckpt" --set logging.metrics= \
    --set logging.peak_gflops=100 >"$dir/$model.train" 2>&1 || fail "train $model: $(tail -2 "$dir/$model.train")"
  "$bin" sample "$dir/$model.ckpt" --hf-tokenizer "$par/$model.json" --prompt "Hello there" --max-tokens 8 \
    --seed 2 >"$dir/$model.sample" 2>"$dir/$model.sample.err"; rc=$?
  if [ $rc -eq 0 ] && [ "$(head -c 11 "$dir/$model.sample")" = "Hello there" ] && [ "$(wc -c <"$dir/$model.sample")" -gt 13 ]; then
    pass "sample $model: $(head -c 60 "$dir/$model.sample" | tr '\n' ' ')"
  else
    fail "sample $model (rc=$rc): $(cat "$dir/$model.sample" "$dir/$model.sample.err")"
  fi
done
expect_refused "sample of an hf model without its tokenizer.json" "--hf-tokenizer" -- sample "$dir/llama2.ckpt" --prompt hi
# A Hugging Face directory (config.json records dtrain_tokenizer "hf") with its own
# tokenizer.json: sample uses that file without the flag, the same text as with it.
"$bin" ckpt export --hf "$dir/llama2.ckpt" "$dir/llama2.hf" >/dev/null 2>&1 || fail "ckpt export --hf"
grep -q '"dtrain_tokenizer": "hf"' "$dir/llama2.hf/config.json" && pass "export records dtrain_tokenizer hf" \
  || fail "export: $(cat "$dir/llama2.hf/config.json")"
expect_refused "sample of an hf directory without tokenizer.json" "--hf-tokenizer" -- sample "$dir/llama2.hf" --prompt hi
cp "$par/llama2.json" "$dir/llama2.hf/tokenizer.json"
"$bin" sample "$dir/llama2.hf" --prompt "Hello there" --max-tokens 8 --seed 2 >"$dir/hfdir.sample" 2>/dev/null \
  && cmp -s "$dir/hfdir.sample" "$dir/llama2.sample" && pass "sample of an hf directory uses its tokenizer.json" \
  || fail "sample of an hf directory: $(cat "$dir/hfdir.sample")"
sed -i 's/"dtrain_tokenizer": "hf"/"dtrain_note": "none"/' "$dir/llama2.hf/config.json" # as the hub's files
"$bin" sample "$dir/llama2.hf" --prompt "Hello there" --max-tokens 8 --seed 2 >"$dir/hfdir2.sample" 2>/dev/null \
  && cmp -s "$dir/hfdir2.sample" "$dir/llama2.sample" && pass "sample of an hf directory without dtrain_tokenizer too" \
  || fail "sample of an hf directory without dtrain_tokenizer: $(cat "$dir/hfdir2.sample")"
expect_refused "sample with a bad tokenizer.json" "$bad/nomerges.json" "model.merges" -- \
  sample "$dir/llama2.ckpt" --hf-tokenizer "$bad/nomerges.json" --prompt hi
expect_refused "sample with a tokenizer larger than the model" "does not fit" -- \
  sample "$dir/llama2.ckpt" --hf-tokenizer "$par/llama3.json" --prompt hi

echo "test_hftok_cli: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
