#!/usr/bin/env bash
# Expert parallelism under a pipeline, and a mixture of experts under context parallelism
# (decision 89). mixtral-tiny (4 layers, 4 experts, top-2, dropless, both router losses on,
# clipping on), grad_accum 2:
#  - pp 2 x dp 2 with ep 2 (each stage's EP group the stage's 2 data-parallel ranks) against
#    pp 2 x dp 2 at ep 1, 1f1b (the default), zb-h1 (the experts' weight GEMMs stay in the
#    input-gradient pass, the router's deferred) and interleaved (v 2): losses, gradient
#    norms, ce/aux/z and every layer's expert load of every step, the last step's gradients (the
#    whole model) and the final weights file bitwise; the allocator's high-water is the plan,
#    and `dtrain plan --ep 2` marks the pp 2 x dp 2 ddp layout runnable with that memory;
#  - a pp 2 x dp 2 ep 2 checkpoint resumed at ep 1 continues bitwise (files hold the whole
#    model's names);
#  - cp 2 against cp 1 (each CP rank routes its own rows; the router totals summed over the CP
#    group before the losses): 6 losses within 1e-5 relative, the aux and z losses of every step
#    within 1e-5, and the last step's gradients within 1e-4 normwise, tensor by tensor (the
#    routers' take the load-balancing and z-loss gradients); cp 2 x pp 2 against cp 2 bitwise;
#    `dtrain plan --cp 2` marks the layout runnable with the allocator's memory;
#  - refused in one line naming the key: ep with cp, cp with a capacity factor, ep with the
#    pipeline's blocks mode.
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
mpi_env
mpi+=(-x DTRAIN_NODE_ID -x PPN -x DTRAIN_TEST_SAVE_GRADS)
export PPN=2 DTRAIN_TEST_SAVE_GRADS=

model=(--set model.preset=mixtral-tiny --set model.n_layer=4 --seq 32)
train=(--batch 2 --steps 6 --lr 3e-3 --warmup 2 --seed 11 --set optimizer.grad_clip=1.0 --set training.grad_accum=2
       --set training.moe_aux_loss_coef=0.05 --set training.moe_z_loss_coef=0.01
       --set logging.progress=lines --set logging.every=1)
. "$(dirname "$0")/tp_lib.sh" # run, compare, check, same_moe, grads_close
same_file() { # WHAT A B [grads]
  cmp -s "$dir/$2.st" "$dir/$3.st" && pass "$1: the final weights file is identical" || fail "$1: the final weights differ"
  if [ "${4:-}" = grads ]; then
    cmp -s "$dir/$2.grads" "$dir/$3.grads" && pass "$1: the last step's gradients (whole model) are identical" ||
      fail "$1: the last step's gradients differ"
  fi
}
pair() { # WHAT REF NAME ARGS...: a 4-rank pp 2 x dp 2 ep 2 run against the ep 1 reference, bitwise
  local what=$1 ref=$2 name=$3; shift 3
  DTRAIN_TEST_SAVE_GRADS="$dir/$name.grads" run "$name" 4 --save-weights "$dir/$name.st" "$@" || return
  check "$what == ep 1, bitwise" "$ref" "$name" bitwise 6
  same_moe "$what" "$ref" "$name"
  same_file "$what" "$ref" "$name" grads
}
ref() { DTRAIN_TEST_SAVE_GRADS="$dir/$1.grads" run "$1" 4 --save-weights "$dir/$1.st" "${@:2}"; }

