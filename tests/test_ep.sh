#!/usr/bin/env bash
# Expert parallelism (parallel.ep; decision 85): the ranks of an EP group (ep consecutive
# data-parallel ranks) hold n_experts / ep experts each; every rank routes its own tokens, an
# all-to-all sends each expert's rows to its owner, which runs each source rank's GEMMs and keeps
# each source's weight gradient apart; the segments are summed in data-parallel rank order down
# the expert-data-parallel group. Against ep = 1 at the same dp, mixtral-tiny (4 experts, top-2,
# dropless, the router's aux and z losses on, clipping on), 10 steps:
#  - dp 2 ep 2, dp 4 ep 4 and dp 4 ep 2: losses, gradient norms, ce/aux/z and the expert load
#    (decision 86) every step, the last
#    step's reduced gradients (DTRAIN_TEST_SAVE_GRADS, the whole model) and the final weights
#    file bitwise; grad_accum 2 and a capacity factor that drops choices (decided on the source
#    rank) alike; full activation checkpointing (the routing and the all-to-alls again in the
#    backward) alike;
#  - the all-to-all moved rows: ep_rows_sent > 0 and its time ep_comm_ms > 0 in every step of an
#    ep run, both absent at ep 1;
#  - on real data, validation (whose forwards exchange rows too) gives ep 1's losses;
#  - a checkpoint written at dp 4 ep 2 resumed at ep 1 (and one written at ep 1 resumed at ep 2)
#    continues bitwise;
#  - the allocator's high-water equals the memory plan on every run (the EP buffers included);
#  - refusals in one line naming the key: ep not dividing n_experts or dp, a dense model, and
#    ep with cp and Top-K compressed gradients (16-bit gradients: test_ep_prec.sh;
#    ep with pp: tests/test_ep_pp.sh; LoRA with ep: tests/test_ep_lora.sh; ep with tp: tests/test_ep_tp.sh;
#    ZeRO with ep: tests/test_ep_zero.sh).
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
mpi_env
mpi+=(-x DTRAIN_NODE_ID -x PPN -x DTRAIN_TEST_SAVE_GRADS)
export PPN=2 DTRAIN_TEST_SAVE_GRADS=

model=(--set model.preset=mixtral-tiny --seq 32)
train=(--batch 2 --steps 10 --lr 3e-3 --warmup 2 --seed 11 --set optimizer.grad_clip=1.0
       --set training.moe_aux_loss_coef=0.02 --set training.moe_z_loss_coef=0.001
       --set logging.progress=lines --set logging.every=1)
. "$(dirname "$0")/tp_lib.sh" # run, compare, check
same_file() { # WHAT A B [grads]: the weights files (and with `grads` the last step's gradient files)
  cmp -s "$dir/$2.st" "$dir/$3.st" && pass "$1: the final weights file is identical" || fail "$1: the final weights differ"
  if [ "${4:-}" = grads ]; then
    cmp -s "$dir/$2.grads" "$dir/$3.grads" && pass "$1: the last step's gradients (whole model) are identical" ||
      fail "$1: the last step's gradients differ"
  fi
}
# rows_sent NAME WANT: every step of an ep run logs ep_rows_sent > 0 (want "moved"), or none at
# ep 1 ("none")
rows_sent() {
  /usr/bin/python3 -c "
import json, sys
s = [j for j in map(json.loads, open(sys.argv[1])) if j.get('type') == 'step']
r, t = [j.get('ep_rows_sent') for j in s], [j.get('ep_comm_ms') for j in s]
num = lambda x: isinstance(x, (int, float)) and x > 0
ok = r and (all(num(x) for x in r + t) if sys.argv[2] == 'moved' else all(x is None for x in r + t))
print(r[:4], t[:4]); sys.exit(0 if ok else 1)" "$dir/$1.jsonl" "$2"
}
pair() { # WHAT REF NAME NRANKS ARGS...: run NAME and compare it with REF bitwise
  local what=$1 ref=$2 name=$3 n=$4; shift 4
  DTRAIN_TEST_SAVE_GRADS="$dir/$name.grads" run "$name" "$n" --save-weights "$dir/$name.st" "$@" || return
  check "$what == ep 1, bitwise" "$ref" "$name" bitwise 10
  same_moe "$what" "$ref" "$name"
  same_file "$what" "$ref" "$name" grads
}
ref() { DTRAIN_TEST_SAVE_GRADS="$dir/$1.grads" run "$@" --save-weights "$dir/$1.st"; }

# dp 2: ep 2 (each rank 2 of the 4 experts)
ref d2 2
pair "mixtral-tiny dp 2 ep 2" d2 d2e2 2 --set parallel.ep=2
out=$(rows_sent d2e2 moved) && pass "the all-to-all moved rows at ep 2 (ep_rows_sent $out)" ||
  fail "ep_rows_sent at ep 2: $out"
out=$(rows_sent d2 none) && pass "ep 1 logs no ep_rows_sent" || fail "ep_rows_sent at ep 1: $out"
# dp 4: ep 4 (one expert each, fewer than top-k) and ep 2 inside dp 4 (EDP groups of 2)
ref d4 4
pair "mixtral-tiny dp 4 ep 4" d4 d4e4 4 --set parallel.ep=4
pair "mixtral-tiny dp 4 ep 2" d4 d4e2 4 --set parallel.ep=2
# gradient accumulation and a capacity factor (choices dropped on the source rank)
acc=(--set training.grad_accum=2 --set parallel.moe_capacity_factor=1.0)
ref a4 4 "${acc[@]}"
/usr/bin/python3 -c "
import json, sys
d = [j['moe_dropped'] for j in map(json.loads, open(sys.argv[1])) if 'moe_dropped' in j]
sys.exit(0 if d and min(d) > 0 else 1)" "$dir/a4.jsonl" && pass "the capacity factor drops choices in every step" ||
  fail "no dropped choices: the capacity case is not exercised"
