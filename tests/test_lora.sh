#!/usr/bin/env bash
# LoRA and QLoRA end to end (dtrain train / bench, MPI; ARCHITECTURE decision 49):
#  - bad input refused with one line naming the key: lora.rank -1, an unknown target, nf4
#    without LoRA, a target the family lacks;
#  - N ranks vs 1 rank bitwise (losses and the final checkpoint's adapters): DDP 2 and 3
#    ranks, ZeRO-1, ZeRO-2 and ZeRO-3 on 2 and 3 ranks (uneven shards), bf16 DDP and ZeRO-3,
#    GPT-2 DDP; activation checkpointing (selective, full) bitwise equal to none;
#  - lora.dropout 0.1: DDP and ZeRO-2 on 2 and 3 ranks and bf16 DDP bitwise equal to 1 rank,
#    activation checkpointing and stop + resume bitwise equal to the plain run, the losses
#    differ from p = 0's, trainer.json and PEFT's adapter_config.json record it, a resume
#    may change it; bad values (negative, 1, not a number) refused naming lora.dropout; eval,
#    sample, export --hf and model.init_from of a LoRA checkpoint refused (adapters only); `dtrain ckpt export --peft`: every
#    adapter under PEFT's name bitwise, adapter_config.json (r, lora_alpha, target_modules);
#    GPT-2's refused;
#  - bytes on the wire: 2-rank DDP sends exactly 4 bytes per trainable (adapter) parameter
#    per step plus the 8-byte loss (dtrain bench summary.comm_bytes_step), the count of
#    trainable parameters being the formula's and the bench JSON's model.trainable_params;
#  - fine-tuning a saved model (model.init_from): the frozen base's checksum is in trainer.json;
#    resume bit-exact (LoRA and QLoRA: stop at step 10, resume to 20, equal to the
#    uninterrupted run); the same base from a Hugging Face directory gives the same bits; resuming on another base is refused naming the checkpoint's
#    trainer.json;
#  - every run's memory plan equals its allocator high-water (rank 0);
#  - QLoRA on real text (the fortunes corpus, byte tokens): a small LLaMA pre-trained 60 steps,
#    then fine-tuned 150 steps with LoRA rank 8 on q,k,v,o,gate,up,down over an fp32 base and
#    over its NF4 quantization: QLoRA's loss decreases (mean of the last 10 steps below the
#    first 10's by 3% or more) and its final loss (mean of the last 10 steps) is within 3% of
#    the fp32-base LoRA's.
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
fresh_dir "$dir"
mpi_env

