#!/usr/bin/env bash
# ZeRO with expert parallelism (decision 88): dense units sharded over the data-parallel group as
# at ep 1, each local expert's unit (its gradient shard, optimizer state and, ZeRO-3, its
# parameters) over its expert-data-parallel group - the dp / ep ranks holding the same experts -
# the experts' gradients summed down that group in data-parallel rank order (decision 85) and
# ZeRO-3 gathering an expert only within it. Against ep 1 at the same dp and strategy,
# mixtral-tiny (4 experts, top-2, the router's aux and z losses on, clipping on):
#  - zero1 dp 2 ep 2, zero2 dp 4 ep 2 with grad_accum 2 (zero_reduce's auto is step under ep;
#    the ep 1 reference sets it), zero3 dp 4 ep 2 (EDP groups of 2): losses, gradient norms,
#    ce/aux/z and the expert load of every step and the final weights file bitwise;
#  - each rank's optimizer state at dp 4 ep 2 is ZeRO's dp-th of the whole model's (the experts'
#    a (dp / ep)-th of the rank's own), under the plan, which equals the allocator's high-water
#    on every run; `dtrain plan --ep 2` runs the zero3 layout, sized by that plan;
#  - a zero3 dp 4 ep 2 checkpoint (sharded optimizer state) resumed at ep 1, and an ep 1 one at
#    ep 2, continue bitwise;
#  - refusals in one line naming the key: hybrid sharding, zero_reduce micro with grad_accum.
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
mpi_env
mpi+=(-x DTRAIN_NODE_ID -x PPN)
export PPN=2

model=(--set model.preset=mixtral-tiny --seq 32)
train=(--batch 2 --steps 4 --lr 3e-3 --warmup 1 --seed 11 --set optimizer.grad_clip=1.0
       --set training.moe_aux_loss_coef=0.02 --set training.moe_z_loss_coef=0.001
       --set logging.progress=lines --set logging.every=1)
. "$(dirname "$0")/tp_lib.sh" # run, check, refused, same_moe
pair() { # WHAT REF NAME NRANKS ARGS...: run NAME at parallel.ep=2 and compare it with REF bitwise
  local what=$1 ref=$2 name=$3 n=$4; shift 4
  run "$name" "$n" --set parallel.ep=2 --save-weights "$dir/$name.st" "$@" || return
  check "$what == ep 1, bitwise" "$ref" "$name" bitwise 4
  same_moe "$what" "$ref" "$name"
  cmp -s "$dir/$ref.st" "$dir/$name.st" && pass "$what: the final weights file is identical" ||
    fail "$what: the final weights differ"
}
run z1 2 --set parallel.strategy=zero1 --save-weights "$dir/z1.st"
pair "zero1 dp 2 ep 2" z1 z1e2 2 --set parallel.strategy=zero1
acc=(--set parallel.strategy=zero2 --set training.grad_accum=2)
run z2 4 "${acc[@]}" --set parallel.zero_reduce=step --save-weights "$dir/z2.st"
pair "zero2 dp 4 ep 2, grad_accum 2" z2 z2e2 4 "${acc[@]}"
ck=(--set checkpoint.every=2 --set checkpoint.keep_last=0 --set checkpoint.async=false)
run z3 4 --set parallel.strategy=zero3 --set checkpoint.dir="$dir/ck1" "${ck[@]}" --save-weights "$dir/z3.st"
pair "zero3 dp 4 ep 2" z3 z3e2 4 --set parallel.strategy=zero3 --set checkpoint.dir="$dir/ck" "${ck[@]}"
mem() { sed -n "s/.*memory high-water:.* $2=\([0-9]*\).*/\1/p" "$dir/$1.log" | head -1; } # NAME KIND

# the sharded optimizer state written at ep 2 read at ep 1, and written at ep 1 read at ep 2
run r3 4 --set parallel.strategy=zero3 --resume "$dir/ck/step-00000002" --set checkpoint.dir="$dir/r3" \
  "${ck[@]}" --save-weights "$dir/r3.st"
