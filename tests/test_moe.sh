#!/usr/bin/env bash
# Mixture of experts (model/llama/moe.h, issue 34 items 1-2):
#  - mixtral-tiny with both router losses on: DDP, ZeRO-1/2/3 on 2 ranks bitwise equal
#    to 1 rank with 2 accumulation steps (losses and final weights, 10 steps); with
#    parallel.moe_capacity_factor 0.5 too (the capacity is per micro-batch: the same
#    micro-batches drop the same choices), where choices are dropped and counted;
#  - activation checkpointing (selective, full; ZeRO-3 with full on 2 ranks) bitwise equal to none;
#  - the memory plan equals the allocator's high-water in each of those runs; a checkpoint
#    resumes bitwise (steps 4-6 of a 6-step run from its step-3 checkpoint);
#  - the aux and z-losses are logged apart from the cross-entropy, and loss = ce + coefficients x them;
#    so with the layer-wise load-balancing loss (training.moe_aux_loss_type=layer), whose 2
#    ranks equal 1 rank accumulating bitwise;
#  - bad input: one line naming the key, exit 2, before allocation;
#  - a hand-written Hugging Face Mixtral directory (2 shards, F32) imported: logits, loss and every
#    layer's expert choices equal a float64 PyTorch Mixtral's (tests/ref/hf_mixtral_check.py,
#    tests/ref/mixtral_torch.py) to 1e-5, tokens with a top-2 margin below 1e-6 excluded and
#    counted; with parallel.moe_capacity_factor 1.0 the loss and the dropped count equal the
#    reference's (its capacity rule written from the key's definition); `dtrain eval DIR` gives
#    the same loss; a validation pass during training reports the cross-entropy alone; a trained model exported (ckpt export --hf)
#    gives dtrain's eval loss in the same reference, and imports back to the same results;
#  - the expert load (decision 86): each step's per-layer counts add up to B T k x accumulation,
#    2 ranks equal 1 rank accumulating, checkpointing equals none; the bench JSON's moe section
#    (keys documented) and the report's heat map, absent for a dense model.
set -uo pipefail
bin=$1
dump=$2
dir=$3
. "$(dirname "$0")/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
py=/usr/bin/python3
ref=$src/tests/ref
export OMP_NUM_THREADS=1

# ---- bad input: exit 2, one line on stderr naming the key
refused() { # NAME TEXT ARGS...
  local name=$1 text=$2; shift 2
  "$bin" train --set model.preset=mixtral-tiny --steps 1 --set logging.metrics= "$@" >"$dir/out" 2>"$dir/err"
  local rc=$?
  if [ $rc -eq 2 ] && grep -qF -- "$text" "$dir/err" && [ "$(wc -l <"$dir/err")" -eq 1 ] &&
     ! grep -q "memory high-water" "$dir/out"; then
    pass "$name: $(cat "$dir/err")"
  else
    fail "$name (rc=$rc; stderr: $(head -c 600 "$dir/err"))"
  fi
}
refused "top-k above the experts" "model.experts_topk must be in [1, model.n_experts=4] (got 5)" --set model.experts_topk=5
refused "top-k 0" "model.experts_topk must be in [1, model.n_experts=4] (got 0)" --set model.experts_topk=0
refused "capacity factor < 0" "parallel.moe_capacity_factor must be in [0, 1e6] (0 = dropless; got -0.5)" \
  --set parallel.moe_capacity_factor=-0.5
refused "experts on gpt2" "model.n_experts: gpt2 has no experts" --set model.preset=gpt2-tiny --set model.n_experts=4
refused "experts on vit" "model.experts_topk: vit has no experts" --set model.preset=vit-tiny --set model.experts_topk=2
refused "top-k on a dense llama" "model.experts_topk: needs model.n_experts > 0" --set model.preset=llama-tiny \
  --set model.experts_topk=2
refused "17 experts" "model.n_experts must be in [0, 16] (got 17)" --set model.n_experts=17
refused "layer-wise aux loss with context parallelism" "training.moe_aux_loss_type=layer with parallel.cp=2: not built" \
  --set parallel.cp=2 --set training.moe_aux_loss_type=layer
refused "LoRA in bf16" "lora.rank with model.n_experts > 0 and training.precision=bf16: not built" --set lora.rank=4 \
  --set training.precision=bf16
refused "LoRA's dense gate on experts" "lora.targets: 'gate' names a dense MLP projection" --set lora.rank=4 \
  --set lora.targets=q,gate
