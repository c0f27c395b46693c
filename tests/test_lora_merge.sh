#!/usr/bin/env bash
# dtrain ckpt merge (ARCHITECTURE decision 51): a LoRA checkpoint folded into its base and
# written as a Hugging Face directory, read back by dtrain eval, gives the validation loss the
# unmerged LoRA model gave at the same step (the run's own final eval, metrics JSONL) within
# relative 1e-5 (fp32 rounding: x (W + s B A)^T against x W^T + s (x A^T) B^T):
#  - LLaMA (GQA, all seven targets: fused q|k|v and gate|up row blocks) on an fp32 base from
#    a dtrain model file (model.init_from), and on its NF4 quantization (QLoRA: merged onto
#    the dequantized base);
#  - GPT-2 (q, k, v row blocks of c_attn, o, up, down) on a base drawn from training.seed;
#  - the checkpoints of tensor-parallel runs (tp 2, blocks mode): LLaMA on the fp32 base file,
#    and on an NF4 base drawn from the seed, quantized shard by shard as the run held it;
#  - the test can fail: the base alone evaluates differently (by more than 10x the tolerance),
#    the adapted projections moved and every other tensor is the base's bitwise;
#  - --base PATH (the base's Hugging Face export) merges to the same bytes as model.init_from;
#  - refused in one line each: a checkpoint that is not LoRA (naming its trainer.json), a base
#    of another XXH3 (naming the base file), an OUT_DIR that cannot be created (naming it).
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
fresh_dir "$dir"
export OMP_NUM_THREADS=1

# a byte-token corpus, one document per paragraph: Debian's license texts (base-files), which do
# not change from one commit to the next as the repository's docs do (the adapters' effect on
# the validation loss, checked below, depends on the data)
/usr/bin/python3 - "$dir/corpus.txt" /usr/share/common-licenses/{GPL-3,Apache-2.0,LGPL-2.1,MPL-2.0,GFDL-1.3} <<'PY'
import re, sys
paras = []
for p in sys.argv[2:]:
    paras += [x.strip() for x in re.split(r"\n\s*\n", open(p, encoding="utf-8").read()) if x.strip() and x.strip() != "%"]
open(sys.argv[1], "w", encoding="utf-8").write("\n%\n".join(paras) + "\n")
PY
"$bin" prepare --tokenizer byte --doc-sep % --val-fraction 0.1 --out "$dir/d" "$dir/corpus.txt" >"$dir/prep.log" 2>&1 \
  || fail "prepare: $(tail -2 "$dir/prep.log")"
B=4 T=32 NB=4
data=(--data "$dir/d_train_*.bin" --data.val "$dir/d_val_*.bin" --set training.eval_batches=$NB --batch $B --seq $T)
llama=(--set model.preset= --set model.family=llama --model.n_layer 2 --model.d_model 48 --model.n_head 4
       --set model.n_kv_head=2 --set model.d_ff=72 --model.vocab_size 256 --model.context 32)
gpt2=(--set model.preset= --set model.family=gpt2 --model.n_layer 2 --model.d_model 48 --model.n_head 4
      --model.vocab_size 256 --model.context 32)
lora=(--steps 20 --lr 2e-2 --warmup 2 --seed 7 --set lora.rank=4 --set lora.alpha=64 --set logging.progress=lines)

"$bin" train "${llama[@]}" "${data[@]}" --steps 20 --lr 3e-3 --seed 1 --save-weights "$dir/base.st" >"$dir/base.log" 2>&1 \
  || fail "pre-training: $(tail -2 "$dir/base.log")"
"$bin" train "${llama[@]}" "${data[@]}" --steps 2 --seed 2 --save-weights "$dir/other.st" >"$dir/other.log" 2>&1 \
  || fail "other base: $(tail -2 "$dir/other.log")"

