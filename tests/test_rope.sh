#!/usr/bin/env bash
# RoPE scaling and long contexts (model/rope.h, docs/ARCHITECTURE.md decision 59):
#   - the frequencies of every rule (plain, linear, llama3, yarn), from config keys and from
#     Hugging Face config.json files (Llama 3.1 8B's and Llama 3.2 1B's as published), equal
#     tests/ref/rope_scaling_ref.py's float64 reference to 1e-12 relative;
#   - a bad rule or parameter is refused in one line naming the key, with exit 2, before any
#     model exists (dtrain train) - and so is a config.json's rope_scaling (rope_dump --hf);
#   - llama trains beyond its preset's context (with and without a scaling rule); gpt2,
#     whose positions are learned, refuses naming model.context;
#   - a llama3 model's file carries the rule, its export writes rope_scaling and reads back
#     to the same frequencies.
set -uo pipefail
bin=$1
dump=$2
dir=$3
rm -rf "$dir" && mkdir -p "$dir"
export OMP_NUM_THREADS=2
. "$(dirname "$0")/lib.sh"
py=/usr/bin/python3
ref=$src/tests/ref

# ---- the frequencies against the float64 reference
if out=$("$py" "$ref/rope_scaling_ref.py" check "$dump" "$dir/ref" 2>&1); then
  while read -r line; do pass "frequencies: ${line#ok   }"; done < <(grep '^ok ' <<<"$out")
else
  echo "$out"
  fail "rope_scaling_ref.py check"
fi

# ---- bad keys: exit 2, one line naming the key (the config is checked before any allocation)
# expect_refused NAME TEXT ARGS...: `dtrain train ARGS` exits 2 with one stderr line holding TEXT.
expect_refused() {
  local name=$1 text=$2; shift 2
  "$bin" train "$@" >"$dir/out" 2>"$dir/err"; local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$text" "$dir/err" && [ "$(wc -l <"$dir/err")" -eq 1 ]; then
    pass "$name: $(cat "$dir/err")"
  else
    fail "$name (rc=$rc, stderr: $(cat "$dir/err"))"
  fi
}
tiny=(--set model.preset=llama-tiny)
l3=(--set model.rope_scaling=llama3 --set model.rope_factor=8 --set model.rope_original_context=32)
expect_refused "rope_scaling dynamic" "model.rope_scaling: 'dynamic' is not supported: dynamic NTK scaling is an inference-time rule" \
  "${tiny[@]}" --set model.rope_scaling=dynamic
expect_refused "unknown rope_scaling" "model.rope_scaling: 'longrope' is not one of none, linear, llama3, yarn" \
  "${tiny[@]}" --set model.rope_scaling=longrope
expect_refused "llama3 high_freq_factor <= low_freq_factor" "model.rope_high_freq_factor (1) must exceed model.rope_low_freq_factor (4)" \
  "${tiny[@]}" "${l3[@]}" --set model.rope_low_freq_factor=4 --set model.rope_high_freq_factor=1
expect_refused "llama3 without low_freq_factor" "model.rope_low_freq_factor must be in (0, 1e6]" \
  "${tiny[@]}" "${l3[@]}" --set model.rope_high_freq_factor=4
expect_refused "llama3 without the original context" "model.rope_original_context" \
  "${tiny[@]}" --set model.rope_scaling=llama3 --set model.rope_factor=8 --set model.rope_low_freq_factor=1 \
  --set model.rope_high_freq_factor=4
expect_refused "linear factor below 1" "model.rope_factor must be in [1, 1e6]" \
  "${tiny[@]}" --set model.rope_scaling=linear --set model.rope_factor=0.5
expect_refused "a factor without a rule" "model.rope_factor is set (4) but model.rope_scaling none does not use it" \
  "${tiny[@]}" --set model.rope_factor=4
expect_refused "linear with a llama3 parameter" "model.rope_low_freq_factor is set (1) but model.rope_scaling linear does not use it" \
  "${tiny[@]}" --set model.rope_scaling=linear --set model.rope_factor=2 --set model.rope_low_freq_factor=1
expect_refused "yarn beta_fast <= beta_slow" "model.rope_beta_fast (2) must exceed model.rope_beta_slow (4)" \
  "${tiny[@]}" --set model.rope_scaling=yarn --set model.rope_factor=4 --set model.rope_original_context=32 \
  --set model.rope_beta_fast=2 --set model.rope_beta_slow=4
expect_refused "yarn negative attention factor" "model.rope_attention_factor" \
  "${tiny[@]}" --set model.rope_scaling=yarn --set model.rope_factor=4 --set model.rope_original_context=32 \
  --set model.rope_attention_factor=-1
expect_refused "gpt2 with a scaling rule" "model.rope_scaling: gpt2 has learned positions, not rotary" \
  --set model.preset=gpt2-tiny --set model.rope_scaling=linear --set model.rope_factor=2
expect_refused "gpt2 beyond its preset's context" "model.context (128) exceeds the maximum 64 of preset gpt2-tiny (gpt2 has learned positions)" \
  --set model.preset=gpt2-tiny --set model.context=128 --seq 128

