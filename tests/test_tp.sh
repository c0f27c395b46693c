#!/usr/bin/env bash
# Tensor parallelism end to end (parallel.tp; ARCHITECTURE decision 62), under mpiexec:
#  - gpt2, llama (GQA, untied head) and vit at tp = 2 on 2 ranks give bitwise the losses and gradient norms of 20 AdamW steps of
#    one process in the blocks test mode (parallel.tp_blocks: both shards, the same sums in the
#    same order), fp32; tp 2 x dp 2 on 4 ranks (2 simulated nodes, a TP group inside each) in
#    bf16 with full activation checkpointing, against the blocks mode on 2 data-parallel ranks;
#  - fp16 with dynamic loss scaling under tp 2 + sequence parallelism: the same overflow steps skipped on
#    every rank, bitwise the blocks mode;
#  - sequence parallelism (gpt2, llama, vit): tp 2 ranks == blocks mode bitwise (fp32, and bf16 with
#    full checkpointing), also under ZeRO-1 on tp 2 x dp 2, and within 1e-5 of tensor parallelism alone;
#  - ZeRO-1/2/3 over the data-parallel ranks (tp 2 x dp 2) == the blocks mode with DDP, bitwise
#    while clipping does not bind (the norm is summed by ZeRO piece: see the case);
#  - the blocks mode against the plain tp = 1 model: the 20 losses within 1e-5 relative (the
#    same model, its sums in another order), and tp 2's weights after 20 steps within 1e-4 per
#    tensor of tp 1's (AdamW eps 1e-5);
#  - parameters + gradients + optimizer per rank at tp = 2 at most 0.55 of tp = 1, and the
#    allocator's high-water equal to the memory plan on every run, and to `dtrain plan --tp 2`'s;
#  - hybrid sharding over the data-parallel ranks (tp 2 x dp 2 and tp 2 x dp 4 on 2 simulated
#    nodes, ZeRO-1/2/3, bf16 gradients) == the blocks mode with DDP, bitwise; uneven nodes refused;
#  - Top-K over the data-parallel ranks: ratio 1 == uncompressed DDP bitwise (ddp, zero1, hybrid
#    zero1), ratio 0.1 within 2e-3 of the blocks mode's Top-K (another selection) and compressed;
#  - checkpoints in the canonical index space: resumed bitwise in another layout, and a round
#    trip tp 2 -> 1 -> 4 -> 2 x dp 2 (ZeRO-3) exact for weights, moments and data position;
#    hybrid under tp and Top-K under tp resumed bitwise (Top-K at another tp: residual empty);
#  - LoRA and QLoRA (decision 69): llama with every projection adapted and dropout, tp 2 on 2
#    ranks == the blocks mode bitwise over 10 steps and within 1e-5 of plain tp = 1 LoRA; gpt2
#    bf16 tp 2 x dp 2 == blocks x dp 2 bitwise, and with ZeRO-3 (llama); QLoRA (NF4 shards) tp 2
#    == blocks bitwise; the checkpoint's and export --peft's adapters canonical (within 1e-4 of
#    tp 1's), a resume in the blocks mode bitwise, a resume at another tp and NF4 shards that
#    are not whole blocks refused;
#  - parallel.layout: auto picks dtrain plan's fastest runnable layout, logs the top 3, keeps an
#    explicit parallel.tp;
#  - what does not divide or is not built yet is refused in one line naming the keys.
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
mpi_env
mpi+=(-x DTRAIN_NODE_ID -x PPN)
export PPN=2

gpt=(--set model.preset= --model.n_layer 2 --model.d_model 48 --model.n_head 4 --model.vocab_size 2000
     --model.context 32 --seq 32)
train=(--batch 2 --steps 20 --lr 3e-3 --warmup 3 --seed 11
       --set logging.progress=lines --set logging.peak_gflops=100 --set logging.every=1)
model=("${gpt[@]}")
. "$(dirname "$0")/tp_lib.sh" # run, compare, check

run plain 1
run blocks 1 --set parallel.tp=2 --set parallel.tp_blocks=true
run tp2 2 --set parallel.tp=2
check "tp 2 on 2 ranks == blocks mode, bitwise (fp32)" tp2 blocks bitwise
check "blocks mode vs tp 1" blocks plain 1e-5
# Against plain tp = 1, the weights after 20 AdamW steps: within 1e-4 per tensor, normwise and
# elementwise (compare_runs.py). With AdamW eps 1e-5, as test_mpi.sh: at 1e-8 the k part of
# c_attn's bias, whose gradient is mathematically zero, turns rounding noise into lr-sized steps.
eps=(--set optimizer.eps=1e-5)
run wplain 1 "${eps[@]}" --save-weights "$dir/wplain.st"
run wtp2 2 --set parallel.tp=2 "${eps[@]}" --save-weights "$dir/wtp2.st"
if out=$(cmp_runs "$dir/wtp2.jsonl" "$dir/wtp2.st" "$dir/wplain.jsonl" "$dir/wplain.st" 1e-4 2>&1); then
  pass "tp 2 on 2 ranks vs tp 1, losses and weights (--save-weights gathers the TP group): $(echo "$out" | tail -1)"
