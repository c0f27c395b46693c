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

# ---- model.init_from with NaN/Inf weights: named at load (tensor, file), not "diverged; lower
# optimizer.lr" at step 1; eval and sample of them likewise (not "the model diverged").
"$bin" train --steps 2 --set logging.metrics= --save-weights "$dir/w.safetensors" >"$dir/out" 2>&1 \
  || fail "train for weights: $(tail -2 "$dir/out")"
/usr/bin/python3 - "$dir/w.safetensors" "$dir/nan.safetensors" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
off = 8 + n + json.loads(b[8:8 + n])["h.1.mlp.c_fc.weight"]["data_offsets"][0]
b[off + 20:off + 24] = struct.pack("<f", float("nan"))
b[off + 36:off + 40] = struct.pack("<f", float("inf"))
open(sys.argv[2], "wb").write(b)
PY
nanline="$dir/nan.safetensors: tensor h.1.mlp.c_fc.weight holds 2 non-finite values (the first, nan, at element 5 of 16384): the weights are damaged"
refused "model.init_from with NaN weights" 1 "$nanline" train --steps 2 --set model.init_from="$dir/nan.safetensors"
raw16_tokens "$dir/val.bin"
refused "eval of NaN weights" 1 "$nanline" eval "$dir/nan.safetensors" --data.val "$dir/val.bin" --set data.format=raw16
refused "sample of NaN weights" 1 "$nanline" sample "$dir/nan.safetensors" --prompt a
"$bin" train --steps 2 --set model.init_from="$dir/w.safetensors" >"$dir/out" 2>&1 \
  && pass "the same file without the NaN trains" || fail "init_from good weights: $(tail -2 "$dir/out")"

# ---- training.nonfinite=skip: a run that skipped every step trained nothing and fails (the
# loss made NaN in every step by a test aid); one skipped step of 3 is still a success. A
# static loss scale that every step overflows is said in a warning (test_compress.sh runs one).
# error_last NAME RC TEXT: the run exited RC and its only error line, the last, has TEXT.
error_last() {
  local name=$1 want_rc=$2 text=$3 rc=$4
  if [ "$rc" -eq "$want_rc" ] && tail -1 "$dir/err" | grep -qF -- "$text" && [ "$(grep -c "error:" "$dir/err")" = 1 ]; then
    pass "$name: $(tail -1 "$dir/err")"
  else
    fail "$name (rc=$rc, want $want_rc): $(tail -3 "$dir/err")"
  fi
}
DTRAIN_TEST_NAN=0:0 "$bin" train --steps 3 --set training.nonfinite=skip --set logging.metrics= >"$dir/out" 2>"$dir/err"
error_last "every step skipped (nonfinite=skip)" 1 "training.nonfinite=skip: every step was skipped (3 of 3, each for a non-finite loss or gradient norm): the run trained nothing" $?
DTRAIN_TEST_NAN=2:0 "$bin" train --steps 3 --set training.nonfinite=skip --set logging.metrics= >"$dir/out" 2>"$dir/err" \
  && grep -q "1 of 3 step(s) skipped" "$dir/out" && pass "one step of 3 skipped: exit 0" || fail "one skipped step: $(cat "$dir/err")"
DTRAIN_TEST_OVERFLOW=0:0 "$bin" train --steps 3 --set training.loss_scale=1024 --set logging.metrics= >"$dir/out" 2>"$dir/err" \
  && grep -q "warning: every step was skipped (3 of 3, each for gradients overflowing at the static training.loss_scale 1024): nothing was trained" "$dir/err" \
  && pass "every step overflowed at a static loss scale: a warning (overflows are the loss scale's)" \
  || fail "all steps overflowed: $(cat "$dir/err")"

# ---- a divergence from the first steps: lr 9.9 without clipping takes the loss from 5.56 to
# 3142 at step 2, before the median check has its 20 steps; the loss is held against ln(V)
# (5.5452 for 256 tokens) until then: reported at step 2 (log + metrics), and the run, still
# far above it at the end, fails. A spike at step 1 (test aid, x100) is reported; the run
# then trains normally and succeeds; a normal run reports none.
"$bin" train --steps 6 --lr 9.9 --set optimizer.grad_clip=0 --set logging.metrics="$dir/lr.jsonl" >"$dir/out" 2>"$dir/err"
rc=$?
error_last "lr 9.9 without clipping: the run diverged" 1 "the run diverged: the median loss of its last 6 step(s)" $rc
grep -qE "loss spike at step 2: [0-9]{3,}\.[0-9]+, [0-9]+x the loss of uniform guessing \(ln 256 = 5.5452\): the run is diverging; lower optimizer.lr" "$dir/err" \
  && grep -qE '"type":"spike","step":2,"loss":[0-9]{3,}[0-9.]*,"uniform_loss":5.545' "$dir/lr.jsonl" \
  && [ "$(grep -c '"type":"spike"' "$dir/lr.jsonl")" = 1 ] && pass "lr 9.9: one spike, at step 2, against ln(256)" \
  || fail "lr 9.9 spike: $(cat "$dir/err"; grep spike "$dir/lr.jsonl")"