refused "sequence parallelism" "parallel.sequence_parallel with model.n_experts=4: sequence parallelism of a mixture of experts is not built" \
  --set parallel.tp=2 --set parallel.tp_blocks=true --set parallel.sequence_parallel=true
refused "a pipeline under tensor parallelism" "parallel.pp with parallel.tp=2 and model.n_experts=4" \
  --set parallel.tp=2 --set parallel.tp_blocks=true --set parallel.pp=2 --set parallel.pp_blocks=true
refused "tensor parallelism of experts in bf16" "parallel.tp=2 with model.n_experts=4 and training.precision=bf16: not built" \
  --set parallel.tp=2 --set parallel.tp_blocks=true --set training.precision=bf16
refused "tensor parallelism of experts with LoRA" "parallel.tp=2 with model.n_experts=4 and lora.rank: not built" \
  --set parallel.tp=2 --set parallel.tp_blocks=true --set lora.rank=4

# ---- 2 ranks == 1 rank with accumulation, bitwise
mpi_env
common=(--set model.preset=mixtral-tiny --seq 32 --batch 2 --steps 10 --lr 3e-3 --warmup 2 --seed 5
        --set training.moe_aux_loss_coef=0.05 --set training.moe_z_loss_coef=0.01
        --set logging.progress=lines --set logging.peak_gflops=100 --set logging.every=1)
run1() { # NAME [args...]
  local name=$1; shift
  "$bin" train "${common[@]}" --accum 2 --set logging.metrics="$dir/$name.jsonl" \
    --save-weights "$dir/$name.st" "$@" >"$dir/$name.log" 2>&1 || fail "$name: $(tail -2 "$dir/$name.log")"
}
runN() { # NAME [args...]: 2 ranks
  local name=$1; shift
  timeout 200 "${mpi[@]}" -n 2 "$bin" train "${common[@]}" --set logging.metrics="$dir/$name.jsonl" \
    --save-weights "$dir/$name.st" "$@" >"$dir/$name.log" 2>&1 || fail "$name: $(tail -3 "$dir/$name.log")"
}
check() { # LABEL A B
  local out
  if out=$(cmp_runs "$dir/$2.jsonl" "$dir/$2.st" "$dir/$3.jsonl" "$dir/$3.st" 0); then pass "$1: $out"; else fail "$1: $out"; fi
}
plan_eq() { # NAME: every rank's plan equals its allocator high-water
  local lines
  lines=$(grep -o "allocator=[0-9]* plan=[0-9]*" "$dir/$1.log")
  if [ -n "$lines" ] && awk -F'[= ]' '$2 != $4 {bad = 1} END {exit bad}' <<<"$lines"; then
    pass "$1: plan = allocator high-water ($(head -1 <<<"$lines"))"
  else
    fail "$1: plan vs high-water: ${lines:-none logged}"
  fi
}
run1 one
plan_eq one
for s in ddp zero1 zero2 zero3; do
  runN $s --set parallel.strategy=$s
  check "mixtral-tiny $s 2 ranks vs 1 rank x 2 accumulation" $s one
  plan_eq $s
done
# activation checkpointing: the same bits (full re-runs the routing and the experts in the backward)
run1 one_sel --set memory.activation_checkpointing=selective
check "activation checkpointing selective vs none (1 rank)" one_sel one
run1 one_full --set memory.activation_checkpointing=full
check "activation checkpointing full vs none (1 rank)" one_full one
plan_eq one_full
runN zero3_full --set parallel.strategy=zero3 --set memory.activation_checkpointing=full \
  --set memory.activation_checkpointing_every=1
check "ZeRO-3 2 ranks with full activation checkpointing vs 1 rank" zero3_full one
plan_eq zero3_full
run1 one_cap --set parallel.moe_capacity_factor=0.5
run1 one_layer --set training.moe_aux_loss_type=layer
runN ddp_layer --set training.moe_aux_loss_type=layer
check "layer-wise aux loss: DDP 2 ranks vs 1 rank x 2 accumulation" ddp_layer one_layer
runN ddp_cap --set parallel.moe_capacity_factor=0.5
check "capacity 0.5: DDP 2 ranks vs 1 rank x 2 accumulation" ddp_cap one_cap
runN zero3_cap --set parallel.strategy=zero3 --set parallel.moe_capacity_factor=0.5
check "capacity 0.5: ZeRO-3 2 ranks vs 1 rank x 2 accumulation" zero3_cap one_cap
plan_eq zero3_cap
# the logged terms: loss = ce + 0.05 aux + 0.01 z (float32 sums), dropped > 0 only with a capacity,
# and a capacity of 0.5 drops at least half of the choices beyond it (here: > 0)
if $py - "$dir/one.jsonl" "$dir/one_cap.jsonl" "$dir/one_layer.jsonl" <<'EOF'; then pass "aux and z-loss logged apart: loss = ce + 0.05 aux + 0.01 z, dropped 0 dropless, > 0 at capacity 0.5; the layer-wise aux in [L, L E / k] and not the pooled one"; else fail "logged MoE terms"; fi
import json, math, sys
def steps(p):
    return [r for r in map(json.loads, open(p)) if r.get("type") == "step"]