pair "mixtral-tiny dp 4 ep 2, grad_accum 2, capacity 1.0" a4 a4e2 4 --set parallel.ep=2 "${acc[@]}"
# full activation checkpointing: each layer routed and exchanged again in the backward
ckf=(--set memory.activation_checkpointing=full)
ref f2 2 "${ckf[@]}"
pair "mixtral-tiny dp 2 ep 2, full activation checkpointing" f2 f2e2 2 --set parallel.ep=2 "${ckf[@]}"
cmp -s "$dir/f2.st" "$dir/d2.st" && pass "full checkpointing gives the same weights as none" ||
  fail "full checkpointing changed the weights"

# Checkpoints are the whole model's: dp 4 ep 2 -> ep 1, and ep 1 -> dp 2 ep 2, at step 5.
ck=(--set checkpoint.every=5 --set checkpoint.keep_last=0 --set checkpoint.async=false)
run ck4e2 4 --set parallel.ep=2 --set checkpoint.dir="$dir/ck4e2" "${ck[@]}"
run r4 4 --resume "$dir/ck4e2/step-00000005" --set checkpoint.dir="$dir/r4" "${ck[@]}" --save-weights "$dir/r4.st"
check "a dp 4 ep 2 checkpoint resumed at ep 1 continues bitwise" d4 r4 bitwise 5
same_file "a dp 4 ep 2 checkpoint resumed at ep 1" d4 r4
run ck2 2 --set checkpoint.dir="$dir/ck2" "${ck[@]}"
run r2e2 2 --set parallel.ep=2 --resume "$dir/ck2/step-00000005" --set checkpoint.dir="$dir/r2e2" "${ck[@]}" \
  --save-weights "$dir/r2e2.st"
check "an ep 1 checkpoint resumed at dp 2 ep 2 continues bitwise" d2 r2e2 bitwise 5
same_file "an ep 1 checkpoint resumed at dp 2 ep 2" d2 r2e2

# Validation on real data: every rank's evaluation forwards exchange rows as training does.
printf '%s\n' "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs." \
  | awk '{for (i = 0; i < 300; i++) { print $0 " " i; if (i % 20 == 19) print "%" }}' >"$dir/text.txt"
"$bin" prepare --tokenizer byte --doc-sep % --val-fraction 0.1 --out "$dir/corpus" "$dir/text.txt" >/dev/null 2>&1 ||
  fail "prepare the corpus"
val=(--data "$dir/corpus_train_*.bin" --set data.val="$dir/corpus_val_*.bin" --set training.eval_interval=5
     --set training.eval_batches=2 --model.vocab_size 256)
run v1 2 "${val[@]}"
run v2 2 --set parallel.ep=2 "${val[@]}"
check "mixtral-tiny dp 2 ep 2 on real data with validation == ep 1, bitwise" v1 v2 bitwise 10
e1=$(evals v1) e2=$(evals v2)
[ "$e1" = "$e2" ] && [ "$e1" != "[]" ] && pass "validation at ep 2: the losses $e2 are ep 1's" ||
  fail "validation losses: ep 1 $e1, ep 2 $e2"

# The planner runs ep layouts (ddp) on dtrain's own memory plan: equal to the allocator's
# high-water of the same layout's run.
src=$(cd "$(dirname "$0")/.." && pwd)
run pl2 2 --set parallel.ep=2 --steps 1 --warmup 0 --set training.micro_batch=1
hw=$(sed -n 's/.*memory high-water: allocator=\([0-9]*\) .*/\1/p' "$dir/pl2.log" | head -1)
pl=$("$bin" plan "${model[@]}" --micro-batch 1 --global-batch 2 --gpus 2 --nodes 1 --hardware cpu-core \
       --catalog "$src/configs/hardware.yaml" --ep 2 --json 2>/dev/null | /usr/bin/python3 -c "
import json, sys
l = [x for x in json.load(sys.stdin)['layouts'] if x['ep'] == 2 and x['strategy'] == 'ddp' and x['dp'] == 2][0]
assert l['dtrain_runs'] and l['memory_source'] == 'dtrain', l
print(l['memory_bytes']['total'])")
[ -n "$hw" ] && [ "$pl" = "$hw" ] && pass "dtrain plan --ep 2 runs the ddp layout, its memory $pl bytes = the allocator's high-water" ||
  fail "dtrain plan --ep 2: memory '$pl' against the allocator's '$hw'"

refused "ep not dividing n_experts" 3 "parallel.ep=3 must divide model.n_experts=4" --set parallel.ep=3
refused "ep not dividing dp" 2 "parallel.ep=4 does not divide the data-parallel size 2" --set parallel.ep=4
refused "ep on a dense model" 2 "parallel.ep=2 needs a mixture of experts" --set model.preset=llama-tiny --set parallel.ep=2
for c in "parallel.cp parallel.cp=2" "parallel.compression parallel.compression=topk"; do
  set -- $c
  refused "ep with $1" 4 "parallel.ep=2 with $1" --set parallel.ep=2 --set "$2"
done

echo "test_ep: $fails failure(s)"
[ $fails -eq 0 ]