else fail "tp 2 vs tp 1 weights: $(echo "$out" | tail -3)"; fi

# llama (grouped-query attention, untied head) and vit (bidirectional, replicated head)
model=(--set model.preset=llama-tiny --seq 32)
run llama_blocks 1 --set parallel.tp=2 --set parallel.tp_blocks=true
run llama_tp2 2 --set parallel.tp=2
check "llama: tp 2 on 2 ranks == blocks mode, bitwise" llama_tp2 llama_blocks bitwise
model=(--set model.preset=vit-tiny --seq 64)
run vit_blocks 1 --set parallel.tp=2 --set parallel.tp_blocks=true
run vit_tp2 2 --set parallel.tp=2
check "vit: tp 2 on 2 ranks == blocks mode, bitwise" vit_tp2 vit_blocks bitwise
model=("${gpt[@]}")

lowp=(--set training.precision=bf16 --set memory.activation_checkpointing=full)
run blocks_dp2 2 --set parallel.tp=2 --set parallel.tp_blocks=true "${lowp[@]}"
run tp2dp2 4 --set parallel.tp=2 "${lowp[@]}"
check "tp 2 x dp 2 on 2 simulated nodes == blocks x dp 2, bitwise (bf16, full checkpointing)" tp2dp2 blocks_dp2 bitwise
grep -q "process mesh: tp 2 x dp 2" "$dir/tp2dp2.log" && pass "the banner names the layout" ||
  fail "no layout line: $(grep -m1 'process mesh' "$dir/tp2dp2.log")"

# ZeRO over the data-parallel ranks (tp 2 x dp 2): the same losses as DDP. Under ZeRO the gradient
# norm's partial sums follow ZeRO's cut of the units, which differs between the blocks mode and tp
# ranks (decision 62): the norms agree to rounding, so clipping is set where it does not bind and
# the weights (hence every loss) stay bitwise.
noclip=(--set optimizer.grad_clip=100)
run ddp_blocks 2 --set parallel.tp=2 --set parallel.tp_blocks=true "${noclip[@]}"
for z in zero1 zero2 zero3; do
  run "${z}_tp2dp2" 4 --set parallel.tp=2 --set parallel.strategy=$z "${noclip[@]}"
  check "tp 2 x dp 2 with $z == blocks x dp 2 with ddp, bitwise" "${z}_tp2dp2" ddp_blocks bitwise
done

# Hybrid sharding over the data-parallel ranks (decision 70): each TP position's DP ranks form
# their own shard group (those on one node) and replica groups (the same place on each node).
# tp 2 x dp 2 on 2 simulated nodes (one DP rank of each TP position per node: shard groups of 1,
# replicas across the 2 nodes) and tp 2 x dp 4 on 2 nodes of 4 ranks (shard groups of 2,
# replica pairs), every ZeRO stage: the same losses and norms as the blocks mode with DDP,
# bitwise (hybrid reduces once over all DP ranks in rank order; its cross-node step only
# gathers sums), also with bf16 gradients.
run hyb_tp2dp2 4 --set parallel.tp=2 --set parallel.strategy=hybrid_shard "${noclip[@]}"
check "tp 2 x dp 2 hybrid_shard (2 nodes: shard groups of 1, 2 replicas) == blocks x dp 2 with ddp, bitwise" \
  hyb_tp2dp2 ddp_blocks bitwise
grep -q "shard=$(sed -n 's/.*memory bytes: psi=\([0-9]*\) .*/\1/p' "$dir/hyb_tp2dp2.log" | head -1) " "$dir/hyb_tp2dp2.log" &&
  pass "tp 2 x dp 2 hybrid on 2 nodes: each rank holds its TP shard's whole optimizer state (shard group of 1)" ||
  fail "tp 2 x dp 2 hybrid: $(grep -m1 'memory bytes' "$dir/hyb_tp2dp2.log")"
run ddp_blocks4 4 --set parallel.tp=2 --set parallel.tp_blocks=true "${noclip[@]}"
for z in zero1 zero2 zero3; do
  PPN=4 run "hyb_${z}_tp2dp4" 8 --set parallel.tp=2 --set parallel.strategy=$z --set parallel.hybrid=true "${noclip[@]}"
  check "tp 2 x dp 4 on 2 nodes of 4, hybrid $z (shard groups of 2, replica pairs) == blocks x dp 4 with ddp, bitwise" \
    "hyb_${z}_tp2dp4" ddp_blocks4 bitwise
