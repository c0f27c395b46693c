#!/usr/bin/env bash
# A mixture of experts under pipeline parallelism (parallel.pp with model.n_experts; decision 82).
# The router's losses pool every layer's routing (moe.h): each stage starts from the previous
# stage's totals (choice counts, probability sums, squared logsumexps) and hands its own on with
# its output; the last stage's, over every layer, travel back with the gradients, and each
# stage's backward takes the load-balancing loss's gradient from them. The reference is one
# rank running the same micro-batches (training.grad_accum), with both router losses and a
# capacity factor that drops choices:
#  - mixtral-tiny (4 layers) pp 2 1f1b, pp 4 gpipe, pp 2 interleaved (v 2): the losses,
#    gradient norms, cross-entropy, aux, z and dropped counts, every layer's expert load
#    (decision 86) of every step and the final weights file bitwise pp 1's (clipping off);
#  - full activation checkpointing (the routing recomputed in the backward) pp 2 == pp 1;
#  - dp 2 x pp 2 with ZeRO-1 == dp 2; the router losses at their coefficients 0 leave the
#    totals unused, and a run with them on must differ from it (the totals reach the loss);
#  - validation through the pipeline equals pp 1's; a pp 2 checkpoint resumed at pp 1
#    continues bitwise; the allocator's high-water equals the plan on every run;
#  - zb-h1 (the experts' weight GEMMs deferred, their douts and gathered inputs kept in blocks
#    of the plan) pp 2 == pp 1, also with full checkpointing every 2, and with QLoRA on the
#    attention and the experts (their adapters' gradients deferred on the kept blocks);
#  - the layer-wise load-balancing loss (training.moe_aux_loss_type=layer) pp 2 == pp 1.
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
mpi_env
mpi+=(-x DTRAIN_NODE_ID -x PPN)
export PPN=2

model=(--set model.preset=mixtral-tiny --set model.n_layer=4 --seq 32)
train=(--batch 2 --steps 6 --lr 3e-3 --warmup 2 --seed 11 --set training.grad_accum=4 --set optimizer.grad_clip=0
       --set training.moe_aux_loss_coef=0.02 --set training.moe_z_loss_coef=0.001
       --set parallel.moe_capacity_factor=1.0 --set logging.progress=lines --set logging.every=1)
. "$(dirname "$0")/tp_lib.sh" # run, compare, check
same_file() { # WHAT A B
  cmp -s "$dir/$2.st" "$dir/$3.st" && pass "$1: the final weights file is identical" || fail "$1: the final weights differ"
}
run ref 1 --save-weights "$dir/ref.st"
/usr/bin/python3 -c "
import json, sys
d = [j['moe_dropped'] for j in map(json.loads, open(sys.argv[1])) if 'moe_dropped' in j]
sys.exit(0 if d and min(d) > 0 else 1)" "$dir/ref.jsonl" && pass "the capacity factor drops choices in every step" ||
  fail "no dropped choices: the capacity case is not exercised"
for c in "2 1f1b" "4 gpipe"; do
  set -- $c
  run "pp$1_$2" "$1" --set parallel.pp=$1 --set parallel.pp_schedule=$2 --save-weights "$dir/pp$1_$2.st"
  check "mixtral-tiny pp $1 $2 == pp 1, bitwise" ref "pp$1_$2" bitwise 6
  same_moe "mixtral-tiny pp $1 $2" ref "pp$1_$2"
  same_file "mixtral-tiny pp $1 $2" ref "pp$1_$2"
done
run il 2 --set parallel.pp=2 --set parallel.pp_schedule=interleaved --set parallel.pp_virtual=2 --save-weights "$dir/il.st"
check "mixtral-tiny interleaved pp 2 x v 2 == pp 1, bitwise" ref il bitwise 6
same_moe "mixtral-tiny interleaved pp 2 x v 2" ref il
same_file "mixtral-tiny interleaved pp 2 x v 2" ref il

# zb-h1 (decision 84): each expert's douts and gathered input formed into blocks of the plan
# and its W1/W2 weight GEMMs (and the router's) deferred to W; with full checkpointing every 2
# the recomputed layers form theirs in B.
run zb 2 --set parallel.pp=2 --set parallel.pp_schedule=zb-h1 --save-weights "$dir/zb.st"
check "mixtral-tiny zb-h1 pp 2 == pp 1, bitwise" ref zb bitwise 6
same_moe "mixtral-tiny zb-h1 pp 2" ref zb
same_file "mixtral-tiny zb-h1 pp 2" ref zb
# QLoRA on the experts (decision 90) under zb-h1: the experts' adapters' dA, dB deferred to W on
# the kept blocks
ql=(--set lora.rank=4 --set lora.targets=q,v,w1,w2,w3 --set lora.base_dtype=nf4)
run qref 1 "${ql[@]}"
run qzb 2 --set parallel.pp=2 --set parallel.pp_schedule=zb-h1 "${ql[@]}"
check "mixtral-tiny QLoRA on q, v, w1, w2, w3: zb-h1 pp 2 == pp 1, bitwise" qref qzb bitwise 6
same_moe "mixtral-tiny QLoRA zb-h1 pp 2" qref qzb
# the blocks' cost (decision 84): stage 0's activations (the allocator's, = the plan) against 1f1b's
acts() { sed -n 's/.*memory high-water: .* activations=\([0-9]*\).*/\1/p' "$dir/$1.log" | head -1; }
z=$(acts zb) o=$(acts pp2_1f1b)
[ "$z" = 2515328 ] && [ "$o" = 1859968 ] && pass "zb-h1 stage 0's activations $z bytes, 1f1b's $o (the experts' blocks)" ||
  fail "zb-h1 stage 0's activations '$z' bytes, 1f1b's '$o' (documented: 2515328, 1859968)"