a, b, c = steps(sys.argv[1]), steps(sys.argv[2]), steps(sys.argv[3])
ok = len(a) == 10 and len(b) == 10 and len(c) == 10
for r in a + b + c:
    vals = [r["loss"], r["ce_loss"], r["moe_aux_loss"], r["moe_z_loss"]]
    ok &= all(isinstance(v, float) and math.isfinite(v) for v in vals)
    ok &= abs(r["loss"] - (r["ce_loss"] + 0.05 * r["moe_aux_loss"] + 0.01 * r["moe_z_loss"])) <= 1e-5 * r["loss"]
for r in a + b:
    ok &= 0.99 * 2 <= r["moe_aux_loss"] <= 2 * 4      # k <= aux <= k E (k = 2, E = 4)
for r in c: # each of the 2 layers: 1 <= its loss <= E / k (every choice on k experts)
    ok &= 0.99 * 2 <= r["moe_aux_loss"] <= 2 * 4 / 2
ok &= c[0]["moe_aux_loss"] != a[0]["moe_aux_loss"] # the same routing at step 1, another loss
ok &= all(r["moe_dropped"] == 0 for r in a) and all(r["moe_dropped"] > 0 for r in b)
print("dropped per step at capacity 0.5:", [r["moe_dropped"] for r in b])
sys.exit(0 if ok else 1)
EOF

# the expert load (ARCHITECTURE decision 86): every step, each layer's counts add up to
# B T k x accumulation x ranks (2 x 32 x 2 x 2), max/mean is theirs; 2 ranks (the sum of both
# ranks' counts) equal 1 rank accumulating their two micro-batches, as does checkpointing
if $py - "$dir" <<'EOF'; then pass "expert load: per layer B T k x accum x ranks every step, max/mean recomputed, 2 ranks (DDP, ZeRO-1/2/3) = 1 rank x 2 accumulation, checkpointing = none"; else fail "expert load (moe_load)"; fi
import json, math, sys
d = sys.argv[1]
def steps(n):
    return [r for r in map(json.loads, open(f"{d}/{n}.jsonl")) if r.get("type") == "step"]
def loads(n):
    out = []
    for r in steps(n):
        ld, mm = r["moe_load"], r["moe_load_max_mean"]
        assert len(ld) == 2 and all(len(x) == 4 and sum(x) == 2 * 32 * 2 * 2 for x in ld), (n, ld)
        assert all(isinstance(v, int) and v >= 0 for x in ld for v in x), (n, ld)
        want = max(max(x) * len(x) / sum(x) for x in ld)
        assert math.isfinite(mm) and abs(mm - want) <= 1e-5 * want and mm >= 1, (n, mm, want)
        out.append(ld)
    assert len(out) == 10, n
    return out
one, cap = loads("one"), loads("one_cap")
assert len({str(x) for x in one}) > 1, "the load changes over the steps"
for n in ("ddp", "zero1", "zero2", "zero3", "zero3_full", "one_sel", "one_full"):
    assert loads(n) == one, n
assert loads("ddp_cap") == cap and loads("zero3_cap") == cap
print("step 1 load:", one[0], "max/mean", steps("one")[0]["moe_load_max_mean"])
EOF

# ---- a checkpoint resumes bitwise (capacity on): steps 4-6 resumed from step 3 = the run's own
res=(--set model.preset=mixtral-tiny --seq 32 --batch 2 --steps 6 --set training.moe_aux_loss_coef=0.05
     --set parallel.moe_capacity_factor=1.0 --set logging.every=1 --set logging.progress=lines)
"$bin" train "${res[@]}" --set checkpoint.dir="$dir/ck" --set checkpoint.every=3 --set logging.metrics="$dir/ra.jsonl" \
  --save-weights "$dir/ra.st" >"$dir/ra.log" 2>&1 || fail "run with checkpoints: $(tail -1 "$dir/ra.log")"