val_loss() { # the final eval's val_loss of a metrics file
  /usr/bin/python3 -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "eval"][-1]["val_loss"])' "$1"
}
eval_loss() { # dtrain eval's val_loss of a model
  "$bin" eval "$1" --data.val "$dir/d_val_*.bin" --batch $B --seq $T --set training.eval_batches=$NB 2>"$dir/eval.err" \
    | awk '$1 != "#" && NF >= 3 {print $3}'
}
merge_case() { # NAME MODEL_ARRAY_NAME ARGS...: fine-tune, merge, compare
  local name=$1 arr="$2[@]"; shift 2
  "$bin" train "${!arr}" "${data[@]}" "${lora[@]}" --set checkpoint.dir="$dir/ck_$name" \
    --set logging.metrics="$dir/$name.jsonl" "$@" >"$dir/$name.log" 2>&1 || { fail "$name: $(tail -2 "$dir/$name.log")"; return; }
  "$bin" ckpt merge "$dir/ck_$name" "$dir/m_$name" >"$dir/merge_$name.log" 2>&1 \
    || { fail "merge $name: $(tail -2 "$dir/merge_$name.log")"; return; }
  local want got
  want=$(val_loss "$dir/$name.jsonl")
  got=$(eval_loss "$dir/m_$name")
  [ -n "$got" ] || { fail "eval of the merged $name: $(cat "$dir/eval.err")"; return; }
  local out
  if out=$(/usr/bin/python3 - "$want" "$got" <<'PY'
import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
rel = abs(a - b) / abs(a)
print("unmerged LoRA val loss %.7f, merged (HF export, dtrain eval) %.7f, rel %.1e <= 1e-5" % (a, b, rel))
sys.exit(0 if rel <= 1e-5 else 1)
PY
  ); then pass "$name: $out ($(grep -o '[0-9]* adapted projections' "$dir/merge_$name.log"))"; else fail "$name: $out"; fi
}
merge_case llama_fp32 llama --set model.init_from="$dir/base.st" --set lora.targets=q,k,v,o,gate,up,down
merge_case llama_nf4 llama --set model.init_from="$dir/base.st" --set lora.targets=q,k,v,o,gate,up,down \
  --set lora.base_dtype=nf4
merge_case gpt2_seed gpt2 --set lora.targets=q,k,v,o,up,down
# a tensor-parallel run's checkpoint (decision 69; parallel.tp=2 in the blocks mode): its canonical
# adapters folded into the base as the run held it - 2 shards, under NF4 each shard its own NF4
# tensor (d_model 128: shards of whole NF4 blocks), on a base drawn from training.seed
merge_case llama_fp32_tp2 llama --set model.init_from="$dir/base.st" --set lora.targets=q,k,v,o,gate,up,down \
  --set parallel.tp=2 --set parallel.tp_blocks=true
llama128=(--set model.preset= --set model.family=llama --model.n_layer 2 --model.d_model 128 --model.n_head 4
          --set model.n_kv_head=2 --set model.d_ff=256 --model.vocab_size 256 --model.context 32)
merge_case llama_nf4_tp2 llama128 --set lora.targets=q,k,v,o,gate,up,down --set lora.base_dtype=nf4 \
  --set parallel.tp=2 --set parallel.tp_blocks=true
grep -q 'NF4, dequantized' "$dir/merge_llama_nf4.log" && pass "the NF4 base is merged dequantized" \
  || fail "nf4 merge: $(cat "$dir/merge_llama_nf4.log")"

# the comparison can fail: the base alone evaluates 10x the tolerance away or more
if out=$(/usr/bin/python3 - "$(val_loss "$dir/llama_fp32.jsonl")" "$(eval_loss "$dir/base.st")" <<'PY'
import sys
a, b = float(sys.argv[1]), float(sys.argv[2])
print("base alone %.6f vs LoRA %.6f (rel %.1e)" % (b, a, abs(a - b) / a))
sys.exit(0 if abs(a - b) / a > 1e-4 else 1)
PY
); then pass "the adapters matter: $out"; else fail "adapters: $out"; fi

