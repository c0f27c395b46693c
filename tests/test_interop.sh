#!/usr/bin/env bash
# dtrain ckpt export --hf / import-llmc:
#  - export of a model file, a step directory and a checkpoint directory (of one training run)
#    gives the same bytes;
#    tests/ref/hf_gpt2_check.py checks HF names, layouts and config.json and runs the exported
#    weights in HF's convention: logits equal dtrain's (tests/interop_dump) to 1e-4;
#  - llm.c files written by tests/ref/llmc_model.py (fp32 and bf16) import bitwise;
#  - every broken llm.c file is refused with exit 1 and one line naming the file and reason;
#  - usage errors exit 2.
# Usage: test_interop.sh DTRAIN INTEROP_DUMP OUTDIR
set -uo pipefail
bin=$(readlink -f "$1")
dump=$(readlink -f "$2")
dir=$3
ref=$(dirname "$(readlink -f "$0")")/ref
py=/usr/bin/python3
rm -rf "$dir" && mkdir -p "$dir"
unset DTRAIN_DEBUG
. "$(dirname "$0")/lib.sh"

# ---- export
OMP_NUM_THREADS=2 "$dump" "$dir" || { echo "interop_dump failed"; exit 1; }
# A real checkpoint (only verified steps are exported) and the same weights as a model file.
OMP_NUM_THREADS=2 "$bin" train --set model.preset= --model.n_layer 2 --model.d_model 48 --model.n_head 4 \
  --model.vocab_size 300 --model.context 32 --seq 16 --batch 2 --steps 2 --set logging.metrics= \
  --set logging.peak_gflops=100 --set checkpoint.dir="$dir/ckpt" --save-weights "$dir/trained.safetensors" \
  >"$dir/train.log" 2>&1 || fail "training the checkpoint: $(tail -2 "$dir/train.log")"
for src in model.safetensors trained.safetensors ckpt ckpt/step-00000002; do
  out=$dir/hf-$(echo "$src" | tr / _)
  if "$bin" ckpt export --hf "$dir/$src" "$out" > "$dir/export.log" 2>&1; then
    pass "export --hf $src"
  else
    fail "export --hf $src: $(cat "$dir/export.log")"
  fi
done
if cmp -s "$dir/hf-trained.safetensors/model.safetensors" "$dir/hf-ckpt/model.safetensors" &&
   cmp -s "$dir/hf-trained.safetensors/model.safetensors" "$dir/hf-ckpt_step-00000002/model.safetensors" &&
   cmp -s "$dir/hf-trained.safetensors/config.json" "$dir/hf-ckpt/config.json"; then
  pass "file, checkpoint dir and step dir export the same bytes"
else
  fail "exports from file / checkpoint dir / step dir differ"
fi
if "$py" "$ref/hf_gpt2_check.py" "$dir/hf-model.safetensors" "$dir/ref.safetensors"; then
  pass "HF export loads in HF's convention with dtrain's logits"
else
  fail "HF export check"
fi

# ---- import of llm.c files
"$py" "$ref/llmc_model.py" write "$dir/llmc" || { echo "llmc_model.py write failed"; exit 1; }
for kind in fp32 bf16; do
  if "$bin" ckpt import-llmc "$dir/llmc/good_$kind.bin" "$dir/llmc/$kind.safetensors" \
       > "$dir/import.log" 2>&1 &&
     "$py" "$ref/llmc_model.py" compare "$dir/llmc/$kind.safetensors" "$kind"; then
    pass "import-llmc $kind: every tensor bitwise"
  else
    fail "import-llmc $kind: $(cat "$dir/import.log")"
  fi
done
# The imported model exports too (llm.c -> dtrain -> HF).
if "$bin" ckpt export --hf "$dir/llmc/fp32.safetensors" "$dir/llmc/hf" > /dev/null 2>&1; then
  pass "imported llm.c model exports to HF"
else
  fail "export of the imported llm.c model"
fi

# ---- training starts from an llm.c file (model.init_from): after one step with a tiny
# learning rate the weights are the imported ones to ~1e-6; a shape mismatch is refused.
shape=(--set model.preset= --model.n_layer 2 --model.d_model 48 --model.n_head 4 --model.vocab_size 300
       --model.context 32 --seq 16 --batch 2 --steps 1 --set optimizer.lr=1e-9 --set schedule.min_lr=0 --set logging.metrics=
       --set logging.peak_gflops=100)
if OMP_NUM_THREADS=2 "$bin" train "${shape[@]}" --set model.init_from="$dir/llmc/good_fp32.bin" \
     --save-weights "$dir/llmc/trained.safetensors" > "$dir/init.log" 2>&1 &&
   grep -q "initial weights from" "$dir/init.log" &&
   "$py" - "$dir/llmc/trained.safetensors" "$dir/llmc/fp32.safetensors" <<'PY'