done
psi=$(sed -n 's/.*memory bytes: psi=\([0-9]*\) shard=\([0-9]*\) .*/\1 \2/p' "$dir/hyb_zero3_tp2dp4.log" | head -1)
[ -n "$psi" ] && [ "${psi#* }" -lt "${psi% *}" ] && [ "${psi#* }" -ge $(( ${psi% *} / 2 )) ] &&
  pass "tp 2 x dp 4 hybrid zero3: optimizer shard ${psi#* } of the TP shard's ${psi% *} (halved over the node's 2 DP ranks)" ||
  fail "tp 2 x dp 4 hybrid zero3 shard: '$psi'"
g16=(--set parallel.grad_dtype=bf16)
run ddp_blocks4_g16 4 --set parallel.tp=2 --set parallel.tp_blocks=true "${noclip[@]}" "${g16[@]}"
PPN=4 run hyb_g16_tp2dp4 8 --set parallel.tp=2 --set parallel.strategy=zero2 --set parallel.hybrid=true "${noclip[@]}" "${g16[@]}"
check "tp 2 x dp 4 hybrid zero2 with bf16 gradients == blocks x dp 4 with ddp, bitwise" hyb_g16_tp2dp4 ddp_blocks4_g16 bitwise

# Top-K compression over the data-parallel ranks (decision 70): each TP rank compresses its own
# shard's gradient (its residual is its shard's). compression_ratio 1 sends every element: tp 2
# x dp 2 with DDP and ZeRO-1, and hybrid ZeRO-1 on tp 2 x dp 4 (2 nodes of 4), == the blocks mode
# with uncompressed DDP, bitwise. At ratio 0.1 the chosen elements are each TP shard's largest,
# while the blocks mode chooses among both shards of a bucket together: not the same selection,
# so the losses are held to 2e-3 relative of the blocks mode's Top-K 0.1 (measured ~5e-4), and
# must differ from uncompressed DDP's (compression is on).
tk=(--set parallel.compression=topk "${noclip[@]}")
run topk1_ddp 4 --set parallel.tp=2 "${tk[@]}" --set parallel.compression_ratio=1
check "tp 2 x dp 2 Top-K ratio 1, ddp == blocks x dp 2 uncompressed, bitwise" topk1_ddp ddp_blocks bitwise
run topk1_z1 4 --set parallel.tp=2 --set parallel.strategy=zero1 "${tk[@]}" --set parallel.compression_ratio=1
check "tp 2 x dp 2 Top-K ratio 1, zero1 == blocks x dp 2 uncompressed, bitwise" topk1_z1 ddp_blocks bitwise
PPN=4 run topk1_hyb 8 --set parallel.tp=2 --set parallel.strategy=zero1 --set parallel.hybrid=true "${tk[@]}" \
  --set parallel.compression_ratio=1
check "tp 2 x dp 4 hybrid zero1, Top-K ratio 1 == blocks x dp 4 uncompressed, bitwise" topk1_hyb ddp_blocks4 bitwise
run topk10_blocks 2 --set parallel.tp=2 --set parallel.tp_blocks=true "${tk[@]}" --set parallel.compression_ratio=0.1
run topk10 4 --set parallel.tp=2 "${tk[@]}" --set parallel.compression_ratio=0.1
check "tp 2 x dp 2 Top-K 0.1 vs the blocks mode's Top-K 0.1 (per-shard selection)" topk10_blocks topk10 2e-3
if out=$(compare topk10 ddp_blocks bitwise 2>&1); then fail "tp 2 x dp 2 Top-K 0.1 gives uncompressed DDP's bits: $out"
else pass "tp 2 x dp 2 Top-K 0.1 compresses (losses differ from uncompressed DDP's)"; fi


