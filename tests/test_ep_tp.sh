#!/usr/bin/env bash
# Tensor parallelism of a mixture of experts (parallel.tp with model.n_experts; decision 91): the
# router replicated on every TP rank (the same tokens, the same routing), each expert's w1/w3 cut
# by columns of expert_d_ff and w2 by rows, its partial outputs summed over the TP group as the
# dense MLP's. mixtral-tiny (4 experts, top-2, the router's aux and z losses on, clipping on):
#  - tp 2 on 2 ranks against the blocks mode (parallel.tp_blocks: one process, both shards, the
#    same sums in the same order), 6 steps: losses, gradient norms, ce/aux/z, dropped choices and
#    the expert load of every step, the last step's gradients and the final weights (both
#    gathered as the whole model) bitwise; the same for tp 2 x dp 2 on 4 ranks against the
#    blocks mode on 2 data-parallel ranks, with grad_accum 2, a capacity factor that drops
#    choices and full activation checkpointing (the expert load counted once per TP group);
#  - the blocks mode against plain tp 1: losses within 1e-5 relative (the same model, the
#    experts' down projection summed in two halves);
#  - expert parallelism with it: tp 2 x dp 2 with ep 2 on 4 ranks (EP groups of the data-parallel
#    ranks at one TP rank, each rank its TP shard of its 2 experts) against ep 1 on the same
#    ranks, and the blocks mode x dp 2 with ep 2 against the blocks mode x dp 2, the same cases
#    (grad_accum 2, capacity, full checkpointing): everything above bitwise;
#  - a tp 2 x ep 2 checkpoint holds the whole model's names: resumed in the blocks mode at ep 1
#    it continues bitwise, resumed at plain tp 1 within 1e-5;
#  - the allocator's high-water equals the memory plan on every run, and `dtrain plan --tp 2 --ep
#    2` runs the ddp layout on that plan;
#  - refusals in one line: tp not dividing expert_d_ff, sequence parallelism with experts, a
#    pipeline of a tensor-parallel mixture of experts.
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
mpi_env
mpi+=(-x DTRAIN_NODE_ID -x PPN -x DTRAIN_TEST_SAVE_GRADS)
export PPN=2 DTRAIN_TEST_SAVE_GRADS=

model=(--set model.preset=mixtral-tiny --seq 32)
train=(--batch 2 --steps 6 --lr 3e-3 --warmup 2 --seed 11 --set optimizer.grad_clip=1.0
       --set training.moe_aux_loss_coef=0.02 --set training.moe_z_loss_coef=0.001
       --set logging.progress=lines --set logging.every=1)
. "$(dirname "$0")/tp_lib.sh" # run, compare, check, refused, same_moe
tp2=(--set parallel.tp=2)
blocks=(--set parallel.tp=2 --set parallel.tp_blocks=true)
# saved NAME NRANKS ARGS...: a run writing its last gradients and final weights (whole model)
saved() {
  local name=$1 n=$2; shift 2
  DTRAIN_TEST_SAVE_GRADS="$dir/$name.grads" run "$name" "$n" --save-weights "$dir/$name.st" "$@"
}
same_files() { # WHAT A B
  cmp -s "$dir/$2.grads" "$dir/$3.grads" && pass "$1: the last step's gradients (whole model) are identical" ||
    fail "$1: the last step's gradients differ"
  cmp -s "$dir/$2.st" "$dir/$3.st" && pass "$1: the final weights file is identical" || fail "$1: the final weights differ"
}

saved blocks 1 "${blocks[@]}"
saved tp2 2 "${tp2[@]}"
check "mixtral-tiny tp 2 on 2 ranks == blocks mode, bitwise" blocks tp2 bitwise 6
same_moe "mixtral-tiny tp 2" blocks tp2
same_files "mixtral-tiny tp 2" blocks tp2
run plain 1
check "mixtral-tiny blocks mode vs tp 1" plain blocks 1e-5 6

# tp 2 x dp 2: grad_accum 2, a capacity factor that drops choices, full activation checkpointing
acc=(--set training.grad_accum=2 --set parallel.moe_capacity_factor=1.0 --set memory.activation_checkpointing=full)
saved blocks_dp2 2 "${blocks[@]}" "${acc[@]}"
saved tp2dp2 4 "${tp2[@]}" "${acc[@]}"
check "tp 2 x dp 2 (grad_accum 2, capacity 1.0, full checkpointing) == blocks x dp 2, bitwise" blocks_dp2 tp2dp2 bitwise 6
same_moe "tp 2 x dp 2" blocks_dp2 tp2dp2
same_files "tp 2 x dp 2" blocks_dp2 tp2dp2
/usr/bin/python3 -c "
import json, sys
d = [j['moe_dropped'] for j in map(json.loads, open(sys.argv[1])) if 'moe_dropped' in j]
sys.exit(0 if d and min(d) > 0 else 1)" "$dir/tp2dp2.jsonl" && pass "the capacity factor drops choices in every step" ||
  fail "no dropped choices: the capacity case is not exercised"