import json, struct, sys
import numpy as np
def tensors(p):
    raw = open(p, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], "<f4")
            for k, v in h.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys()
err = {k: float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a}
# each tensor on its own: max() over the errors would drop a NaN that is not the first
assert all(e < 1e-6 for e in err.values()), err
PY
then
  pass "train with model.init_from=llm.c file starts from its weights"
else
  fail "model.init_from: $(tail -2 "$dir/init.log")"
fi
err=$(OMP_NUM_THREADS=2 "$bin" train "${shape[@]}" --model.n_layer 3 --set model.init_from="$dir/llmc/good_fp32.bin" 2>&1 >/dev/null)
rc=$?
[ $rc -ne 0 ] && [[ $err == *good_fp32.bin* ]] && pass "model.init_from with another shape refused: $(echo "$err" | head -1)" \
  || fail "init_from shape mismatch: rc $rc, '$err'"

refused() { # FILE REASON: import-llmc exits 1 with one line naming FILE and REASON
  local f=$dir/llmc/$1 err rc
  err=$("$bin" ckpt import-llmc "$f" "$dir/llmc/out.safetensors" 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 1 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] && [[ $err == *"$f"* ]] &&
     [[ $err == *"$2"* ]]; then
    pass "refused $1: $err"
  else
    fail "$1: exit $rc, message '$err' (wanted the file and '$2')"
  fi
}
refused bad_magic.bin "bad magic 20240327"
refused bad_version.bin "unknown llm.c model version 1"
refused truncated.bin "truncated"
refused extra.bin "4 extra bytes"
refused short_header.bin "shorter than the 1024-byte"
refused vp_below_v.bin "padded_vocab_size 256 is smaller than vocab_size 300"
refused heads.bin "num_heads 5 does not divide channels 48"
refused zero_layers.bin "num_layers = 0"
refused shard.bin "token shard"
refused missing.bin "cannot open"
[ -e "$dir/llmc/out.safetensors" ] && fail "a refused import left an output file"

# ---- usage errors: exit 2
usage() { # LABEL ARGS...
  local label=$1 rc; shift
  "$bin" ckpt "$@" > /dev/null 2>&1; rc=$?
  if [ $rc -eq 2 ]; then pass "usage error: $label"; else fail "$label: exit $rc, wanted 2"; fi
}
usage "no subcommand"
usage "unknown subcommand" frobnicate
usage "export without --hf" export "$dir/model.safetensors" "$dir/x"
usage "import-llmc with one argument" import-llmc "$dir/llmc/good_fp32.bin"
"$bin" ckpt export --hf "$dir/nope" "$dir/x" > /dev/null 2>&1
[ $? -eq 1 ] && pass "export of a missing source: exit 1" || fail "export of a missing source"