# Sequence parallelism (gpt2, llama, vit): tp 2 on 2 ranks == the blocks mode bitwise, tp 2 x dp 2
# with ZeRO-1 == blocks x dp 2 with DDP, and within rounding of tensor parallelism without it
# (the norms' weight gradients are summed per rank's rows, then over the group).
sp=(--set parallel.tp=2 --set parallel.sequence_parallel=true)
run sp_blocks 1 "${sp[@]}" --set parallel.tp_blocks=true
run sp_tp2 2 "${sp[@]}"
check "sequence parallel: tp 2 on 2 ranks == blocks mode, bitwise" sp_tp2 sp_blocks bitwise
check "sequence parallel vs tensor parallel alone" sp_tp2 tp2 1e-5
run sp_blocks_dp2 2 "${sp[@]}" --set parallel.tp_blocks=true "${noclip[@]}"
run sp_z1 4 "${sp[@]}" --set parallel.strategy=zero1 "${noclip[@]}"
check "sequence parallel: tp 2 x dp 2 with zero1 == blocks x dp 2, bitwise" sp_z1 sp_blocks_dp2 bitwise
model=(--set model.preset=llama-tiny --seq 32)
run sp_llama_blocks 1 "${sp[@]}" --set parallel.tp_blocks=true
run sp_llama_tp2 2 "${sp[@]}"
check "sequence parallel, llama: tp 2 on 2 ranks == blocks mode, bitwise" sp_llama_tp2 sp_llama_blocks bitwise
run llama_tp2_nosp 2 --set parallel.tp=2
check "sequence parallel vs tensor parallel alone, llama" sp_llama_tp2 llama_tp2_nosp 1e-5
model=(--set model.preset=vit-tiny --seq 64)
run sp_vit_blocks 1 "${sp[@]}" --set parallel.tp_blocks=true
run sp_vit_tp2 2 "${sp[@]}"
check "sequence parallel, vit: tp 2 on 2 ranks == blocks mode, bitwise" sp_vit_tp2 sp_vit_blocks bitwise
model=("${gpt[@]}")
# bf16 with full activation checkpointing: the 16-bit norm outputs gathered, the recomputed
# layers gathering and reduce-scattering again
run sp_lowp_blocks 1 "${sp[@]}" --set parallel.tp_blocks=true "${lowp[@]}"
run sp_lowp_tp2 2 "${sp[@]}" "${lowp[@]}"
check "sequence parallel in bf16 with full checkpointing: tp 2 on 2 ranks == blocks mode, bitwise" sp_lowp_tp2 sp_lowp_blocks bitwise
# fp16 with dynamic loss scaling, the scale doubled after every finite step until the 16-bit
# gradients overflow: the overflow found on any shard is every rank's (the gradient norm is the
# whole group's), so every rank skips the same steps and halves the same scale
f16=(--set training.precision=fp16 --set training.loss_scale_window=1)
run f16_tp2 2 "${sp[@]}" "${f16[@]}"
run f16_sp_blocks 1 "${sp[@]}" --set parallel.tp_blocks=true "${f16[@]}"
check "fp16, loss scaling: tp 2 with sequence parallelism == blocks mode, bitwise" f16_tp2 f16_sp_blocks bitwise
n_of=$(grep -c '"overflow":true' "$dir/f16_tp2.jsonl")
if [ "$n_of" -gt 0 ] && [ "$n_of" = "$(grep -c '"overflow":true' "$dir/f16_sp_blocks.jsonl")" ]; then
  pass "fp16 under tp 2: $n_of overflow step(s) skipped on every rank, as in the blocks mode"
else fail "fp16 overflows: tp2 $n_of, blocks $(grep -c '"overflow":true' "$dir/f16_sp_blocks.jsonl")"; fi

# Checkpoints across layouts (docs/FORMATS.md version 2: the canonical index space), on real
# data through the shuffling sampler, a global batch of 4 sequences at every layout:
#  - tp 2 resumed at step 10 in the blocks mode continues bitwise, to the same final model file;
#  - a round trip tp 2 -> 1 -> 4 -> 2 x dp 2 with ZeRO-3, each a resume that only reshards
#    (training.steps = the checkpoint's step, another checkpoint.dir), holds exactly the
#    weights, moments and data position of the original (tests/ref/ckpt_canon.py), and the
#    last layout trained on from there gives the uninterrupted run's losses, bitwise.
printf '%s\n' "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs." \
  | awk '{for (i = 0; i < 400; i++) print $0 " " i}' >"$dir/text.txt"
"$bin" prepare --tokenizer byte --val-fraction 0 --out "$dir/corpus" "$dir/text.txt" >/dev/null 2>&1 ||
  fail "prepare the corpus"
ck=(--data "$dir/corpus_train_*.bin" --model.vocab_size 256 --set training.batch=4 --set checkpoint.every=5
    --set checkpoint.keep_last=0 --set checkpoint.async=false "${noclip[@]}")
run ckU 2 --set parallel.tp=2 --set checkpoint.dir="$dir/ckU" "${ck[@]}"
run ckB 1 --set parallel.tp=2 --set parallel.tp_blocks=true --resume "$dir/ckU/step-00000010" \
  --set checkpoint.dir="$dir/ckB" "${ck[@]}"
check "tp 2 checkpoint resumed in the blocks mode: continues bitwise" ckU ckB bitwise 10
cmp -s "$dir/ckU/step-00000020/model.safetensors" "$dir/ckB/step-00000020/model.safetensors" &&
  pass "tp 2 checkpoint resumed in the blocks mode: the same final model file" ||
  fail "the final model files of tp 2 and its blocks-mode resume differ"
same() { # WHAT DIR: DIR's step 5 holds exactly ckU's
  local out
  if out=$(/usr/bin/python3 "$src/tests/ref/ckpt_canon.py" "$dir/ckU/step-00000005" "$dir/$2/step-00000005" 2>&1)
  then pass "$1: $out"; else fail "$1: $out"; fi
}
reshard=(--set training.steps=5 "${ck[@]}")
nohw=1 run rt1 1 --resume "$dir/ckU/step-00000005" --set checkpoint.dir="$dir/rt1" "${reshard[@]}"
same "resharded tp 2 -> tp 1" rt1
nohw=1 run rt4 4 --set parallel.tp=4 --resume "$dir/rt1/step-00000005" --set checkpoint.dir="$dir/rt4" "${reshard[@]}"
same "resharded tp 1 -> tp 4 (vocabulary padded to 512 here, 256 canonically)" rt4
nohw=1 run rt2 4 --set parallel.tp=2 --set parallel.strategy=zero3 --resume "$dir/rt4/step-00000005" \
  --set checkpoint.dir="$dir/rt2" "${reshard[@]}"