pp=(--set parallel.pp=2)
ref ref "${pp[@]}"
ck=(--set checkpoint.every=3 --set checkpoint.keep_last=0 --set checkpoint.async=false)
pair "mixtral-tiny pp 2 x dp 2 ep 2 (1f1b)" ref e2 "${pp[@]}" --set parallel.ep=2 --set checkpoint.dir="$dir/cke2" "${ck[@]}"
# The planner runs the layout on dtrain's own plan: equal to the allocator's high-water.
src=$(cd "$(dirname "$0")/.." && pwd)
hw=$(sed -n 's/.*memory high-water: allocator=\([0-9]*\) .*/\1/p' "$dir/e2.log" | head -1)
pl=$("$bin" plan "${model[@]}" --micro-batch 2 --global-batch 8 --gpus 4 --nodes 2 --hardware cpu-core \
       --catalog "$src/configs/hardware.yaml" --ep 2 --json 2>/dev/null | /usr/bin/python3 -c "
import json, sys
l = [x for x in json.load(sys.stdin)['layouts'] if x['ep'] == 2 and x['pp'] == 2 and x['strategy'] == 'ddp'][0]
assert l['dtrain_runs'] and l['memory_source'] == 'dtrain', l
print(l['memory_bytes']['total'])")
[ -n "$hw" ] && [ "$pl" = "$hw" ] && pass "dtrain plan --ep 2 runs the pp 2 x dp 2 ddp layout, its memory $pl bytes = the allocator's high-water" ||
  fail "dtrain plan --ep 2 at pp 2: memory '$pl' against the allocator's '$hw'"
pair "mixtral-tiny pp 2 x dp 2 ep 2 zb-h1" ref zb "${pp[@]}" --set parallel.ep=2 --set parallel.pp_schedule=zb-h1
# interleaved: its own reference (with clipping on, the norm's chunked sums by chunk round
# differently from 1f1b's by stage: decision 74)
il=(--set parallel.pp_schedule=interleaved --set parallel.pp_virtual=2)
ref ril "${pp[@]}" "${il[@]}"
pair "mixtral-tiny pp 2 x dp 2 ep 2 interleaved v 2" ril il "${pp[@]}" --set parallel.ep=2 "${il[@]}"

# The checkpoint e2 wrote at step 3 (every stage's EP group writes the whole model's names),
# resumed at ep 1.
run r1 4 "${pp[@]}" --resume "$dir/cke2/step-00000003" --set checkpoint.dir="$dir/r1" "${ck[@]}" --save-weights "$dir/r1.st"
check "a pp 2 x dp 2 ep 2 checkpoint resumed at ep 1 continues bitwise" ref r1 bitwise 3
same_file "a pp 2 x dp 2 ep 2 checkpoint resumed at ep 1" ref r1

# Context parallelism: the router's totals of the whole sequences.
DTRAIN_TEST_SAVE_GRADS="$dir/c1.grads" run c1 1
DTRAIN_TEST_SAVE_GRADS="$dir/c2.grads" run c2 2 --set parallel.cp=2
check "mixtral-tiny cp 2 == cp 1 within 1e-5" c1 c2 1e-5 6
/usr/bin/python3 - "$dir/c1.jsonl" "$dir/c2.jsonl" <<'PY' && pass "cp 2's aux and z losses are cp 1's within 1e-5 every step" || fail "cp 2's router losses"
import json, math, sys
r = [{j["step"]: (j["moe_aux_loss"], j["moe_z_loss"]) for j in map(json.loads, open(p)) if "moe_aux_loss" in j} for p in sys.argv[1:]]
assert len(r[0]) == 6 and r[0].keys() == r[1].keys(), r
for s in r[0]:
    for a, b in zip(r[0][s], r[1][s]):
        assert math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 1e-5 * abs(a), (s, r[0][s], r[1][s])
print(r[1])
PY
grads_close "mixtral-tiny last-step gradients of cp 2 within 1e-4 of cp 1, every tensor (the routers' too)" "$dir/c1.grads" "$dir/c2.grads"
hw=$(sed -n 's/.*memory high-water: allocator=\([0-9]*\) .*/\1/p' "$dir/c2.log" | head -1)
pl=$("$bin" plan "${model[@]}" --micro-batch 2 --global-batch 4 --gpus 2 --nodes 1 --hardware cpu-core \
       --catalog "$src/configs/hardware.yaml" --cp 2 --json 2>/dev/null | /usr/bin/python3 -c "
import json, sys
l = [x for x in json.load(sys.stdin)['layouts'] if x['cp'] == 2 and x['strategy'] == 'ddp'][0]
assert l['dtrain_runs'] and l['memory_source'] == 'dtrain', l
print(l['memory_bytes']['total'])")
[ -n "$hw" ] && [ "$pl" = "$hw" ] && pass "dtrain plan --cp 2 runs mixtral-tiny's ddp layout, its memory $pl bytes = the allocator's high-water" ||
  fail "dtrain plan --cp 2 (experts): memory '$pl' against the allocator's '$hw'"
run c2p2 4 --set parallel.cp=2 "${pp[@]}"
check "mixtral-tiny cp 2 x pp 2 == cp 2, bitwise" c2 c2p2 bitwise 6
same_moe "mixtral-tiny cp 2 x pp 2" c2 c2p2

refused "ep with cp" 2 "parallel.ep=2 with parallel.cp" --set parallel.ep=2 --set parallel.cp=2
refused "cp with a capacity factor" 2 "parallel.cp=2 with parallel.moe_capacity_factor=1" --set parallel.cp=2 \
  --set parallel.moe_capacity_factor=1.0
refused "ep with the pipeline's blocks mode" 2 "parallel.ep=2 with parallel.pp_blocks" --set parallel.ep=2 \
  --set parallel.pp=2 --set parallel.pp_blocks=true

echo "test_ep_pp: $fails failure(s)"
[ $fails -eq 0 ]