"$bin" train "${res[@]}" --set checkpoint.dir="$dir/ck2" --resume "$dir/ck/step-00000003" \
  --set logging.metrics="$dir/rb.jsonl" --save-weights "$dir/rb.st" >"$dir/rb.log" 2>&1 || fail "resume: $(tail -1 "$dir/rb.log")"
la=$(grep -o '"step":[456],"steps":6,"loss":[-0-9.e]*' "$dir/ra.jsonl")
lb=$(grep -o '"step":[456],"steps":6,"loss":[-0-9.e]*' "$dir/rb.jsonl")
if [ -n "$la" ] && [ "$la" = "$lb" ] && [ "$(wc -l <<<"$la")" -eq 3 ] && cmp -s "$dir/ra.st" "$dir/rb.st"; then
  pass "resumed from step 3: the losses of steps 4-6 and the final weights bitwise the uninterrupted run's"
else fail "resume: losses '$la' vs '$lb', weights $(cmp "$dir/ra.st" "$dir/rb.st" 2>&1 | head -1)"; fi

# ---- Hugging Face Mixtral in: a sharded directory against the float64 PyTorch Mixtral
hf=$dir/hf
T=48
if out=$($py "$ref/hf_mixtral_check.py" make "$hf" 2 "$hf.val" $T --seed 3 2>&1); then
  hf_ref=$(awk '$1 == "loss" {print $2}' <<<"$out")
  if OMP_NUM_THREADS=2 "$dump" "$hf" "$hf.val" $T "$dir/hf.dump.st" >"$dir/hf.dump.log" 2>&1; then
    if o=$($py "$ref/hf_mixtral_check.py" check "$hf" "$hf.val" "$dir/hf.dump.st" 1e-5); then
      pass "HF Mixtral (2 shards) imported = PyTorch float64: $o"
    else fail "HF Mixtral import: $o"; fi
  else fail "moe_dump: $(tail -1 "$dir/hf.dump.log")"; fi
  if "$bin" eval "$hf" --data.val "$hf.val" --set data.format=raw16 --batch 1 --seq $T >"$dir/hf.eval" 2>&1 &&
     o=$($py "$ref/hf_llama_check.py" compare "$hf_ref" "$dir/hf.eval" 1e-5 $T); then
    pass "dtrain eval of the HF Mixtral directory = PyTorch float64 loss: $o"
  else fail "dtrain eval of the HF Mixtral directory: ${o:-$(tail -1 "$dir/hf.eval")}"; fi
else
  fail "hf_mixtral_check.py make: $out"
fi

# ---- out: a trained model exported, its loss in the reference = dtrain's eval; imported back
"$bin" train --set model.preset=mixtral-tiny --set model.vocab_size=300 --seq 32 --batch 2 --steps 3 --lr 1e-2 \
  --set logging.metrics= --save-weights "$dir/tr.st" >"$dir/tr.log" 2>&1 || fail "train for export: $(tail -1 "$dir/tr.log")"
if "$bin" ckpt export --hf "$dir/tr.st" "$dir/exp" >"$dir/exp.log" 2>&1 &&
   grep -q '"model_type": "mixtral"' "$dir/exp/config.json" && grep -q '"MixtralForCausalLM"' "$dir/exp/config.json"; then
  exp_ref=$($py "$ref/hf_mixtral_check.py" loss "$dir/exp" "$hf.val" | awk '$1 == "loss" {print $2}')
  if "$bin" eval "$dir/tr.st" --data.val "$hf.val" --set data.format=raw16 --batch 1 --seq $T >"$dir/tr.eval" 2>&1 &&
     o=$($py "$ref/hf_llama_check.py" compare "$exp_ref" "$dir/tr.eval" 1e-5 $T); then
    pass "exported Mixtral: PyTorch float64 loss of the export = dtrain eval of the model: $o"
  else fail "exported Mixtral loss: ${o:-$(tail -1 "$dir/tr.eval")}"; fi
  if OMP_NUM_THREADS=2 "$dump" "$dir/exp" "$hf.val" $T "$dir/exp.dump.st" >"$dir/exp.dump.log" 2>&1 &&
     o=$($py "$ref/hf_mixtral_check.py" check "$dir/exp" "$hf.val" "$dir/exp.dump.st" 1e-5); then
    pass "the export imported back = PyTorch float64: $o"
  else fail "the export imported back: ${o:-$(tail -1 "$dir/exp.dump.log")}"; fi