same "resharded tp 4 -> tp 2 x dp 2, ZeRO-3" rt2
run rt2c 4 --set parallel.tp=2 --set parallel.strategy=zero3 --resume "$dir/rt2/step-00000005" \
  --set checkpoint.dir="$dir/rt2c" "${ck[@]}"
check "after the round trip, tp 2 x dp 2 with ZeRO-3 continues as the uninterrupted tp 2 run" ckU rt2c bitwise 15
grep -q "resharded: .*rt4/step-00000005" "$dir/rt4.log" && pass "a resharding resume says so" ||
  fail "no 'resharded' line in rt4.log"

# Hybrid sharding under tp (tp 2 x dp 2 hybrid_shard on 2 simulated nodes), the same data and
# global batch: the uninterrupted run is the tp 2 run's, bitwise (one rank's 2 accumulation
# steps == 2 data-parallel ranks, clipping not binding); its step-5 checkpoint holds exactly ckU's
# weights, moments and data position (the canonical index space); resumed at step 10 (as after
# a kill once step 10's checkpoint is committed) on the same layout it continues bitwise to the
# same final model file, and resumed in the blocks mode on 1 rank (another layout) likewise.
run ckH 4 --set parallel.tp=2 --set parallel.strategy=hybrid_shard --set checkpoint.dir="$dir/ckH" "${ck[@]}"
check "tp 2 x dp 2 hybrid with checkpoints == the tp 2 run, bitwise" ckU ckH bitwise
same "tp 2 x dp 2 hybrid checkpoint == tp 2's" ckH
run ckHr 4 --set parallel.tp=2 --set parallel.strategy=hybrid_shard --resume "$dir/ckH/step-00000010" \
  --set checkpoint.dir="$dir/ckHr" "${ck[@]}"
check "tp 2 x dp 2 hybrid resumed at step 10: continues bitwise" ckH ckHr bitwise 10
cmp -s "$dir/ckH/step-00000020/model.safetensors" "$dir/ckHr/step-00000020/model.safetensors" &&
  pass "tp 2 x dp 2 hybrid resumed: the same final model file" || fail "hybrid under tp: resumed final model differs"
run ckHB 1 --set parallel.tp=2 --set parallel.tp_blocks=true --resume "$dir/ckH/step-00000010" \
  --set checkpoint.dir="$dir/ckHB" "${ck[@]}"
check "tp 2 x dp 2 hybrid checkpoint resumed in the blocks mode on 1 rank: continues bitwise" ckH ckHB bitwise 10
# Top-K under tp: each rank's residual (its TP shard's) and element ages are checkpointed and
# restored: resumed at step 10 on the same layout, bitwise the uninterrupted run.
tk10=(--set parallel.tp=2 --set parallel.compression=topk --set parallel.compression_ratio=0.1)
run ckT 4 "${tk10[@]}" --set checkpoint.dir="$dir/ckT" "${ck[@]}"
run ckTr 4 "${tk10[@]}" --resume "$dir/ckT/step-00000010" --set checkpoint.dir="$dir/ckTr" "${ck[@]}"
check "tp 2 x dp 2 Top-K 0.1 resumed at step 10 (per-rank residuals restored): continues bitwise" ckT ckTr bitwise 10
# on the same 4 ranks at tp 1 (dp 4): the residual belongs to a TP shard, so it starts empty, with a warning
nohw=1 run ckT1 4 --set parallel.compression=topk --set parallel.compression_ratio=0.1 --batch 1 \
  --resume "$dir/ckT/step-00000010" --set checkpoint.dir="$dir/ckT1" --set training.steps=10 "${ck[@]}"
grep -q "written with another parallel.tp (the residual is per TP shard), so parallel.compression=topk starts with an empty" \
  "$dir/ckT1.log" && pass "a Top-K checkpoint of tp 2 resumed at tp 1: the residual starts empty, with a warning" ||
  fail "Top-K tp 2 -> tp 1 resume: $(grep -m1 'residual\|error' "$dir/ckT1.log")"

# The plan's memory for a tensor-parallel layout is dtrain's own sizing, equal to the allocator's
# high-water of the run (tp2 above: the same job).
pj=$(cd "$src" && "$bin" plan "${gpt[@]}" --batch 2 --set training.batch=2 --gpus 2 --nodes 1 --hardware cpu-core \
  --strategy ddp --tp 2 --pp 1 --json 2>"$dir/plan.err")