DTRAIN_TEST_SPIKE=1:0 "$bin" train --steps 6 --set logging.metrics="$dir/s1.jsonl" >"$dir/out" 2>"$dir/err" \
  && grep -q '"type":"spike","step":1,' "$dir/s1.jsonl" && [ "$(grep -c "warning: loss spike at step 1:" "$dir/err")" = 1 ] \
  && pass "a spike at step 1 is reported; the run goes on and succeeds" || fail "spike at step 1: $(cat "$dir/err")"
"$bin" train --steps 25 --lr 3e-3 --set logging.metrics="$dir/ok.jsonl" >"$dir/out" 2>"$dir/err" \
  && ! grep -q spike "$dir/ok.jsonl" "$dir/err" && pass "a normal 25-step run at lr 3e-3: no spike" \
  || fail "normal run: $(cat "$dir/err")"

# ---- sample: a tokenizer that does not belong to the model is refused before anything is
# printed (a Llama-2 tokenizer.json on a GPT-2 model printed garbage, then "token id out of
# range"). A byte-level BPE tokenizer.json of 258 ids (256 bytes + 2 merges) stands in for it.
/usr/bin/python3 - "$dir/tok258.json" <<'PY'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b), cs.append(256 + n)
        n += 1
vocab = {chr(c): i for i, c in enumerate(cs)}
merges = ["h e", "\u0120 t"]
for m in merges:
    vocab[m.replace(" ", "")] = len(vocab)
json.dump({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": vocab, "merges": merges}},
          open(sys.argv[1], "w"))
PY
tiny=(--steps 1 --set logging.metrics= --set logging.peak_gflops=100)
"$bin" train "${tiny[@]}" --set model.vocab_size=50257 --set data.tokenizer=gpt2 --set checkpoint.dir="$dir/gpt2ck" \
  >"$dir/out" 2>&1 || fail "train the 50257-id model: $(tail -2 "$dir/out")"
"$bin" sample "$dir/gpt2ck" --hf-tokenizer "$dir/tok258.json" --prompt "hello" --max-tokens 5 >"$dir/out" 2>"$dir/err"; rc=$?
line="dtrain sample: tokenizer $dir/tok258.json (hf, 258 ids) does not fit the model's vocabulary of 50257 in $dir/gpt2ck/step-00000001/model.safetensors (the model would sample ids 258..50256 that it cannot decode); the model was trained with the gpt2 tokenizer"
[ $rc = 2 ] && [ ! -s "$dir/out" ] && grep -qF "$line" "$dir/err" && [ "$(grep -c "error:" "$dir/err")" = 1 ] \
  && pass "sample with a smaller tokenizer: nothing printed, $line" \
  || fail "sample with another model's tokenizer (rc $rc): $(cat "$dir/out" "$dir/err")"
# Within the model's padding to 128 (258 ids, vocabulary 384) it samples, only ids the tokenizer has.
"$bin" train "${tiny[@]}" --set model.vocab_size=384 --set data.tokenizer=hf --set checkpoint.dir="$dir/hfck" \
  >"$dir/out" 2>&1 || fail "train the 384-id model: $(tail -2 "$dir/out")"
"$bin" sample "$dir/hfck" --hf-tokenizer "$dir/tok258.json" --prompt "hello" --max-tokens 40 --temperature 2 --top-k 0 \
  >"$dir/out" 2>"$dir/err" && [ "$(head -c 5 "$dir/out")" = hello ] \
  && pass "sample within the padding: 40 tokens, none past the tokenizer's 258" \
  || fail "sample within the padding: $(cat "$dir/err")"
# The model's own kind of tokenizer below its vocabulary (byte data, 1024 rows) samples the
# tokenizer's ids only; a hub-like model that records none is held to the padding.
"$bin" train "${tiny[@]}" --set model.vocab_size=1024 --set checkpoint.dir="$dir/byteck" >"$dir/out" 2>&1
"$bin" sample "$dir/byteck" --prompt "hi" --max-tokens 200 --temperature 2 --top-k 0 >"$dir/out" 2>"$dir/err" \
  && [ "$(head -c 2 "$dir/out")" = hi ] && pass "byte data under 1024 rows: samples the 256 byte ids only" \
  || fail "byte tokenizer on 1024 ids: $(cat "$dir/err")"
"$bin" ckpt export --hf "$dir/gpt2ck" "$dir/gpt2.hf" >"$dir/out" 2>&1 || fail "export: $(cat "$dir/out")"
sed -i 's/"dtrain_tokenizer": "gpt2"/"dtrain_note": "none"/' "$dir/gpt2.hf/config.json" # as the hub's files
"$bin" sample "$dir/gpt2.hf" --hf-tokenizer "$dir/tok258.json" --prompt "hello" >"$dir/out" 2>"$dir/err"; rc=$?
[ $rc = 2 ] && [ ! -s "$dir/out" ] && grep -qF "tok258.json (hf, 258 ids) does not fit the model's vocabulary of 50257 in $dir/gpt2.hf (the model would sample ids 258..50256 that it cannot decode)" "$dir/err" \
  && pass "a Hugging Face directory that records no tokenizer: the sizes decide" || fail "hf dir without a record (rc $rc): $(cat "$dir/err")"

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