# ---- bad input: one line naming the key, non-zero exit
bad() { # KEY ARGS...
  local key=$1 out rc; shift
  out=$("$bin" train --set model.preset=llama-tiny --steps 1 "$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] && [ "$(grep -c 'error' <<<"$out")" -eq 1 ] && grep -q "$key" <<<"$out"; then
    pass "refused, naming $key: $(grep error <<<"$out")"
  else
    fail "bad input $* (rc $rc): $out"
  fi
}
bad lora.rank --set lora.rank=-1
bad lora.targets --set lora.rank=4 --set lora.targets=q,query
bad lora.base_dtype --set lora.base_dtype=nf4
bad lora.targets --set model.preset=gpt2-tiny --set lora.rank=4 --set lora.targets=gate
bad lora.dropout --set lora.rank=4 --set lora.dropout=-0.1
bad lora.dropout --set lora.rank=4 --set lora.dropout=1
bad lora.dropout --set lora.rank=4 --set lora.dropout=abc

# ---- N ranks vs 1 rank, bitwise
common=(--set model.preset= --set model.family=llama --model.n_layer 2 --model.d_model 48 --model.n_head 4
        --set model.n_kv_head=2 --set model.d_ff=72 --model.vocab_size 512 --model.context 32 --seq 32 --batch 2
        --steps 12 --lr 1e-2 --warmup 2 --seed 5 --set lora.rank=4 --set lora.alpha=8
        --set lora.targets=q,k,v,o,gate,up,down --set logging.progress=lines --set logging.peak_gflops=100)
run() { # NAME N [args...]: the final checkpoint's model.safetensors holds the adapters
  local name=$1 n=$2; shift 2
  local launch=("$bin")
  [ "$n" -gt 1 ] && launch=(timeout 300 "${mpi[@]}" -n "$n" "$bin")
  "${launch[@]}" train "${common[@]}" --set logging.metrics="$dir/$name.jsonl" --set checkpoint.dir="$dir/ck_$name" \
    "$@" >"$dir/$name.log" 2>&1 || fail "$name: $(tail -3 "$dir/$name.log")"
  cp "$dir/ck_$name/$(cat "$dir/ck_$name/latest")/model.safetensors" "$dir/$name.st" 2>/dev/null
}
check() { # LABEL A B TOL
  local out
  if out=$(cmp_runs "$dir/$2.jsonl" "$dir/$2.st" "$dir/$3.jsonl" "$dir/$3.st" "$4"); then pass "$1: $out"; else fail "$1: $out"; fi
}
run one2 1 --accum 2
run one3 1 --accum 3
run ddp2 2
check "LoRA: 2 ranks DDP vs 1 rank x 2 accumulation (bitwise)" ddp2 one2 0
run ddp3 3
check "LoRA: 3 ranks DDP vs 1 rank x 3 (bitwise)" ddp3 one3 0
for s in zero1 zero2 zero3; do
  run ${s}_2 2 --set parallel.strategy=$s
  check "LoRA: $s 2 ranks vs 1 rank x 2 (bitwise)" ${s}_2 one2 0
  run ${s}_3 3 --set parallel.strategy=$s
  check "LoRA: $s 3 ranks (uneven shards) vs 1 rank x 3 (bitwise)" ${s}_3 one3 0
done
run bf16_one2 1 --accum 2 --set training.precision=bf16
run bf16_ddp2 2 --set training.precision=bf16
check "LoRA bf16: 2 ranks DDP vs 1 rank x 2 (bitwise)" bf16_ddp2 bf16_one2 0
run bf16_zero3_2 2 --set training.precision=bf16 --set parallel.strategy=zero3
check "LoRA bf16: 2 ranks ZeRO-3 vs 1 rank x 2 (bitwise)" bf16_zero3_2 bf16_one2 0
run gpt2_one2 1 --accum 2 --set model.family=gpt2 --set model.n_kv_head=0 --set model.d_ff=0 \
  --set lora.targets=q,k,v,o,up,down
run gpt2_ddp2 2 --set model.family=gpt2 --set model.n_kv_head=0 --set model.d_ff=0 --set lora.targets=q,k,v,o,up,down
check "LoRA GPT-2: 2 ranks DDP vs 1 rank x 2 (bitwise)" gpt2_ddp2 gpt2_one2 0
for r in selective full; do
  run ac_$r 1 --accum 2 --set memory.activation_checkpointing=$r
  check "LoRA: activation checkpointing $r vs none (bitwise)" ac_$r one2 0
done
# ---- lora.dropout 0.1: the masks are keyed by each sequence's global index and the step, so
# the ranks, activation checkpointing and a resume keep the bits
dr=(--set lora.dropout=0.1 --set schedule.decay_steps=12)
run d_one2 1 --accum 2 "${dr[@]}"
run d_one3 1 --accum 3 "${dr[@]}"
for s in ddp zero2; do
  run d_${s}_2 2 --set parallel.strategy=$s "${dr[@]}"
  check "LoRA dropout 0.1: $s 2 ranks vs 1 rank x 2 (bitwise)" d_${s}_2 d_one2 0
  run d_${s}_3 3 --set parallel.strategy=$s "${dr[@]}"
  check "LoRA dropout 0.1: $s 3 ranks vs 1 rank x 3 (bitwise)" d_${s}_3 d_one3 0
done
run d_bf16_one2 1 --accum 2 --set training.precision=bf16 "${dr[@]}"
run d_bf16_ddp2 2 --set training.precision=bf16 "${dr[@]}"
check "LoRA dropout 0.1 bf16: 2 ranks DDP vs 1 rank x 2 (bitwise)" d_bf16_ddp2 d_bf16_one2 0
run d_ac 1 --accum 2 --set memory.activation_checkpointing=full "${dr[@]}"
check "LoRA dropout 0.1: activation checkpointing full vs none (bitwise)" d_ac d_one2 0
run d_res 1 --accum 2 --steps 6 "${dr[@]}"
run d_res 1 --accum 2 --resume latest "${dr[@]}"
check "LoRA dropout 0.1: stopped at 6, resumed to 12 vs uninterrupted (bitwise)" d_res d_one2 0
# the dropout acts (the last loss differs from p = 0's: step 1's cannot, B being zero),
# trainer.json records it, and a resume may change it
if out=$(/usr/bin/python3 - "$dir/one2.jsonl" "$dir/d_one2.jsonl" "$dir/ck_d_one2" <<'PY'
import json, math, sys
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if r.get("type") == "step"]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
tj = json.load(open(sys.argv[3] + "/" + open(sys.argv[3] + "/latest").read().strip() + "/trainer.json"))
print("step 12 loss %.6f (p 0) vs %.6f (p 0.1); trainer.json lora_dropout %s" % (a[-1], b[-1], tj.get("lora_dropout")))
fin = all(isinstance(x, float) and math.isfinite(x) for x in a + b)  # NaN != anything: "differs" alone passes it
sys.exit(0 if len(a) == len(b) == 12 and fin and a[-1] != b[-1] and abs(tj.get("lora_dropout", 0) - 0.1) < 1e-7 else 1)
PY
); then pass "LoRA dropout: $out"; else fail "LoRA dropout: $out"; fi
"$bin" train "${common[@]}" --accum 2 --steps 7 --set lora.dropout=0.2 --set checkpoint.dir="$dir/ck_d_res" \
  --resume "$dir/ck_d_res/step-00000006" >"$dir/d_res2.log" 2>&1 \
  && pass "resume with another lora.dropout (0.1 -> 0.2) allowed" || fail "resume with another dropout: $(tail -2 "$dir/d_res2.log")"