# ---- Hugging Face LLaMA directories in: tests/ref/hf_llama_check.py writes them by hand
# (config.json, HF tensor names, F32/F16/BF16, one model.safetensors or shards + index.json)
# with a T+1-token raw16 file, and computes the mean loss of that one sample in float64 with
# tests/ref/llama_torch.py (the published architecture, not dtrain's code) on the stored
# values. `dtrain eval DIR` (batch 1, seq T: one sample, T tokens) must print that loss.
# Tolerance 1e-5 relative: eval prints 6 decimals (<= 9e-8 relative at these losses, 5.7 to
# 12), the rest is float32 compute; the worst of 36 cases (gqa/mqa x F32/F16/BF16 x 3 seeds x
# T 17/64) was 1.2e-7 relative, an 80x margin. Power: the same reference with a wrong model
# (query head h reading kv head h % NKV instead of h // (NH/NKV); RoPE pairs (2i, 2i+1) instead
# of (i, i + hs/2)) must NOT pass the same comparison. The effect on a mean over T positions
# can nearly cancel: over seeds 1-10 of these four cases the wrong models were 4e-5 to 2e-1
# away (all but 3 of 70 above 1e-3); the seeds below put every one above 1e-2.
# RoPE scaling: config.json with rope_scaling llama3 (Llama 3.1's rule, factor 8 from an
# original 32 positions to max_position_embeddings 128) and yarn (the older key `type`), T 96
# beyond the original context; the reference computes their frequencies in float64 from the
# published formulas (tests/ref/rope_scaling_ref.py), and plain RoPE (the scaling ignored)
# is one more wrong model (3e-3 and 9e-3 away at these seeds).
hfl=$dir/hf_llama
hf_tol=1e-5
mkdir -p "$hfl"
hf_case() { # LABEL DTYPE SHARDS VARIANT T SEED: make, dtrain eval, compare, wrong models refused
  local label=$1 d=$hfl/$1 T=$5 out hf_cmp w wrong
  if ! out=$("$py" "$ref/hf_llama_check.py" make "$d" "$2" "$3" "$d.val" "$T" --variant "$4" --seed "$6" 2>&1); then
    fail "HF LLaMA $label: hf_llama_check.py make: $out"
    return
  fi
  echo "$out" >"$d.ref"
  hf_ref=$(awk '$1 == "loss" {print $2}' <<<"$out")
  if ! "$bin" eval "$d" --data.val "$d.val" --set data.format=raw16 --batch 1 --seq "$T" >"$d.eval" 2>&1; then
    fail "HF LLaMA $label: dtrain eval DIR: $(tail -1 "$d.eval")"
    return
  fi
  if hf_cmp=$("$py" "$ref/hf_llama_check.py" compare "$hf_ref" "$d.eval" $hf_tol "$T"); then
    pass "HF LLaMA $label: dtrain eval = PyTorch float64 loss ($T tokens): $hf_cmp"
  else
    fail "HF LLaMA $label: $hf_cmp"
  fi
  for w in loss_kv_mod loss_rope_interleaved loss_no_scaling; do
    [ "$4" = mqa ] && [ $w = loss_kv_mod ] && continue   # one kv head: every map is the same
    wrong=$(awk -v w=$w '$1 == w {print $2}' <<<"$out")
    [ -z "$wrong" ] && continue                            # no rope_scaling: no such model
    hf_cmp=$("$py" "$ref/hf_llama_check.py" compare "$wrong" "$d.eval" $hf_tol "$T")
    if [ $? -eq 1 ] && [[ $hf_cmp == *" > "* ]]; then
      pass "HF LLaMA $label: a wrong model ($w) fails the same check: $hf_cmp"
    else
      fail "HF LLaMA $label: the wrong model $w is not told apart: $hf_cmp"
    fi
  done
}
hf_case f32 F32 1 gqa 32 2
hf_case f16 F16 1 gqa 17 3
hf_case bf16-3shards BF16 3 gqa 64 5
hf_case mqa-tied BF16 1 mqa 24 4
hf_case llama3-scaling F32 1 llama3 96 6
hf_case yarn-scaling BF16 1 yarn 96 7
# model.init_from takes the same (sharded BF16) directory when the model keys match its
# config.json: 2 steps on its own sample, the loss of step 1 (before the first update, 8
# digits) is the reference's; a mismatched key is refused in one line naming both models.
mapfile -t hf_keys < <("$py" "$ref/hf_llama_check.py" keys "$hfl/bf16-3shards")
hf_train=(--set model.preset= --set model.family=llama "${hf_keys[@]}" --seq 64 --batch 1 --steps 2
          --set data.train="$hfl/bf16-3shards.val" --set data.format=raw16 --set logging.metrics=
          --set logging.peak_gflops=100 --set model.init_from="$hfl/bf16-3shards")
hf_ref=$(awk '$1 == "loss" {print $2}' "$hfl/bf16-3shards.ref" 2>/dev/null)
hf_cmp=
if OMP_NUM_THREADS=2 "$bin" train "${hf_train[@]}" >"$hfl/init.log" 2>&1 &&
   grep -q "initial weights from $hfl/bf16-3shards" "$hfl/init.log" &&
   hf_cmp=$("$py" "$ref/hf_llama_check.py" compare "$hf_ref" "$hfl/init.log" $hf_tol); then
  pass "train with model.init_from=HF directory (BF16, 3 shards), 2 steps; step 1 loss: $hf_cmp"
else
  fail "train model.init_from=HF directory: ${hf_cmp:-$(tail -2 "$hfl/init.log")}"
fi
err=$(OMP_NUM_THREADS=2 "$bin" train "${hf_train[@]}" --set model.n_kv_head=4 2>&1 >/dev/null)
rc=$?
if [ $rc -ne 0 ] && [ "$(echo "$err" | wc -l)" -eq 1 ] && [[ $err == *"$hfl/bf16-3shards"* ]] &&
   [[ $err == *"n_kv_head 2"* ]] && [[ $err == *"n_kv_head 4"* ]]; then
  pass "model.init_from=HF directory with model.n_kv_head=4 (config.json: 2) refused: rc $rc, $err"
else
  fail "init_from HF directory, mismatched n_kv_head: rc $rc, '$err'"
fi

echo "test_interop: $fails failure(s)"
[ $fails -eq 0 ]