else
  fail "ckpt export --hf of a mixtral model: $(tail -1 "$dir/exp.log")"
fi

# ---- a validation pass reports the cross-entropy alone (the router losses are training terms):
# with an aux coefficient of 0.5 the last step's val_loss equals `dtrain eval` of the saved weights
"$bin" train --set model.preset=mixtral-tiny --set model.vocab_size=300 --seq 16 --batch 1 --steps 3 \
  --set training.moe_aux_loss_coef=0.5 --set training.eval_interval=3 --set data.val="$hf.val" \
  --set data.format=raw16 --set logging.metrics="$dir/val.jsonl" --save-weights "$dir/val.st" >"$dir/val.log" 2>&1 ||
  fail "train with validation: $(tail -1 "$dir/val.log")"
"$bin" eval "$dir/val.st" --data.val "$hf.val" --set data.format=raw16 --batch 1 --seq 16 >"$dir/val.eval" 2>&1 ||
  fail "eval of the saved weights: $(tail -1 "$dir/val.eval")"
v_train=$(grep '"type":"eval","step":3' "$dir/val.jsonl" | grep -o '"val_loss":[-0-9.e]*' | cut -d: -f2)
if o=$($py "$ref/hf_llama_check.py" compare "${v_train:-nan}" "$dir/val.eval" 2e-7 48); then
  pass "validation loss = cross-entropy (dtrain eval of the same weights): $o"
else fail "validation loss with an aux coefficient: ${v_train:-none} vs $(tail -1 "$dir/val.eval") ($o)"; fi

# ---- the expert load in dtrain bench and dtrain report (decision 86): the bench JSON's moe
# section (its keys FORMATS.md's; each layer's mean load adds up to B T k x accumulation), the
# report's heat map (layers x experts cells) for it; a dense model's bench and report have none
bargs=(--seq 32 --batch 2 --accum 2 --bench-steps 2 --warmup-steps 1 --repeats 1 --peak 100)
if "$bin" bench --model mixtral-tiny "${bargs[@]}" --json "$dir/bench_moe.json" >"$dir/bench_moe.log" 2>&1 &&
   "$bin" bench --model llama-tiny "${bargs[@]}" --json "$dir/bench_dense.json" >"$dir/bench_dense.log" 2>&1; then
  if o=$($py "$src/tests/check_bench.py" keys "$dir/bench_moe.json" "$src/docs/FORMATS.md" 2>&1) &&
     o2=$($py "$src/tests/check_bench.py" keys "$dir/bench_dense.json" "$src/docs/FORMATS.md" 2>&1) &&
     $py - "$dir/bench_moe.json" "$dir/bench_dense.json" <<'EOF'; then
import json, math, sys
m, d = json.load(open(sys.argv[1]))["moe"], json.load(open(sys.argv[2]))
assert "moe" not in d
assert len(m["load"]) == 2 and all(len(x) == 4 and sum(x) == 2 * 32 * 2 * 2 for x in m["load"]), m["load"]
assert all(math.isfinite(v) for v in (m["load_max_mean"], m["aux_loss"], m["z_loss"])) and m["load_max_mean"] >= 1
assert m["dropped"] == 0
EOF
    pass "bench JSON: moe.load (each layer's mean adds up to B T k x accum), load_max_mean, dropped, aux and z; keys documented ($o, dense: $o2)"
  else fail "bench JSON's moe section: $o ${o2:-}"; fi
  if "$bin" report "$dir/bench_moe.json" "$dir/bench_dense.json" -o "$dir/report.html" >"$dir/report.log" 2>&1 &&
     grep -q 'id="chart-moe-load-0"' "$dir/report.html" && [ "$(grep -o 'class="mark heat-cell"' "$dir/report.html" | wc -l)" -eq 8 ] &&
     ! grep -q 'id="chart-moe-load-1"' "$dir/report.html" &&
     "$bin" report "$dir/bench_dense.json" -o "$dir/report_dense.html" >>"$dir/report.log" 2>&1 &&
     ! grep -q 'chart-moe-load\|heat-cell' "$dir/report_dense.html"; then
    pass "report: the MoE run's expert-load heat map (2 layers x 4 experts), none for the dense run"
  else fail "report's expert-load heat map: $(tail -1 "$dir/report.log")"; fi
else fail "bench of mixtral-tiny / llama-tiny: $(tail -1 "$dir/bench_moe.log") $(tail -1 "$dir/bench_dense.log")"; fi

echo "test_moe: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