# the merged directory is a Hugging Face model without adapters: the adapted projections
# moved, every other tensor is the base's bitwise (the base's own HF export)
"$bin" ckpt export --hf "$dir/base.st" "$dir/base_hf" >"$dir/base_hf.log" 2>&1 || fail "export base: $(tail -2 "$dir/base_hf.log")"
if out=$(/usr/bin/python3 - "$dir/m_llama_fp32" "$dir/base_hf" <<'PY'
import json, os, struct, sys
import numpy as np
def st(d):
    raw = open(os.path.join(d, "model.safetensors"), "rb").read()
    n, = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32) for k, v in h.items()}
m, b = st(sys.argv[1]), st(sys.argv[2])
c = json.load(open(os.path.join(sys.argv[1], "config.json")))
assert set(m) == set(b) and not any("lora" in k for k in m), sorted(m)
assert c["architectures"] == ["LlamaForCausalLM"], c
proj = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
moved = [k for k in m if any(p in k for p in proj)]
assert len(moved) == 14, moved
for k in m:
    if k in moved:
        assert np.abs(m[k] - b[k]).max() > 1e-3, k
    else:
        assert np.array_equal(m[k], b[k]), k
print("%d tensors, none an adapter; the 14 adapted projections moved (max |W' - W| %.3g), the other %d bitwise the base's"
      % (len(m), max(np.abs(m[k] - b[k]).max() for k in moved), len(m) - 14))
PY
); then pass "merged output: $out"; else fail "merged output: $out"; fi

# --base: the same base as a Hugging Face directory (imported whole, then quantized) merges to
# the same bytes as the run's own model.init_from (a dtrain file, read tensor by tensor)
"$bin" ckpt merge "$dir/ck_llama_nf4" "$dir/m_nf4_hf" --base "$dir/base_hf" >"$dir/merge_hf.log" 2>&1 \
  || fail "merge --base HF dir: $(tail -2 "$dir/merge_hf.log")"
cmp -s "$dir/m_nf4_hf/model.safetensors" "$dir/m_llama_nf4/model.safetensors" \
  && pass "merge --base (the base's HF export) = merge from model.init_from, bytewise (NF4)" \
  || fail "merge --base HF dir differs from the merge from model.init_from"

# refusals: one line naming the file, non-zero exit
refused() { # LABEL PATTERN ARGS...
  local label=$1 pat=$2 out rc; shift 2
  out=$("$bin" ckpt merge "$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] && [ "$(grep -c error <<<"$out")" -eq 1 ] && grep -q -- "$pat" <<<"$out"; then
    pass "$label refused: $(grep error <<<"$out" | cut -c1-200)"
  else
    fail "$label (rc $rc): $out"
  fi
}
"$bin" train "${llama[@]}" "${data[@]}" --steps 2 --set checkpoint.dir="$dir/ck_full" >"$dir/full.log" 2>&1 \
  || fail "full run: $(tail -2 "$dir/full.log")"
refused "a checkpoint that is not LoRA" "ck_full/step-00000002/trainer.json: not a LoRA checkpoint" "$dir/ck_full" "$dir/mx"
refused "another base (--base)" "other.st (lora.base_dtype fp32): not the base these adapters were trained on" \
  "$dir/ck_llama_fp32" "$dir/mx" --base "$dir/other.st"
refused "the NF4 run's adapters on another base" "not the base these adapters" \
  "$dir/ck_llama_nf4" "$dir/mx" --base "$dir/other.st"
touch "$dir/afile"
refused "an OUT_DIR that cannot be created" "afile/out: cannot create directory" "$dir/ck_llama_fp32" "$dir/afile/out"
[ ! -e "$dir/mx" ] && pass "refused merges created no OUT_DIR" || fail "refused merges left $dir/mx"

echo "test_lora_merge: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