# ---- bad config.json rope_scaling: one line naming the file and the key
# hf_refused NAME TEXT ROPE_SCALING_JSON
hf_refused() {
  local name=$1 text=$2 d=$dir/hf_bad_$((++nbad))
  mkdir -p "$d"
  cat >"$d/config.json" <<EOF
{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
 "num_attention_heads": 4, "vocab_size": 300, "max_position_embeddings": 256,
 "rope_theta": 10000.0, "rope_scaling": $3}
EOF
  "$dump" --hf "$d" >"$dir/out" 2>"$dir/err"; local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$d/config.json: " "$dir/err" && grep -qF -- "$text" "$dir/err" &&
     [ "$(wc -l <"$dir/err")" -eq 1 ]; then
    pass "config.json $name: $(cat "$dir/err")"
  else
    fail "config.json $name (rc=$rc, stderr: $(cat "$dir/err"))"
  fi
}
nbad=0
hf_refused "dynamic (type)" "rope_scaling.rope_type: 'dynamic' is not supported: dynamic NTK scaling is an inference-time rule" \
  '{"type": "dynamic", "factor": 2.0}'
hf_refused "longrope" "rope_scaling.rope_type: 'longrope' is not supported (dtrain computes default, linear, llama3 and yarn)" \
  '{"rope_type": "longrope", "factor": 2.0, "short_factor": [1], "long_factor": [2]}'
hf_refused "yarn with DeepSeek's mscale" "rope_scaling.mscale is not supported with rope_type yarn" \
  '{"rope_type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 0.707}'
hf_refused "yarn truncate false" "rope_scaling.truncate false is not supported" \
  '{"rope_type": "yarn", "factor": 4.0, "truncate": false}'
hf_refused "llama3 without low_freq_factor" "rope_scaling.low_freq_factor is missing" \
  '{"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}'
hf_refused "rope_type and type differ" "rope_scaling.rope_type 'yarn' and rope_scaling.type 'linear' differ" \
  '{"rope_type": "yarn", "type": "linear", "factor": 4.0}'
hf_refused "rope_scaling a string" "key 'rope_scaling' must be an object or null" '"llama3"'
hf_refused "llama3 high <= low" "model.rope_high_freq_factor (1) must exceed model.rope_low_freq_factor (4)" \
  '{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 64}'
# the real reader: dtrain eval of such a directory stops at its config.json, one line
"$bin" eval "$dir/hf_bad_1" --data.val /nonexistent >"$dir/out" 2>"$dir/err"; rc=$?
if [ $rc -ne 0 ] && [ "$(wc -l <"$dir/err")" -eq 1 ] && grep -qF "rope_scaling.rope_type: 'dynamic'" "$dir/err"; then
  pass "dtrain eval of a dynamic rope_scaling directory: rc $rc, $(cat "$dir/err")"
else
  fail "dtrain eval of a dynamic rope_scaling directory (rc=$rc, stderr: $(cat "$dir/err"))"
fi

# ---- long contexts: llama beyond its preset's 64 positions
run_train() { # LOG ARGS...: trains; passes when every step's loss is finite
  local log=$1; shift
  if "$bin" train "${tiny[@]}" --batch 1 --steps 3 --set logging.metrics= --set logging.peak_gflops=100 "$@" \
      >"$log" 2>&1 && [ "$(grep -cE 'step [0-9]+/3 \| loss [0-9.]+ ' "$log")" -eq 3 ]; then
    return 0
  fi
  return 1
}
if run_train "$dir/long.log" --set model.context=256 --seq 256; then
  pass "llama-tiny (preset context 64) trains 3 steps at model.context 256: $(grep -o 'step 3/3 | loss [0-9.]*' "$dir/long.log")"
else
  fail "llama-tiny at model.context 256: $(tail -2 "$dir/long.log")"
fi
l3ok=(--set model.rope_scaling=llama3 --set model.rope_factor=4 --set model.rope_low_freq_factor=1
      --set model.rope_high_freq_factor=4 --set model.rope_original_context=64)
if run_train "$dir/l3.log" --set model.context=256 --seq 256 "${l3ok[@]}" --set checkpoint.dir="$dir/ck"; then
  pass "llama-tiny with llama3 scaling (x4 from 64) trains 3 steps at 256: $(grep -o 'step 3/3 | loss [0-9.]*' "$dir/l3.log")"
else
  fail "llama-tiny with llama3 scaling at 256: $(tail -2 "$dir/l3.log")"
fi

# ---- the rule travels: model file metadata, HF export, re-import
meta=$("$py" - "$dir/ck/$(cat "$dir/ck/latest" 2>/dev/null)/model.safetensors" <<'EOF' 2>&1
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    m = json.loads(f.read(n))["__metadata__"]
print(" ".join("%s=%s" % (k, m[k]) for k in sorted(m) if k.startswith("rope_") or k == "context"))
EOF
)
want="context=256 rope_factor=4 rope_high_freq_factor=4 rope_low_freq_factor=1 rope_original_context=64 rope_scaling=llama3 rope_theta=10000"
[ "$meta" = "$want" ] && pass "the checkpoint's model file carries the rule: $meta" || fail "model file metadata: '$meta', wanted '$want'"
if "$bin" ckpt export --hf "$dir/ck" "$dir/exp" >"$dir/exp.log" 2>&1 &&
   grep -qF '"rope_scaling": {"rope_type": "llama3", "factor": 4, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 64}' "$dir/exp/config.json" &&
   "$dump" --hf "$dir/exp" >"$dir/exp.freqs" 2>&1 &&
   "$dump" "${tiny[@]}" --set model.context=256 --set training.seq_len=256 "${l3ok[@]}" >"$dir/keys.freqs" 2>&1 &&
   cmp -s "$dir/exp.freqs" "$dir/keys.freqs"; then
  pass "HF export writes rope_scaling llama3; its config.json reads back to the keys' frequencies ($(grep -c '^inv' "$dir/exp.freqs") of them)"
else
  fail "export/re-import of a llama3 model: $(tail -1 "$dir/exp.log"); $(grep rope_scaling "$dir/exp/config.json" 2>/dev/null)"
fi

echo "test_rope: $fails failure(s)"
[ $fails -eq 0 ]
