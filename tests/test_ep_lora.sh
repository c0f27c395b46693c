#!/usr/bin/env bash
# LoRA and QLoRA on a mixture of experts under expert parallelism (lora.targets w1, w2, w3;
# ARCHITECTURE decision 90): each expert's adapters live with the expert on its owner and their
# gradients travel in the expert segments of decision 85. mixtral-tiny, adapters on q, v and
# every expert's w1, w2, w3, both router losses and clipping on, 6 steps, against ep = 1 at dp 2:
#  - dp 2 ep 2 with an fp32 base and with an NF4 base (QLoRA; with grad_accum 2, a capacity
#    factor that drops choices and full activation checkpointing): losses and gradient norms every
#    step, the router's numbers, and the checkpoint's adapters (tensor by tensor, gathered from
#    the EP ranks into the whole model's names) bitwise; trainer.json's base hash and
#    fingerprint the same at both layouts (layout-free);
#  - adapters on the attention only (the experts frozen, no expert segments) at ep 2 bitwise ep 1;
#  - the ep 2 checkpoint resumed at ep 1 continues bitwise (steps 4-6 from step 3);
#  - `dtrain ckpt export --peft` of the ep 2 checkpoint: every expert's adapters under PEFT's
#    Mixtral names (base_model.model.model.layers.N.block_sparse_moe.experts.E.w1.lora_A.weight),
#    bitwise, target_modules w1, w2, w3;
#  - the allocator's high-water equals the memory plan on every run;
#  - refused in one line naming the key: lora.dropout with expert targets, gate on a MoE model,
#    LoRA under ep with a pipeline, LoRA on experts in bf16.
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
mpi_env
mpi+=(-x DTRAIN_NODE_ID -x PPN)
export PPN=2

model=(--set model.preset=mixtral-tiny --seq 32)
train=(--batch 2 --steps 6 --lr 3e-3 --warmup 2 --seed 11 --set optimizer.grad_clip=1.0
       --set training.moe_aux_loss_coef=0.02 --set training.moe_z_loss_coef=0.001
       --set lora.rank=4 --set lora.alpha=8 --set lora.targets=q,v,w1,w2,w3
       --set logging.progress=lines --set logging.every=1
       --set checkpoint.every=3 --set checkpoint.keep_last=0 --set checkpoint.async=false)
. "$(dirname "$0")/tp_lib.sh" # run, compare, check, refused, same_moe
# same_ck WHAT A B: the step-6 checkpoints' adapters tensor by tensor, and trainer.json's base ids
same_ck() {
  local out
  if out=$(/usr/bin/python3 - "$dir/$2/step-00000006" "$dir/$3/step-00000006" <<'PY'
import json, struct, sys
def st(p):
    raw = open(p + "/model.safetensors", "rb").read()
    n, = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = st(sys.argv[1]), st(sys.argv[2])
assert set(a) == set(b) and a, sorted(set(a) ^ set(b))
bad = [k for k in a if a[k] != b[k]]
assert not bad, bad[:4]
assert all(len(v[1]) > 0 for v in a.values()), "an empty tensor"
ex = [k for k in a if ".experts." in k]
ja, jb = (json.load(open(p + "/trainer.json")) for p in sys.argv[1:3])
ids = [(j.get("lora_base"), j.get("lora_base_fp")) for j in (ja, jb)]
assert ids[0] == ids[1] and ids[0][0], ids
print("%d adapter tensors (%d of experts) identical; base %s" % (len(a), len(ex), ids[0][0]))
PY
  ); then pass "$1: $out"; else fail "$1: $out"; fi
}
pair() { # WHAT REF NAME ARGS...: REF at dp 2 ep 1, NAME at dp 2 ep 2, compared bitwise
  local what=$1 ref=$2 name=$3; shift 3
  run "$ref" 2 --set checkpoint.dir="$dir/$ref" "$@" || return
  run "$name" 2 --set parallel.ep=2 --set checkpoint.dir="$dir/$name" "$@" || return
  check "$what: dp 2 ep 2 == ep 1, bitwise" "$ref" "$name" bitwise 6
  same_moe "$what" "$ref" "$name"
  same_ck "$what: checkpoints" "$ref" "$name"
}

pair "LoRA on q, v, w1, w2, w3" d2 d2e2
pair "QLoRA (nf4 base), grad_accum 2, capacity 1.0, full checkpointing" q2 q2e2 --set lora.base_dtype=nf4 \
  --set training.grad_accum=2 --set parallel.moe_capacity_factor=1.0 --set memory.activation_checkpointing=full
pair "LoRA on the attention only (experts frozen)" a2 a2e2 --set lora.targets=q,v

# an ep 2 checkpoint resumed at ep 1
run r2 2 --resume "$dir/d2e2/step-00000003" --set checkpoint.dir="$dir/r2"
check "the dp 2 ep 2 LoRA checkpoint resumed at ep 1 continues bitwise" d2 r2 bitwise 3
same_ck "the resumed run's checkpoint" d2 r2

# PEFT export of the ep 2 checkpoint
"$bin" ckpt export --peft "$dir/d2e2" "$dir/peft" >"$dir/peft.log" 2>&1 || fail "export --peft: $(tail -2 "$dir/peft.log")"
if out=$(/usr/bin/python3 - "$dir/d2e2/step-00000006/model.safetensors" "$dir/peft" <<'PY'
import json, os, struct, sys
def st(p):
    raw = open(p, "rb").read()
    n, = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
ck, pe = st(sys.argv[1]), st(os.path.join(sys.argv[2], "adapter_model.safetensors"))
assert set(pe) == {"base_model.model." + k for k in ck}, sorted(set(pe) ^ {"base_model.model." + k for k in ck})
assert all(pe["base_model.model." + k] == v for k, v in ck.items())
want = {"base_model.model.model.layers.%d.block_sparse_moe.experts.%d.%s.lora_%s.weight" % (l, e, w, ab)
        for l in range(2) for e in range(4) for w in ("w1", "w2", "w3") for ab in "AB"}
assert want <= set(pe), sorted(want - set(pe))[:3]
sh = pe["base_model.model.model.layers.1.block_sparse_moe.experts.3.w2.lora_B.weight"][0]
assert sh == [64, 4], sh  # w2: d_model x rank
c = json.load(open(os.path.join(sys.argv[2], "adapter_config.json")))
assert c["target_modules"] == ["q_proj", "v_proj", "w1", "w2", "w3"], c
print("%d tensors under PEFT names (%d of experts), bitwise; target_modules %s" % (len(pe), len(want), c["target_modules"]))
PY
); then pass "export --peft: $out"; else fail "export --peft: $out"; fi

refused "lora.dropout with expert targets" 2 "lora.dropout=0.1 with lora.targets naming w1" --set parallel.ep=2 \
  --set lora.dropout=0.1
refused "gate on a mixture of experts" 2 "lora.targets: 'gate' names a dense MLP projection" --set parallel.ep=2 \
  --set lora.targets=q,gate
refused "LoRA under ep with a pipeline" 4 "parallel.ep=2 with lora.rank and parallel.pp=2: not built" \
  --set parallel.ep=2 --set parallel.pp=2 --set model.n_layer=4
refused "LoRA on experts in bf16" 2 "lora.rank with model.n_experts > 0 and training.precision=bf16: not built" \
  --set parallel.ep=2 --set training.precision=bf16

echo "test_ep_lora: $fails failure(s)"
[ $fails -eq 0 ]