"$bin" ckpt export --peft "$dir/ck_d_one2" "$dir/peft_d" >"$dir/peft_d.log" 2>&1 || fail "export --peft (dropout): $(tail -2 "$dir/peft_d.log")"
grep -q '"lora_dropout": 0.1,' "$dir/peft_d/adapter_config.json" && pass "export --peft: adapter_config.json lora_dropout 0.1" \
  || fail "export --peft: lora_dropout: $(grep dropout "$dir/peft_d/adapter_config.json")"
# a LoRA checkpoint is no whole model: eval, sample, export --hf and model.init_from refuse it
for cmd in "eval $dir/ck_one2 --data.val x" "sample $dir/ck_one2 --prompt a --max-tokens 2" \
           "ckpt export --hf $dir/ck_one2 $dir/hfx" "train ${common[*]} --set model.init_from=$dir/ck_one2 --steps 3"; do
  out=$("$bin" $cmd 2>&1); rc=$?
  if [ $rc -ne 0 ] && [ "$(grep -c error <<<"$out")" -eq 1 ] && grep -q 'a LoRA checkpoint (lora.rank 4) holds only adapters' <<<"$out"; then
    pass "${cmd%% *} of a LoRA checkpoint refused: $(grep error <<<"$out" | cut -c1-160)"
  else
    fail "${cmd%% *} of a LoRA checkpoint (rc $rc): $out"
  fi
done
# the checkpoint holds the adapters only
if out=$(/usr/bin/python3 - "$dir/ddp2.st" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n, = struct.unpack("<Q", raw[:8])
names = [k for k in json.loads(raw[8:8 + n]) if k != "__metadata__"]
assert names and all(".lora_A." in k or ".lora_B." in k for k in names), names
print("%d tensors, every one lora_A or lora_B" % len(names))
PY
); then pass "LoRA checkpoint: $out"; else fail "LoRA checkpoint: $out"; fi