# Full activation checkpointing: the backward routes each layer again (its totals left alone).
ckpt=(--set memory.activation_checkpointing=full)
run ck_ref 1 "${ckpt[@]}" --save-weights "$dir/ck_ref.st"
run ck_pp2 2 --set parallel.pp=2 "${ckpt[@]}" --save-weights "$dir/ck_pp2.st"
check "mixtral-tiny pp 2 with full activation checkpointing == pp 1, bitwise" ck_ref ck_pp2 bitwise 6
same_file "mixtral-tiny pp 2 with full activation checkpointing" ck_ref ck_pp2
cmp -s "$dir/ref.st" "$dir/ck_ref.st" && pass "full checkpointing gives the same weights as none" ||
  fail "full checkpointing changed the weights"
run zb_ck 2 --set parallel.pp=2 --set parallel.pp_schedule=zb-h1 "${ckpt[@]}" --set memory.activation_checkpointing_every=2 \
  --save-weights "$dir/zb_ck.st"
check "mixtral-tiny zb-h1 pp 2 with full checkpointing every 2 == pp 1, bitwise" ref zb_ck bitwise 6
same_file "mixtral-tiny zb-h1 pp 2 with checkpointing every 2" ref zb_ck

# dp 2 x pp 2 (ZeRO-1 over each stage's data-parallel pair) against dp 2.
run dp2 2 --set parallel.strategy=zero1 --save-weights "$dir/dp2.st"
run dp2pp2 4 --set parallel.strategy=zero1 --set parallel.pp=2 --save-weights "$dir/dp2pp2.st"
check "mixtral-tiny dp 2 x pp 2 (zero1) == dp 2, bitwise" dp2 dp2pp2 bitwise 6
same_moe "mixtral-tiny dp 2 x pp 2 (zero1)" dp2 dp2pp2
same_file "mixtral-tiny dp 2 x pp 2 (zero1)" dp2 dp2pp2

# The totals matter: without the load-balancing loss the stages' totals feed nothing, and the
# weights must differ from the run with it (so the bitwise runs above carried real totals).
run noaux 2 --set parallel.pp=2 --set training.moe_aux_loss_coef=0 --save-weights "$dir/noaux.st"
cmp -s "$dir/noaux.st" "$dir/pp2_1f1b.st" && fail "the load-balancing loss changed nothing under the pipeline" ||
  pass "the load-balancing loss's gradient (from every stage's totals) changes the weights"

# The layer-wise load-balancing loss (training.moe_aux_loss_type=layer, Megatron-Core's): each
# stage's layers add their own losses to the totals it hands on; pp 2 == pp 1 bitwise, and
# other weights than the pooled loss's (pp 1 against pp 1: the type reaches the gradients).
run lyr 1 --set training.moe_aux_loss_type=layer --save-weights "$dir/lyr.st"
run lyp 2 --set parallel.pp=2 --set training.moe_aux_loss_type=layer --save-weights "$dir/lyp.st"
check "mixtral-tiny pp 2 with the layer-wise load-balancing loss == pp 1, bitwise" lyr lyp bitwise 6
same_file "mixtral-tiny pp 2, layer-wise aux loss" lyr lyp
cmp -s "$dir/lyr.st" "$dir/ref.st" && fail "the layer-wise aux loss trained the same weights as the pooled one" ||
  pass "the layer-wise aux loss trains other weights than the pooled one"

# Validation through the pipeline and a pp 2 checkpoint resumed at pp 1.
pangram_corpus 300 20 0.1
ck=(--data "$dir/corpus_train_*.bin" --set data.val="$dir/corpus_val_*.bin" --set training.eval_interval=3
    --set training.eval_batches=2 --model.vocab_size 256 --set checkpoint.every=3 --set checkpoint.keep_last=0
    --set checkpoint.async=false)
run evR 1 --set checkpoint.dir="$dir/evR" "${ck[@]}"
run evP 2 --set parallel.pp=2 --set checkpoint.dir="$dir/evP" "${ck[@]}"
check "mixtral-tiny pp 2 on real data with validation == pp 1, bitwise" evR evP bitwise 6
e1=$(evals evR) e2=$(evals evP)
[ "$e1" = "$e2" ] && [ "$e1" != "[]" ] && pass "validation through the pipeline: pp 2's losses $e2 are pp 1's" ||
  fail "validation losses: pp 1 $e1, pp 2 $e2"
run evQ 1 --resume "$dir/evP/step-00000003" --set checkpoint.dir="$dir/evQ" "${ck[@]}"
check "mixtral-tiny pp 2 checkpoint resumed at pp 1 continues bitwise" evR evQ bitwise 3


echo "test_pp_moe: $fails failure(s)"
[ $fails -eq 0 ]