# Expert parallelism with tensor parallelism: the same cases at ep 2 against ep 1.
ep2=(--set parallel.ep=2)
saved tp2dp2e2 4 "${tp2[@]}" "${ep2[@]}" "${acc[@]}"
check "tp 2 x dp 2 ep 2 == ep 1, bitwise" tp2dp2 tp2dp2e2 bitwise 6
same_moe "tp 2 x dp 2 ep 2" tp2dp2 tp2dp2e2
same_files "tp 2 x dp 2 ep 2" tp2dp2 tp2dp2e2
saved blocks_dp2e2 2 "${blocks[@]}" "${ep2[@]}" "${acc[@]}"
check "blocks mode x dp 2 ep 2 == ep 1, bitwise" blocks_dp2 blocks_dp2e2 bitwise 6
same_files "blocks mode x dp 2 ep 2" blocks_dp2 blocks_dp2e2

# A tp 2 x ep 2 checkpoint (the whole model's names) resumed in the blocks mode at ep 1, and at
# plain tp 1.
ck=(--set checkpoint.every=3 --set checkpoint.keep_last=0 --set checkpoint.async=false)
run ck 4 "${tp2[@]}" "${ep2[@]}" "${acc[@]}" --set checkpoint.dir="$dir/ck" "${ck[@]}"
run rblocks 2 "${blocks[@]}" "${acc[@]}" --resume "$dir/ck/step-00000003" --set checkpoint.dir="$dir/rb" "${ck[@]}"
check "a tp 2 x ep 2 checkpoint resumed in the blocks mode at ep 1 continues bitwise" tp2dp2 rblocks bitwise 3
run rplain 2 "${acc[@]}" --resume "$dir/ck/step-00000003" --set checkpoint.dir="$dir/rp" "${ck[@]}"
check "a tp 2 x ep 2 checkpoint resumed at tp 1, ep 1" tp2dp2 rplain 1e-5 3

# The planner runs the tp 2 x dp 2 ep 2 layout (ddp) on dtrain's own memory plan: the
# allocator's high-water.
src=$(cd "$(dirname "$0")/.." && pwd)
run pl 4 "${tp2[@]}" "${ep2[@]}" --steps 1 --warmup 0 --set training.micro_batch=1
hw=$(sed -n 's/.*memory high-water: allocator=\([0-9]*\) .*/\1/p' "$dir/pl.log" | head -1)
pl=$("$bin" plan "${model[@]}" --micro-batch 1 --global-batch 2 --gpus 4 --nodes 2 --hardware cpu-core \
       --catalog "$src/configs/hardware.yaml" --tp 2 --ep 2 --json 2>/dev/null | /usr/bin/python3 -c "
import json, sys
l = [x for x in json.load(sys.stdin)['layouts'] if x['tp'] == 2 and x['ep'] == 2 and x['strategy'] == 'ddp'
     and x['dp'] == 2][0]
assert l['dtrain_runs'] and l['memory_source'] == 'dtrain', l
print(l['memory_bytes']['total'])")
[ -n "$hw" ] && [ "$pl" = "$hw" ] && pass "dtrain plan --tp 2 --ep 2 runs the ddp layout, its memory $pl bytes = the allocator's high-water" ||
  fail "dtrain plan --tp 2 --ep 2: memory '$pl' against the allocator's '$hw'"

refused "tp not dividing expert_d_ff" 2 "parallel.tp=2 does not divide model.expert_d_ff=129" "${tp2[@]}" \
  --set model.expert_d_ff=129
refused "sequence parallelism with experts" 2 "parallel.sequence_parallel with model.n_experts=4" "${tp2[@]}" \
  --set parallel.sequence_parallel=true
refused "a pipeline of a tensor-parallel mixture of experts" 4 "parallel.pp with parallel.tp=2 and model.n_experts=4" \
  "${tp2[@]}" --set parallel.pp=2

echo "test_ep_tp: $fails failure(s)"
[ $fails -eq 0 ]