check "a zero3 dp 4 ep 2 checkpoint resumed at ep 1 continues bitwise" z3 r3 bitwise 2
cmp -s "$dir/z3.st" "$dir/r3.st" && pass "resumed at ep 1: the final weights are the uninterrupted run's" ||
  fail "resumed at ep 1: the final weights differ"
run r3e2 4 --set parallel.strategy=zero3 --set parallel.ep=2 --resume "$dir/ck1/step-00000002" \
  --set checkpoint.dir="$dir/r3e2" "${ck[@]}" --save-weights "$dir/r3e2.st"
check "a zero3 dp 4 ep 1 checkpoint resumed at ep 2 continues bitwise" z3 r3e2 bitwise 2
cmp -s "$dir/z3.st" "$dir/r3e2.st" && pass "resumed at ep 2: the final weights are the uninterrupted run's" ||
  fail "resumed at ep 2: the final weights differ"

# The planner runs the zero3 ep layout on the trainer's plan: equal to the allocator's high-water
# of the run (rank 0's, the fullest: the first shards are the larger). Optimizer state per rank:
# ZeRO at ep 2 holds what ZeRO at ep 1 does (the whole model's dp-th), DDP at ep 2 its whole
# store - the dense part and its own experts (the planner's ddp layout: test_ep.sh holds it to
# the allocator).
src=$(cd "$(dirname "$0")/.." && pwd)
hw=$(mem z3e2 allocator) o1=$(mem z3 optimizer) o2=$(mem z3e2 optimizer)
read -r pl od < <("$bin" plan "${model[@]}" --micro-batch 2 --global-batch 8 --gpus 4 --nodes 2 --hardware cpu-core \
       --catalog "$src/configs/hardware.yaml" --ep 2 --json 2>/dev/null | /usr/bin/python3 -c "
import json, sys
ls = [x for x in json.load(sys.stdin)['layouts'] if x['ep'] == 2 and x['dp'] == 4 and not x['hybrid']]
z, d = [[x for x in ls if x['strategy'] == s][0] for s in ('zero3', 'ddp')]
assert z['dtrain_runs'] and z['memory_source'] == 'dtrain' and d['memory_source'] == 'dtrain', (z, d)
print(z['memory_bytes']['total'], d['memory_bytes']['optimizer'])")
[ -n "$hw" ] && [ "$pl" = "$hw" ] && pass "dtrain plan --ep 2 runs the zero3 layout, its memory $pl bytes = the allocator's high-water" ||
  fail "dtrain plan --ep 2, zero3: memory '$pl' against the allocator's '$hw'"
[ -n "$o1" ] && [ "$o1" = "$o2" ] && [ -n "$od" ] && [ $((o2 * 2)) -lt "$od" ] &&
  pass "optimizer state per rank at dp 4 ep 2: zero3 $o2 bytes (ep 1: $o1), ddp $od" ||
  fail "optimizer state per rank: zero3 ep 2 '$o2', ep 1 '$o1', ddp ep 2 '$od'"

refused "ep with hybrid sharding" 4 "parallel.ep=2 with parallel.hybrid" --set parallel.ep=2 \
  --set parallel.strategy=hybrid_shard
refused "ep, zero2, micro-step reductions and grad_accum" 2 "parallel.zero_reduce=micro with parallel.ep=2" \
  --set parallel.ep=2 --set parallel.strategy=zero2 --set parallel.zero_reduce=micro --set training.grad_accum=2
refused "ep, zero1 and bf16 gradients (not composed)" 2 "parallel.ep=2 with parallel.strategy=zero1 and parallel.grad_dtype: not built" \
  --set parallel.ep=2 --set parallel.strategy=zero1 --set parallel.grad_dtype=bf16

echo "test_ep_zero: $fails failure(s)"
[ $fails -eq 0 ]