# PEFT export: every adapter under PEFT's name, bitwise, and adapter_config.json
"$bin" ckpt export --peft "$dir/ck_one2" "$dir/peft" >"$dir/peft.log" 2>&1 || fail "export --peft: $(tail -2 "$dir/peft.log")"
if out=$(/usr/bin/python3 - "$dir/ck_one2/$(cat "$dir/ck_one2/latest")/model.safetensors" "$dir/peft" <<'PY'
import json, os, struct, sys
import numpy as np
def st(p):
    raw = open(p, "rb").read()
    n, = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["shape"], np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32))
            for k, v in h.items()}
ck, pe = st(sys.argv[1]), st(os.path.join(sys.argv[2], "adapter_model.safetensors"))
assert set(pe) == {"base_model.model." + k for k in ck}, sorted(set(pe) ^ {"base_model.model." + k for k in ck})
for k, (shape, v) in ck.items():
    s2, v2 = pe["base_model.model." + k]
    assert s2 == shape and len(s2) == 2 and np.array_equal(v, v2), k
    assert (s2[0] == 4) == (".lora_A." in k), (k, s2)
c = json.load(open(os.path.join(sys.argv[2], "adapter_config.json")))
assert c["peft_type"] == "LORA" and c["r"] == 4 and c["lora_alpha"] == 8 and c["lora_dropout"] == 0, c
assert c["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], c
print("%d tensors under PEFT names, bitwise; r %d, lora_alpha %g, %d target modules" % (len(pe), c["r"], c["lora_alpha"], len(c["target_modules"])))
PY
); then pass "export --peft: $out"; else fail "export --peft: $out"; fi
out=$("$bin" ckpt export --peft "$dir/ck_gpt2_one2" "$dir/peft_gpt2" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q 'gpt2 adapters have no PEFT layout' <<<"$out" && pass "export --peft of GPT-2 adapters refused: $(grep error <<<"$out")" \
  || fail "export --peft gpt2 (rc $rc): $out"

# ---- bytes on the wire: 4 bytes per adapter parameter (+ the 8-byte loss)
P=$(grep -o '[0-9]* trainable parameters' "$dir/one2.log" | cut -d' ' -f1)
# per layer: q (4x48 + 48x4), k, v (4x48 + 24x4), o (4x48 + 48x4), gate, up (4x48 + 72x4), down (4x72 + 48x4)
want_P=$((2 * (384 + 288 + 288 + 384 + 480 + 480 + 480)))
[ "$P" = "$want_P" ] && pass "trainable parameters: $P (the formula's)" || fail "trainable parameters $P, formula $want_P"
timeout 300 "${mpi[@]}" -n 2 "$bin" bench "${common[@]}" --warmup-steps 1 --bench-steps 2 --peak 100 \
  --json "$dir/bench.json" >"$dir/bench.log" 2>&1 || fail "bench: $(tail -3 "$dir/bench.log")"
if out=$(/usr/bin/python3 - "$dir/bench.json" "$P" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
b, m = j["summary"]["comm_bytes_step"], j["model"]
P = int(sys.argv[2])
print("2-rank DDP sends %d bytes per step; 4 x %d adapter parameters + 8 (loss) = %d; bench JSON model.trainable_params %d "
      "of %d, lora %s" % (b, P, 4 * P + 8, m["trainable_params"], m["params"], m.get("lora")))
ok = m["trainable_params"] == P < m["params"] and m.get("lora", {}).get("rank") == 4 and m["lora"]["base_dtype"] == "fp32"
sys.exit(0 if b == 4 * P + 8 and ok else 1)
PY
); then pass "adapter-only gradients on the wire: $out"; else fail "bytes on the wire: $out"; fi

# ---- fine-tuning a saved base: checksum reference, resume bit-exact, mismatch refused
base=(--set model.preset= --set model.family=llama --model.n_layer 2 --model.d_model 48 --model.n_head 4
      --set model.n_kv_head=2 --set model.d_ff=72 --model.vocab_size 512 --model.context 32 --seq 32 --batch 2)
"$bin" train "${base[@]}" --steps 2 --seed 1 --save-weights "$dir/base1.st" >"$dir/base1.log" 2>&1 || fail "base1: $(tail -2 "$dir/base1.log")"
"$bin" train "${base[@]}" --steps 2 --seed 2 --save-weights "$dir/base2.st" >"$dir/base2.log" 2>&1 || fail "base2: $(tail -2 "$dir/base2.log")"
ft=("${base[@]}" --set model.init_from="$dir/base1.st" --lr 1e-2 --warmup 2 --set schedule.decay_steps=20
    --set lora.rank=4 --set lora.targets=q,v,down --set logging.progress=lines --set logging.peak_gflops=100)
for b in fp32 nf4; do
  "$bin" train "${ft[@]}" --set lora.base_dtype=$b --steps 20 --set logging.metrics="$dir/full_$b.jsonl" \
    --set checkpoint.dir="$dir/ckf_$b" >"$dir/full_$b.log" 2>&1 || fail "full $b: $(tail -2 "$dir/full_$b.log")"
  "$bin" train "${ft[@]}" --set lora.base_dtype=$b --steps 10 --set logging.metrics="$dir/res_$b.jsonl" \
    --set checkpoint.dir="$dir/ckr_$b" >"$dir/res_a_$b.log" 2>&1 || fail "resume part 1 $b: $(tail -2 "$dir/res_a_$b.log")"
  "$bin" train "${ft[@]}" --set lora.base_dtype=$b --steps 20 --set logging.metrics="$dir/res_$b.jsonl" \
    --set checkpoint.dir="$dir/ckr_$b" --resume latest >"$dir/res_b_$b.log" 2>&1 || fail "resume part 2 $b: $(tail -2 "$dir/res_b_$b.log")"
  cp "$dir/ckf_$b/step-00000020/model.safetensors" "$dir/full_$b.st"
  cp "$dir/ckr_$b/step-00000020/model.safetensors" "$dir/res_$b.st"
  grep -q '"lora_base": "xxh3:' "$dir/ckr_$b/step-00000020/trainer.json" && pass "$b base: trainer.json refers to the base (lora_base)" \
    || fail "$b base: no lora_base in trainer.json"
  check "LoRA ($b base from model.init_from): stopped at 10, resumed to 20 vs uninterrupted (bitwise)" res_$b full_$b 0
done
# the same base as a Hugging Face directory (imported whole, then set): the same run, bitwise
"$bin" ckpt export --hf "$dir/base1.st" "$dir/base1_hf" >"$dir/hfexp.log" 2>&1 || fail "export --hf: $(tail -2 "$dir/hfexp.log")"
for b in fp32 nf4; do
  "$bin" train "${ft[@]}" --set model.init_from="$dir/base1_hf" --set lora.base_dtype=$b --steps 20 \
    --set logging.metrics="$dir/hf_$b.jsonl" --set checkpoint.dir="$dir/ckh_$b" >"$dir/hf_$b.log" 2>&1 \
    || fail "fine-tune from HF $b: $(tail -2 "$dir/hf_$b.log")"
  cp "$dir/ckh_$b/step-00000020/model.safetensors" "$dir/hf_$b.st"
  check "LoRA ($b base): the base from a Hugging Face directory vs the dtrain file (bitwise)" hf_$b full_$b 0
done
grep -q "read tensor by tensor" "$dir/full_nf4.log" && ! grep -q "read tensor by tensor" "$dir/hf_nf4.log" \
  && pass "the dtrain file's base is read tensor by tensor, the HF directory's imported whole" \
  || fail "base load paths: $(grep 'frozen base' "$dir/full_nf4.log" "$dir/hf_nf4.log")"
out=$("$bin" train "${ft[@]}" --set model.init_from="$dir/base2.st" --steps 20 --set checkpoint.dir="$dir/ckr_fp32" \
  --resume "$dir/ckr_fp32/step-00000010" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q 'ckr_fp32/step-00000010/trainer.json: its adapters were trained on another base' <<<"$out"; then
  pass "resume on another base refused: $(grep error <<<"$out")"
else
  fail "resume on another base (rc $rc): $out"
fi

# ---- QLoRA on real text: loss decreases, final loss within 3% of LoRA on the fp32 base
corpus=/usr/share/games/fortunes
mapfile -t files < <(find "$corpus" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name '*art' 2>/dev/null | sort)
if [ ${#files[@]} -eq 0 ]; then
  fail "no corpus in $corpus (scripts/install-deps.sh installs package fortunes)"
else
  "$bin" prepare --tokenizer byte --doc-sep % --val-fraction 0.05 --out "$dir/f" "${files[@]}" >"$dir/prep" 2>&1 \
    || fail "prepare: $(tail -2 "$dir/prep")"
  m=(--set model.preset= --set model.family=llama --model.n_layer 2 --model.d_model 64 --model.n_head 4
     --set model.n_kv_head=2 --model.vocab_size 256 --model.context 64 --seq 64 --batch 8 --data "$dir/f_train_*.bin"
     --set logging.progress=lines --set logging.peak_gflops=100)
  "$bin" train "${m[@]}" --steps 60 --lr 3e-3 --warmup 20 --save-weights "$dir/fbase.st" >"$dir/fbase.log" 2>&1 \
    || fail "pre-training: $(tail -2 "$dir/fbase.log")"
  for b in fp32 nf4; do
    "$bin" train "${m[@]}" --set model.init_from="$dir/fbase.st" --steps 150 --lr 3e-3 --warmup 10 --seed 3 \
      --set lora.rank=8 --set lora.alpha=16 --set lora.targets=q,k,v,o,gate,up,down --set lora.base_dtype=$b \
      --set logging.metrics="$dir/q_$b.jsonl" >"$dir/q_$b.log" 2>&1 || fail "fine-tune $b: $(tail -2 "$dir/q_$b.log")"
  done
  if out=$(/usr/bin/python3 - "$dir/q_fp32.jsonl" "$dir/q_nf4.jsonl" <<'PY'
import json, sys
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if r.get("type") == "step"]
f, q = losses(sys.argv[1]), losses(sys.argv[2])
assert len(f) == len(q) == 150, (len(f), len(q))
m = lambda x: sum(x) / len(x)
q0, q1, f1 = m(q[:10]), m(q[-10:]), m(f[-10:])
rel = abs(q1 - f1) / f1
print("150 steps: QLoRA %.4f -> %.4f (-%.1f%%); LoRA fp32 base final %.4f; QLoRA vs LoRA %.2f%%"
      % (q0, q1, 100 * (1 - q1 / q0), f1, 100 * rel))
sys.exit(0 if q1 <= 0.97 * q0 and rel <= 0.03 else 1)
PY
  ); then pass "QLoRA on fortunes: $out"; else fail "QLoRA on fortunes: $out"; fi
fi

# every run above logged rank 0's allocator high-water beside the memory plan: equal
if out=$(/usr/bin/python3 - "$dir" <<'PY'
import glob, re, sys
n, bad = 0, []
for f in sorted(glob.glob(sys.argv[1] + "/*.log")):
    for m in re.finditer(r"memory high-water: allocator=(\d+) plan=(\d+)", open(f, errors="replace").read()):
        n += 1
        if m.group(1) != m.group(2):
            bad.append("%s: %s != %s" % (f, m.group(1), m.group(2)))
print("%d LoRA/QLoRA runs (1-3 ranks, DDP, ZeRO-1/2/3, bf16, nf4, checkpointing): plan == allocator%s"
      % (n, "; " + "; ".join(bad) if bad else ""))
sys.exit(0 if n >= 20 and not bad else 1)
PY
); then pass "memory: $out"; else fail "memory: $out"; fi

echo "test_lora: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