hw=$(sed -n 's/.*memory high-water: allocator=\([0-9]*\) .*/\1/p' "$dir/tp2.log" | head -1)
if out=$(echo "$pj" | /usr/bin/python3 -c "
import json, sys
l = json.load(sys.stdin)['layouts'][0]
assert l['layout'].startswith('ddp dp1 tp2 ') and l['memory_source'] == 'dtrain', l['layout']
t = l['memory_bytes']['total']
assert t == $hw, f'plan {t} vs allocator $hw'
print(f'plan {t} bytes == allocator high-water')" 2>&1); then pass "plan --tp 2: $out"
else fail "plan --tp 2 memory: $out $(head -2 "$dir/plan.err")"; fi

# model state per rank (params + grads + optimizer) from the allocator
state() { sed -n 's/.*params=\([0-9]*\) grads=\([0-9]*\) optimizer=\([0-9]*\).*/\1 \2 \3/p' "$dir/$1.log" | head -1 | awk '{print $1+$2+$3}'; }
a=$(state tp2) b=$(state plain)
if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { exit !(a <= 0.55 * b) }'; then
  pass "model state per rank at tp 2: $a of $b bytes ($(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }'))"
else fail "model state per rank at tp 2: '$a' of '$b' bytes (want <= 0.55)"; fi

refuse() { # WHAT NRANKS PATTERN [args...]
  local what=$1 n=$2 pat=$3 rc; shift 3
  if [ "$n" = 1 ]; then "$bin" train "${model[@]}" "${train[@]}" "$@" >"$dir/refuse.log" 2>&1; rc=$?
  else timeout 120 "${mpi[@]}" -n "$n" "$bin" train "${model[@]}" "${train[@]}" "$@" >"$dir/refuse.log" 2>&1; rc=$?; fi
  local lines; lines=$(grep -c "$pat" "$dir/refuse.log")
  if [ $rc -ne 0 ] && [ "$lines" = 1 ]; then pass "$what: $(grep -m1 "$pat" "$dir/refuse.log" | cut -c1-150)"
  else fail "$what: rc $rc, $lines line(s) matching '$pat': $(tail -3 "$dir/refuse.log")"; fi
}
refuse "tp not dividing the heads" 1 "parallel.tp=3 does not divide model.n_head=4" \
  --set parallel.tp=3 --set parallel.tp_blocks=true
refuse "tp not dividing the world" 2 "parallel.tp" --set parallel.tp=4
refuse "sequence parallelism without tp" 1 "parallel.sequence_parallel needs parallel.tp >= 2" \
  --set parallel.sequence_parallel=true
# hybrid under tp: 6 ranks, nodes of 4 and 2 - each DP group has 2 ranks on one node, 1 on the other
if timeout 120 "${mpi[@]}" -n 6 bash -c 'DTRAIN_NODE_ID=node$((OMPI_COMM_WORLD_RANK / 4)) exec "$0" "$@"' "$bin" train \
   "${model[@]}" "${train[@]}" --set parallel.tp=2 --set parallel.strategy=hybrid_shard >"$dir/refuse.log" 2>&1; then
  fail "hybrid under tp on uneven nodes ran"
elif [ "$(grep -c "parallel.hybrid with parallel.tp=2: every node must hold the same number" "$dir/refuse.log")" -ge 1 ]; then
  pass "hybrid under tp on uneven nodes: $(grep -m1 "parallel.hybrid with" "$dir/refuse.log" | cut -c1-150)"
else fail "hybrid under tp on uneven nodes: $(tail -3 "$dir/refuse.log")"; fi
model=(--set model.preset=llama-tiny --seq 32)
refuse "tp not dividing the key/value heads" 1 "parallel.tp=4 does not divide model.n_kv_head=2" \
  --set parallel.tp=4 --set parallel.tp_blocks=true

# LoRA and QLoRA under tensor parallelism (ARCHITECTURE decision 69): the adapters cut like their
# base, the low-rank partial products inside the base's sums, the replicated adapters' gradients
# summed over the TP group; 10 AdamW steps (eps 1e-5, as above), dropout 0.1.
ck_l=(--set checkpoint.every=5 --set checkpoint.keep_last=0 --set checkpoint.async=false)
lora=(--set lora.rank=4 --set lora.alpha=8 --set lora.dropout=0.1 --steps 10 "${eps[@]}")
lt=(--set lora.targets=q,k,v,o,gate,up,down "${lora[@]}")
model=(--set model.preset=llama-tiny --seq 32)
run lora_plain 1 "${lt[@]}" --set checkpoint.dir="$dir/ck_lora_plain" "${ck_l[@]}"
run lora_blocks 1 "${lt[@]}" --set parallel.tp=2 --set parallel.tp_blocks=true
run lora_tp2 2 "${lt[@]}" --set parallel.tp=2 --set checkpoint.dir="$dir/ck_lora_tp2" "${ck_l[@]}"
check "LoRA (llama, every projection, dropout 0.1): tp 2 on 2 ranks == blocks mode, bitwise" lora_tp2 lora_blocks bitwise 10
check "LoRA: tp 2 vs plain tp 1 LoRA" lora_tp2 lora_plain 1e-5 10
# the checkpoint holds the adapters in the canonical (tp = 1) layout: within 1e-4 of tp 1's
if out=$(cmp_runs "$dir/lora_tp2.jsonl" "$dir/ck_lora_tp2/step-00000010/model.safetensors" "$dir/lora_plain.jsonl" \
    "$dir/ck_lora_plain/step-00000010/model.safetensors" 1e-4 2>&1); then
  pass "LoRA tp 2 checkpoint: canonical adapters, within 1e-4 of tp 1's: $(echo "$out" | tail -1)"
else fail "LoRA tp 2 checkpoint vs tp 1: $(echo "$out" | tail -3)"; fi
for r in tp2 plain; do
  "$bin" ckpt export --peft "$dir/ck_lora_$r" "$dir/peft_$r" >"$dir/peft_$r.log" 2>&1 || fail "export --peft $r: $(tail -2 "$dir/peft_$r.log")"
done
if out=$(cmp_runs "$dir/lora_tp2.jsonl" "$dir/peft_tp2/adapter_model.safetensors" "$dir/lora_plain.jsonl" \
    "$dir/peft_plain/adapter_model.safetensors" 1e-4 2>&1); then
  pass "export --peft of the tp 2 checkpoint: PEFT's names and shapes, within 1e-4 of tp 1's: $(echo "$out" | tail -1)"
else fail "export --peft of tp 2 vs tp 1: $(echo "$out" | tail -3)"; fi
run lora_res 1 "${lt[@]}" --set parallel.tp=2 --set parallel.tp_blocks=true --resume "$dir/ck_lora_tp2/step-00000005" \
  --set checkpoint.dir="$dir/ck_lora_res" "${ck_l[@]}"
check "LoRA tp 2 checkpoint resumed in the blocks mode: continues bitwise" lora_tp2 lora_res bitwise 5
cmp -s "$dir/ck_lora_tp2/step-00000010/model.safetensors" "$dir/ck_lora_res/step-00000010/model.safetensors" &&
  pass "LoRA tp 2 checkpoint resumed in the blocks mode: the same final adapters file" ||
  fail "the final adapter files of LoRA tp 2 and its blocks-mode resume differ"
# at tp 1 (another layout): the base's layout-free fingerprint matches, the adapters and their
# moments reshard; the last 5 steps within 1e-5 of the plain run's and its final adapters within
# 1e-4 of the plain run's (sums in another order)
cp "$dir/lora_tp2.jsonl" "$dir/lora_res1.jsonl" # steps 1-5 from tp 2; the resume appends (and re-logs) 6-10
run lora_res1 1 "${lt[@]}" --resume "$dir/ck_lora_tp2/step-00000005" --set checkpoint.dir="$dir/ck_lora_res1" "${ck_l[@]}"
check "LoRA tp 2 checkpoint resumed at tp 1 vs plain tp 1 LoRA" lora_plain lora_res1 1e-5 10
if out=$(cmp_runs "$dir/lora_res1.jsonl" "$dir/ck_lora_res1/step-00000010/model.safetensors" "$dir/lora_plain.jsonl" \
    "$dir/ck_lora_plain/step-00000010/model.safetensors" 1e-4 2>&1); then
  pass "LoRA tp 2 checkpoint resumed at tp 1: final adapters within 1e-4 of plain tp 1's: $(echo "$out" | tail -1)"
else fail "LoRA tp 2 -> tp 1 resume: $(echo "$out" | tail -3)"; fi
grep -q '"lora_base_fp": "[0-9a-f]\{16\}"' "$dir/ck_lora_tp2/step-00000005/trainer.json" &&
  [ "$(sed -n 's/.*"lora_base_fp": "\(.*\)".*/\1/p' "$dir/ck_lora_tp2/step-00000005/trainer.json")" = \
    "$(sed -n 's/.*"lora_base_fp": "\(.*\)".*/\1/p' "$dir/ck_lora_plain/step-00000005/trainer.json")" ] &&
  pass "LoRA: the base fingerprint of tp 2 == tp 1's (layout-free)" || fail "LoRA base fingerprints differ between tp 2 and tp 1"
# ZeRO-3 over the data-parallel ranks: the adapters' windows gathered per unit, as any store's
run lora_blocks_dp2 2 "${lt[@]}" --set parallel.tp=2 --set parallel.tp_blocks=true "${noclip[@]}"
run lora_z3 4 "${lt[@]}" --set parallel.tp=2 --set parallel.strategy=zero3 "${noclip[@]}"
check "LoRA: tp 2 x dp 2 with zero3 == blocks x dp 2 with ddp, bitwise" lora_z3 lora_blocks_dp2 bitwise 10
# gpt2 (q, k, v: thirds of one fused column-parallel tensor) in bf16 with full checkpointing, tp 2 x dp 2
model=("${gpt[@]}")
lg=(--set lora.targets=q,k,v,o,up,down "${lora[@]}" "${lowp[@]}")
run lora_gblocks_dp2 2 "${lg[@]}" --set parallel.tp=2 --set parallel.tp_blocks=true
run lora_gtp2dp2 4 "${lg[@]}" --set parallel.tp=2
check "LoRA (gpt2, bf16, full checkpointing): tp 2 x dp 2 == blocks x dp 2, bitwise" lora_gtp2dp2 lora_gblocks_dp2 bitwise 10
# QLoRA: every shard its own NF4 tensor (d_model 128: row-parallel shards of 64 columns, whole blocks)
model=(--set model.preset=llama-tiny --seq 32 --model.d_model 128 --set model.d_ff=256)
lq=(--set lora.targets=q,k,v,o,gate,up,down --set lora.base_dtype=nf4 "${lora[@]}")
run qlora_blocks 1 "${lq[@]}" --set parallel.tp=2 --set parallel.tp_blocks=true
run qlora_tp2 2 "${lq[@]}" --set parallel.tp=2 --set checkpoint.dir="$dir/ck_qlora_tp2" "${ck_l[@]}"
check "QLoRA (llama, NF4 base): tp 2 on 2 ranks == blocks mode, bitwise" qlora_tp2 qlora_blocks bitwise 10
refuse "QLoRA tp 2 checkpoint resumed at tp 1 (the NF4 base is quantized shard by shard)" 1 \
  "written by a LoRA run with parallel.tp=2" "${lq[@]}" --resume "$dir/ck_qlora_tp2/step-00000005"
model=("${gpt[@]}")
refuse "QLoRA whose shards are not whole NF4 blocks" 1 "lora.base_dtype=nf4 with parallel.tp=2: a shard of" \
  --set lora.rank=4 --set lora.base_dtype=nf4 --set parallel.tp=2 --set parallel.tp_blocks=true

# parallel.layout: auto (issue 35 item 1): on 4 ranks (2 simulated nodes) rank 0 plans the job on cpu-core and every
# rank runs the fastest fitting layout dtrain can run - the one dtrain plan ranks first among
# those - logging the plan's top 3; an explicit parallel.tp stays and the rest is chosen.
auto=(--set model.preset=gpt2-tiny --seq 64 --batch 4 --steps 5 --set parallel.layout=auto
      --set parallel.layout_catalog="$src/configs/hardware.yaml")
model=() train=(--set logging.progress=lines --set logging.every=1)
run auto4 4 "${auto[@]}"
want=$(cd "$src" && "$bin" plan --set model.preset=gpt2-tiny --seq 64 --batch 4 --gpus 4 --nodes 2 --hardware cpu-core --json \
  2>/dev/null | /usr/bin/python3 -c "
import json, sys
for l in json.load(sys.stdin)['layouts']:
    if l['fits'] and l['cp'] == l['ep'] == 1 and l['pp'] <= 2 and (l['tp'] == 1 or 4 % l['tp'] == 0):
        print(l['layout']); break")
got=$(sed -n 's/.*parallel.layout auto on 4 x cpu-core: \([^,]*\), the fastest.*/\1/p' "$dir/auto4.log")
if [ -n "$want" ] && [ "$got" = "$want" ] && grep -q "plan's top 3: 1\. .*; 2\. .*; 3\. " "$dir/auto4.log" &&
   grep -q "rank(s) on 2 node(s), $(echo "$want" | sed 's/^hybrid-//; s/ .*//') over" "$dir/auto4.log"; then
  pass "layout auto on 4 ranks: $got (dtrain plan's fastest runnable), top 3 logged, run with it"
else fail "layout auto: got '$got', plan says '$want': $(grep -m1 'layout auto\|error' "$dir/auto4.log")"; fi
run autotp 4 "${auto[@]}" --set parallel.tp=2
if grep -q "parallel.layout auto on 4 x cpu-core: [a-z0-9-]* dp2 tp2 " "$dir/autotp.log" &&
   grep -q "process mesh: tp 2 x dp 2" "$dir/autotp.log" && grep -q "x 2 accumulation per rank" "$dir/autotp.log"; then
  pass "layout auto with parallel.tp=2: $(sed -n 's/.*cpu-core: \([^,]*\),.*/\1/p' "$dir/autotp.log"), the global batch kept (2 accumulation steps)"
else fail "layout auto with tp=2: $(grep -m1 'layout auto\|error' "$dir/autotp.log")"; fi
refuse "parallel.layout not auto" 1 "parallel.layout must be auto or ''" --set parallel.layout=fast
refuse "parallel.layout_hardware unknown" 2 "parallel.layout_hardware no-such-gpu: not in" "${auto[@]}" \
  --set parallel.layout_hardware=no-such-gpu
model=("${gpt[@]}") train=(--batch 2 --steps 20 --lr 3e-3 --warmup 3 --seed 11
       --set logging.progress=lines --set logging.peak_gflops=100 --set logging.every=1)

echo "test_tp: $fails failure(s)"
[ $fails -eq 0 ]
