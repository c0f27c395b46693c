#!/usr/bin/env bash
# Pipeline parallelism through `dtrain train` under MPI (parallel.pp; ARCHITECTURE decisions 74-76).
# One rank with training.grad_accum micro-batches is the reference; a pipeline runs the same
# micro-batches, so every stage's backwards in micro-batch order must give its bits:
#  - llama (untied head) pp 2 and pp 4 (4 ranks on 2 cores), 1f1b and gpipe: the losses and
#    gradient norms of every step and the final weights file, bitwise pp = 1's with clipping
#    off (the norm is summed stage by stage: equal to rounding - decision 74), and bitwise the
#    blocks mode's (parallel.pp_blocks: one process, the stages' sums) with clipping binding;
#  - gpt2 and llama with the head tied to the embedding (the last stage holds a copy; the
#    head's gradients of a step added to the embedding's once): pp 2 and pp 4, both schedules,
#    bitwise the blocks mode with clipping binding, and the blocks mode within 1e-5 of pp 1;
#  - vit pp 2; bf16 with full activation checkpointing; tp 2 x pp 2 against tp 2 (zb-h1 too, with
#    and without sequence parallelism); dp 2 x pp 2
#    against dp 2 with ddp and each ZeRO stage, pp 2 x dp 4 hybrid against dp 4 hybrid: bitwise
#    (ZeRO-2/3 under a pipeline reduce gradients once per step: the references at pp 1 do too);
#  - ZeRO's once-per-step modes (decision 80): one reduce-scatter per unit and step (micro mode:
#    one per micro-batch), one gather per unit and step with resident parameters (zero3, auto;
#    per use when the plan does not fit DTRAIN_MEM_PHYSICAL), the same bits either way, in bf16
#    and with bf16 gradients; zero2 step == ddp; interleaved stages in micro mode;
#  - zb-h1 with LoRA and QLoRA (gpt2, llama) == pp 1, with LoRA dropout on every projection at
#    pp 2 == pp 1 and tp 2 x pp 2 == tp 2 (decision 84);
#  - the interleaved schedule; fp16's overflow on one stage skips the step on all;
#  - parallel.layout auto with parallel.pp fixed runs the planner's fastest pipeline;
#  - validation through the pipeline: pp 2's eval losses are pp 1's;
#  - memory: the allocator's high-water equals the plan on every run (rank 0 logs it); stage 0
#    holds pp micro-batches' activations under 1f1b and all m under gpipe, and under zb-h1
#    exactly 1f1b's (pp 2 and 4);
#  - checkpoints in the canonical index space: a pp 2 checkpoint resumed at pp 1 and pp 4
#    continues bitwise; a round trip pp 4 -> 2 -> 1 -> 4, each a resume that only reshards,
#    holds exactly the original's weights, moments and data position;
#  - what is not built under a pipeline yet is refused in one line naming the key.
set -uo pipefail
bin=$1
dir=$2
src=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
mpi_env
mpi+=(-x DTRAIN_NODE_ID -x PPN)
export PPN=2

llama=(--set model.preset=llama-tiny --set model.untied_embeddings=1 --set model.n_layer=4 --seq 32)
train=(--batch 2 --steps 8 --lr 3e-3 --warmup 2 --seed 11 --set training.grad_accum=4 --set optimizer.grad_clip=0
       --set logging.progress=lines --set logging.peak_gflops=100 --set logging.every=1)
model=("${llama[@]}")
. "$(dirname "$0")/tp_lib.sh" # run, compare, check
same_file() { # WHAT A B
  cmp -s "$dir/$2.st" "$dir/$3.st" && pass "$1: the final weights file is identical" || fail "$1: the final weights differ"
}

run ref 1 --save-weights "$dir/ref.st"
for pp in 2 4; do
  for s in 1f1b gpipe; do
    run "pp${pp}_$s" "$pp" --set parallel.pp=$pp --set parallel.pp_schedule=$s --save-weights "$dir/pp${pp}_$s.st"
    check "llama pp $pp $s == pp 1, bitwise" ref "pp${pp}_$s" bitwise 8
    same_file "llama pp $pp $s" ref "pp${pp}_$s"
  done
done
# Activation sets on stage 0: 1f1b holds pp micro-batches, gpipe all 4 (the allocator's activations).
acts() { sed -n 's/.*memory high-water: .* activations=\([0-9]*\).*/\1/p' "$dir/$1.log" | head -1; }
a1=$(acts ref) a2=$(acts pp2_1f1b) a4=$(acts pp4_1f1b) g2=$(acts pp2_gpipe)
/usr/bin/python3 - "$a1" "$a2" "$a4" "$g2" <<'PY' && pass "stage 0's activations: 1f1b = pp sets, gpipe = m sets (of its 2 layers)" || fail "stage 0's activations: ref $a1, pp2 1f1b $a2, pp4 1f1b $a4, pp2 gpipe $g2"
import sys
a1, a2, a4, g2 = map(int, sys.argv[1:])
# pp 2: stage 0 holds 2 of 4 layers and no head; pp 4: 1 layer: its sets are smaller than ref's
assert a2 % 2 == 0 and g2 == 2 * a2 and a4 % 4 == 0 and a2 < 2 * a1 and a4 < 4 * a1, (a1, a2, a4, g2)
PY

# Clipping binding (the norms are ~1): bitwise the blocks mode, which sums the norm per stage.
clip=(--set optimizer.grad_clip=0.5)
run blk 1 --set parallel.pp=2 --set parallel.pp_blocks=true "${clip[@]}" --save-weights "$dir/blk.st"
run pp2clip 2 --set parallel.pp=2 "${clip[@]}" --save-weights "$dir/pp2clip.st"
check "llama pp 2 with clipping binding == its blocks mode, bitwise" blk pp2clip bitwise 8
same_file "llama pp 2 with clipping binding" blk pp2clip

# The interleaved schedule (v chunks per stage, virtual stage c pp + s; a ring of transfers):
# bitwise pp 1 with clipping off, bitwise its blocks mode (the norm per chunk region) with
# clipping binding; pp 4 x v 2 on 4 ranks (8 layers); a tied head.
il=(--set parallel.pp_schedule=interleaved --set parallel.pp_virtual=2)
run il_pp2 2 --set parallel.pp=2 "${il[@]}" --save-weights "$dir/il_pp2.st"
check "llama interleaved pp 2 x v 2 == pp 1, bitwise" ref il_pp2 bitwise 8
same_file "llama interleaved pp 2 x v 2" ref il_pp2
run il_blk 1 --set parallel.pp=2 --set parallel.pp_blocks=true "${il[@]}" "${clip[@]}" --save-weights "$dir/il_blk.st"
run il_clip 2 --set parallel.pp=2 "${il[@]}" "${clip[@]}" --save-weights "$dir/il_clip.st"
check "llama interleaved pp 2 x v 2 with clipping binding == its blocks mode, bitwise" il_blk il_clip bitwise 8
same_file "llama interleaved pp 2 x v 2 with clipping binding" il_blk il_clip
model=(--set model.preset=llama-tiny --set model.untied_embeddings=1 --set model.n_layer=8 --seq 32)
run il8_ref 1 --save-weights "$dir/il8_ref.st"
run il8_pp4 4 --set parallel.pp=4 "${il[@]}" --save-weights "$dir/il8_pp4.st"
check "llama (8 layers) interleaved pp 4 x v 2 == pp 1, bitwise" il8_ref il8_pp4 bitwise 8
same_file "llama (8 layers) interleaved pp 4 x v 2" il8_ref il8_pp4
run il8_v4 2 --set parallel.pp=2 --set parallel.pp_schedule=interleaved --set parallel.pp_virtual=4 \
  --set training.grad_accum=4 --save-weights "$dir/il8_v4.st"
check "llama (8 layers) interleaved pp 2 x v 4 == pp 1, bitwise" il8_ref il8_v4 bitwise 8
model=(--set model.preset=gpt2-tiny --set model.n_layer=4 --seq 32)
run il_gpt2_blk 1 --set parallel.pp=2 --set parallel.pp_blocks=true "${il[@]}" "${clip[@]}" --save-weights "$dir/il_gpt2_blk.st"
run il_gpt2 2 --set parallel.pp=2 "${il[@]}" "${clip[@]}" --save-weights "$dir/il_gpt2.st"
check "gpt2 (tied head) interleaved pp 2 x v 2 == its blocks mode, bitwise" il_gpt2_blk il_gpt2 bitwise 8
same_file "gpt2 (tied head) interleaved pp 2 x v 2" il_gpt2_blk il_gpt2
model=("${llama[@]}")

# LoRA and QLoRA under a pipeline: each stage holds its layers' frozen base and adapters; pp 2
# == pp 1 bitwise (gpt2: its tied head frozen in the base), the base's layout-free fingerprint
# the same, and a pp 2 LoRA checkpoint resumed at pp 1 ends on pp 1's adapters file.
for fam in gpt2 llama; do
  if [ $fam = gpt2 ]; then model=(--set model.preset=gpt2-tiny --set model.n_layer=4 --seq 32); else model=("${llama[@]}"); fi
  for b in fp32 nf4; do
    lora=(--set lora.rank=4 --set lora.base_dtype=$b)
    run "lora_${fam}_$b" 1 "${lora[@]}"
    run "lora_${fam}_${b}_pp2" 2 "${lora[@]}" --set parallel.pp=2
    check "$fam LoRA (base $b) pp 2 == pp 1, bitwise" "lora_${fam}_$b" "lora_${fam}_${b}_pp2" bitwise 8
    # zb-h1 (decision 84): the adapters' dA and dB deferred to W, the base's input gradient in B
    run "lora_${fam}_${b}_zb" 2 "${lora[@]}" --set parallel.pp=2 --set parallel.pp_schedule=zb-h1
    check "$fam LoRA (base $b) zb-h1 pp 2 == pp 1, bitwise" "lora_${fam}_$b" "lora_${fam}_${b}_zb" bitwise 8
  done
done
# zb-h1 with LoRA's dropout (each micro-batch's masks again at its W) and under tp 2 x pp 2 (a
# replicated adapter's per-shard contributions summed over the TP group at W)
ld=(--set lora.rank=4 --set lora.dropout=0.1 --set lora.targets=q,k,v,o,gate,up,down)
run lora_drop 1 "${ld[@]}"
run lora_drop_zb 2 "${ld[@]}" --set parallel.pp=2 --set parallel.pp_schedule=zb-h1
check "llama LoRA with dropout, zb-h1 pp 2 == pp 1, bitwise" lora_drop lora_drop_zb bitwise 8
run lora_tp2 2 "${ld[@]}" --set parallel.tp=2
run lora_tp2_zb 4 "${ld[@]}" --set parallel.tp=2 --set parallel.pp=2 --set parallel.pp_schedule=zb-h1
check "llama LoRA with dropout, zb-h1 tp 2 x pp 2 == tp 2, bitwise" lora_tp2 lora_tp2_zb bitwise 8
model=(--set model.preset=gpt2-tiny --set model.n_layer=4 --seq 32)
lck=(--set lora.rank=4 --set checkpoint.every=4 --set checkpoint.keep_last=0 --set checkpoint.async=false)
run lck1 1 "${lck[@]}" --set checkpoint.dir="$dir/lck1"
run lck2 2 "${lck[@]}" --set parallel.pp=2 --set checkpoint.dir="$dir/lck2"
fp1=$(grep -o '"lora_base_fp": "[0-9a-f]*"' "$dir/lck1/step-00000008/trainer.json") fp2=$(grep -o '"lora_base_fp": "[0-9a-f]*"' "$dir/lck2/step-00000008/trainer.json")
[ -n "$fp1" ] && [ "$fp1" = "$fp2" ] && pass "LoRA base fingerprint over the stages: $fp2, pp 1's" || fail "LoRA fingerprints: pp 1 '$fp1', pp 2 '$fp2'"
run lck3 1 "${lck[@]}" --resume "$dir/lck2/step-00000004" --set checkpoint.dir="$dir/lck3"
cmp -s "$dir/lck1/step-00000008/model.safetensors" "$dir/lck3/step-00000008/model.safetensors" &&
  pass "a pp 2 LoRA checkpoint resumed at pp 1: pp 1's adapters file at the end" || fail "LoRA pp 2 -> pp 1 resume: adapters differ"
model=("${llama[@]}")

# fp16 with dynamic loss scaling: an overflow in the last stage's gradients only (the test aid on
# rank 1) is every stage's (the norm is global): the step is skipped and the scale halved on
# both, as in the blocks mode where the one process overflows.
mpi_saved=("${mpi[@]}")
mpi+=(-x DTRAIN_TEST_OVERFLOW)
f16=(--set model.preset=gpt2-tiny --set model.n_layer=4 --seq 32)
model=("${f16[@]}")
DTRAIN_TEST_OVERFLOW=3:0 run f16_blk 1 --set training.precision=fp16 --set parallel.pp=2 --set parallel.pp_blocks=true \
  "${clip[@]}" --save-weights "$dir/f16_blk.st"
DTRAIN_TEST_OVERFLOW=3:1 run f16_pp2 2 --set training.precision=fp16 --set parallel.pp=2 "${clip[@]}" \
  --save-weights "$dir/f16_pp2.st"
mpi=("${mpi_saved[@]}")
n1=$(grep -c '"overflow":true' "$dir/f16_blk.jsonl") n2=$(grep -c '"overflow":true' "$dir/f16_pp2.jsonl")
[ "$n1" = 1 ] && [ "$n2" = 1 ] && pass "fp16: the last stage's overflow skipped the step on every stage (1 overflow step)" ||
  fail "fp16 overflow steps: blocks $n1, pp 2 $n2 (want 1 each)"
check "fp16 with an overflow on the last stage, pp 2 == blocks mode, bitwise" f16_blk f16_pp2 bitwise 8
same_file "fp16 with an overflow on the last stage, pp 2" f16_blk f16_pp2

# Tied heads: gpt2, and llama tied.
for fam in gpt2 llama; do
  if [ $fam = gpt2 ]; then model=(--set model.preset=gpt2-tiny --set model.n_layer=4 --seq 32)
  else model=(--set model.preset=llama-tiny --set model.untied_embeddings=0 --set model.n_layer=4 --seq 32); fi
  run "${fam}_plain" 1 "${clip[@]}"
  for pp in 2 4; do
    run "${fam}_blk$pp" 1 --set parallel.pp=$pp --set parallel.pp_blocks=true "${clip[@]}" --save-weights "$dir/${fam}_blk$pp.st"
    for s in 1f1b gpipe; do
      run "${fam}_pp${pp}_$s" "$pp" --set parallel.pp=$pp --set parallel.pp_schedule=$s "${clip[@]}" \
        --save-weights "$dir/${fam}_pp${pp}_$s.st"
      check "$fam (tied head) pp $pp $s == blocks mode, bitwise" "${fam}_blk$pp" "${fam}_pp${pp}_$s" bitwise 8
      same_file "$fam (tied head) pp $pp $s" "${fam}_blk$pp" "${fam}_pp${pp}_$s"
    done
  done
  check "$fam (tied head) blocks mode vs pp 1 (the head's gradients added once per step)" "${fam}_plain" "${fam}_blk2" 1e-5 8
done
for z in zero1 zero2 zero3; do # the copy's reduced gradient piece by piece (the same shard on both stages)
  run "gpt2_dp2$z" 2 --set parallel.strategy=$z --set parallel.pp=2 --set parallel.pp_blocks=true --save-weights "$dir/gpt2_dp2$z.st"
  run "gpt2_dp2pp2$z" 4 --set parallel.strategy=$z --set parallel.pp=2 --save-weights "$dir/gpt2_dp2pp2$z.st"
  check "gpt2 (tied head) dp 2 x pp 2 $z == its blocks mode x dp 2, bitwise" "gpt2_dp2$z" "gpt2_dp2pp2$z" bitwise 8
  same_file "gpt2 (tied head) dp 2 x pp 2 $z" "gpt2_dp2$z" "gpt2_dp2pp2$z"
done

model=(--set model.preset=vit-tiny --set model.n_layer=4 --seq 64)
run vit_ref 1 --save-weights "$dir/vit_ref.st"
run vit_pp2 2 --set parallel.pp=2 --save-weights "$dir/vit_pp2.st"
check "vit pp 2 == pp 1, bitwise" vit_ref vit_pp2 bitwise 8
same_file "vit pp 2" vit_ref vit_pp2

model=("${llama[@]}")
lowp=(--set training.precision=bf16 --set memory.activation_checkpointing=full)
run bf_ref 1 "${lowp[@]}" --save-weights "$dir/bf_ref.st"
run bf_pp2 2 --set parallel.pp=2 "${lowp[@]}" --save-weights "$dir/bf_pp2.st"
check "bf16 + full checkpointing, pp 2 == pp 1, bitwise" bf_ref bf_pp2 bitwise 8
same_file "bf16 + full checkpointing, pp 2" bf_ref bf_pp2

run tp2 2 --set parallel.tp=2 --save-weights "$dir/tp2.st"
run tp2pp2 4 --set parallel.tp=2 --set parallel.pp=2 --save-weights "$dir/tp2pp2.st"
check "tp 2 x pp 2 == tp 2, bitwise" tp2 tp2pp2 bitwise 8
same_file "tp 2 x pp 2" tp2 tp2pp2
# zb-h1 under tensor parallelism (decision 84): each shard's weight GEMMs deferred (a row-parallel
# GEMM's one dout for both shards), stage 0 at 1f1b's activations; with sequence parallelism the
# column-parallel GEMMs' inputs are gathered again at W
run zb_tp2pp2 4 --set parallel.tp=2 --set parallel.pp=2 --set parallel.pp_schedule=zb-h1 --save-weights "$dir/zb_tp2pp2.st"
check "zb-h1 tp 2 x pp 2 == tp 2, bitwise" tp2 zb_tp2pp2 bitwise 8
same_file "zb-h1 tp 2 x pp 2" tp2 zb_tp2pp2
z=$(acts zb_tp2pp2) o=$(acts tp2pp2)
[ -n "$z" ] && [ "$z" = "$o" ] && pass "zb-h1 tp 2 x pp 2: stage 0's activations $z bytes == 1f1b's" \
  || fail "zb-h1 tp 2 x pp 2: stage 0's activations '$z' bytes, 1f1b's '$o'"
sp=(--set parallel.tp=2 --set parallel.sequence_parallel=true)
run tp2sp 2 "${sp[@]}" --save-weights "$dir/tp2sp.st"
run zb_tp2sp 4 "${sp[@]}" --set parallel.pp=2 --set parallel.pp_schedule=zb-h1 --save-weights "$dir/zb_tp2sp.st"
check "zb-h1 tp 2 x pp 2 with sequence parallelism == tp 2 with it, bitwise" tp2sp zb_tp2sp bitwise 8
same_file "zb-h1 tp 2 x pp 2 with sequence parallelism" tp2sp zb_tp2sp
# 3-D: tp 2 x pp 2 x dp 2 on 8 ranks, zero1 over dp == tp 2 x dp 2 on 4, bitwise
run t3_ref 4 --set parallel.tp=2 --set parallel.strategy=zero1 --save-weights "$dir/t3_ref.st"
run t3 8 --set parallel.tp=2 --set parallel.pp=2 --set parallel.strategy=zero1 --save-weights "$dir/t3.st"
check "tp 2 x pp 2 x dp 2 (zero1) == tp 2 x dp 2, bitwise" t3_ref t3 bitwise 8
same_file "tp 2 x pp 2 x dp 2 (zero1)" t3_ref t3
run dp2 2 --save-weights "$dir/dp2.st"
run dp2pp2 4 --set parallel.pp=2 --save-weights "$dir/dp2pp2.st"
check "dp 2 x pp 2 (ddp) == dp 2, bitwise" dp2 dp2pp2 bitwise 8
same_file "dp 2 x pp 2" dp2 dp2pp2
# hybrid sharding over a stage's data-parallel ranks: pp 2 x dp 4 on 4 simulated nodes of 2 (each
# stage's 4 ranks span 2 nodes) == dp 4 hybrid, bitwise
PPN=2 run hyb_dp4 4 --set parallel.strategy=zero3 --set parallel.hybrid=true --set parallel.zero_reduce=step \
  --save-weights "$dir/hyb_dp4.st"
PPN=2 run hyb_pp2 8 --set parallel.strategy=zero3 --set parallel.hybrid=true --set parallel.pp=2 --save-weights "$dir/hyb_pp2.st"
check "pp 2 x dp 4 hybrid zero3 (4 nodes) == dp 4 hybrid zero3, bitwise" hyb_dp4 hyb_pp2 bitwise 8
same_file "pp 2 x dp 4 hybrid zero3" hyb_dp4 hyb_pp2
for z in zero1 zero2 zero3; do # each ZeRO stage over a stage's data-parallel ranks (zero2/3: once a step)
  run "dp2_$z" 2 --set parallel.strategy=$z --set parallel.zero_reduce=step --save-weights "$dir/dp2_$z.st"
  run "dp2pp2_$z" 4 --set parallel.strategy=$z --set parallel.pp=2 --save-weights "$dir/dp2pp2_$z.st"
  check "dp 2 x pp 2 ($z) == dp 2 ($z), bitwise" "dp2_$z" "dp2pp2_$z" bitwise 8
  same_file "dp 2 x pp 2 ($z)" "dp2_$z" "dp2pp2_$z"
done

# ZeRO's once-per-step modes (decision 80). Counts from rank 0's log line "zero: R unit
# reduce-scatters, G unit gathers in S steps of U units": under a pipeline (auto) one
# reduce-scatter per unit and step, and zero3 gathers each unit once per step into its resident
# copy; micro mode reduces each unit at each of the 4 micro-batches, per-use gathers are many
# more, with the same bits. zero2 reducing once a step is ddp's arithmetic: bitwise dp 2 ddp.
counts() { sed -n 's/.*zero: \([0-9]*\) unit reduce-scatters, \([0-9]*\) unit gathers in \([0-9]*\) steps of \([0-9]*\) units.*/\1 \2 \3 \4/p' "$dir/$1.log"; }
zcount() { # WHAT NAME REDUCES-PER-UNIT-STEP GATHERS(eq N | gt N per unit and step)
  local c; c=$(counts "$2")
  if /usr/bin/python3 - $c "$3" "$4" <<'PY'; then pass "$1: $c (reduces, gathers, steps, units)"; else fail "$1: counts '$c'"; fi
import sys
r, g, s, u, per, gat = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
assert s == 8 and u > 0 and r == per * s * u, (r, s, u)
op, n = gat.split()
assert (g == int(n) * s * u) if op == "eq" else (g > int(n) * s * u), (g, s, u)
PY
}
check "zero2 reducing once a step (dp 2, 4 micro-batches) == ddp, bitwise" dp2 dp2_zero2 bitwise 8
zcount "zero2 under pp 2 (auto: step): one reduce-scatter per unit and step" dp2pp2_zero2 1 "eq 0"
zcount "zero3 under pp 2 (auto: step, step): one reduce-scatter and one gather per unit and step" dp2pp2_zero3 1 "eq 1"
grep -q "zero: gradients reduce-scattered once a step.*parallel.zero3_gather=step" "$dir/dp2pp2_zero3.log" &&
  pass "zero3 under pp 2: the modes chosen are logged at start" || fail "zero3 modes not logged: $(grep -m1 'zero:' "$dir/dp2pp2_zero3.log")"
mpi_saved=("${mpi[@]}")
mpi+=(-x DTRAIN_MEM_PHYSICAL)
DTRAIN_MEM_PHYSICAL=1000000 run z3_small 4 --set parallel.strategy=zero3 --set parallel.pp=2 --save-weights "$dir/z3_small.st"
mpi=("${mpi_saved[@]}")
grep -q "parallel.zero3_gather=use" "$dir/z3_small.log" && pass "zero3_gather auto: use when the plan with resident parameters exceeds the memory" ||
  fail "zero3_gather auto with 1 MB: $(grep -m1 'zero:' "$dir/z3_small.log")"
check "zero3 under pp 2, gathered per use == resident for the step, bitwise" dp2pp2_zero3 z3_small bitwise 8
same_file "zero3 per use vs per step" dp2pp2_zero3 z3_small
zcount "zero3 gathered per use: more than one gather per unit and step" z3_small 1 "gt 1"
run dp2m_zero2 2 --set parallel.strategy=zero2 --save-weights "$dir/dp2m_zero2.st"
run z2_micro 4 --set parallel.strategy=zero2 --set parallel.pp=2 --set parallel.zero_reduce=micro
check "zero2 micro under pp 2 == dp 2 micro, bitwise" dp2m_zero2 z2_micro bitwise 8
zcount "zero2 micro under pp 2: a reduce-scatter per unit and micro-batch" z2_micro 4 "eq 0"
run il_z2m 4 --set parallel.strategy=zero2 --set parallel.pp=2 --set parallel.zero_reduce=micro \
  --set parallel.pp_schedule=interleaved --set parallel.pp_virtual=2 --save-weights "$dir/il_z2m.st"
check "zero2 micro, interleaved pp 2 x v 2 (a chunk's first reduction writes the shard) == dp 2 micro, bitwise" dp2m_zero2 il_z2m bitwise 8
same_file "zero2 micro, interleaved" dp2m_zero2 il_z2m
bfz=(--set training.precision=bf16 --set parallel.strategy=zero3 --set parallel.pp=2)
run bf_z3s 4 "${bfz[@]}" --set parallel.zero3_gather=step --save-weights "$dir/bf_z3s.st"
run bf_z3u 4 "${bfz[@]}" --set parallel.zero3_gather=use --save-weights "$dir/bf_z3u.st"
check "bf16 zero3 under pp 2: gathered per step (16-bit copies narrowed locally) == per use (16-bit gathers), bitwise" bf_z3u bf_z3s bitwise 8
same_file "bf16 zero3 per step vs per use" bf_z3u bf_z3s
gbf=(--set parallel.grad_dtype=bf16 --set parallel.strategy=zero2)
run bg_dp2 2 "${gbf[@]}" --set parallel.zero_reduce=step --save-weights "$dir/bg_dp2.st"
run bg_pp2 4 "${gbf[@]}" --set parallel.pp=2 --save-weights "$dir/bg_pp2.st"
check "bf16 gradients, zero2 once a step: pp 2 x dp 2 == dp 2, bitwise" bg_dp2 bg_pp2 bitwise 8
same_file "bf16 gradients, zero2 once a step" bg_dp2 bg_pp2

# The zero-bubble schedule (zb-h1): the backward split into an input-gradient pass B and a
# weight-gradient pass W (the matmuls' dW GEMMs deferred, replayed from their douts), W filling
# 1F1B's cool-down: bitwise pp 1 (llama pp 2 and 4, vit, bf16, full checkpointing every 2),
# its blocks mode with a tied head and clipping binding (gpt2), and dp 2 x pp 2 with zero1 and
# zero3; stage 0 at 1f1b's activation memory (the douts in dead activations).
zb=(--set parallel.pp_schedule=zb-h1)
for pp in 2 4; do
  run "zb_pp$pp" $pp --set parallel.pp=$pp "${zb[@]}" --save-weights "$dir/zb_pp$pp.st"
  check "llama zb-h1 pp $pp == pp 1, bitwise" ref "zb_pp$pp" bitwise 8
  same_file "llama zb-h1 pp $pp" ref "zb_pp$pp"
  # its douts live in activations the backward made dead (decision 81): stage 0's activations
  # (the allocator's, = the plan) are 1f1b's, to the byte
  z=$(acts "zb_pp$pp") o=$(acts "pp${pp}_1f1b")
  [ -n "$z" ] && [ "$z" = "$o" ] && pass "llama zb-h1 pp $pp: stage 0's activations $z bytes == 1f1b's" \
    || fail "llama zb-h1 pp $pp: stage 0's activations '$z' bytes, 1f1b's '$o'"
done
for z in zero1 zero3; do # the bias's gradient found in its unit's window at W (ZeRO-2/3 move them)
  run "zb_dp2$z" 4 --set parallel.pp=2 "${zb[@]}" --set parallel.strategy=$z --save-weights "$dir/zb_dp2$z.st"
  check "llama zb-h1 dp 2 x pp 2 $z == dp 2 $z, bitwise" "dp2_$z" "zb_dp2$z" bitwise 8
  same_file "llama zb-h1 dp 2 x pp 2 $z" "dp2_$z" "zb_dp2$z"
done
run zb_bf16 2 --set parallel.pp=2 "${zb[@]}" "${lowp[@]}" --set memory.activation_checkpointing=none --save-weights "$dir/zb_bf16.st"
run bf_nock 1 "${lowp[@]}" --set memory.activation_checkpointing=none --save-weights "$dir/bf_nock.st"
check "llama zb-h1 in bf16 (the 16-bit douts narrowed again at W) == pp 1 bf16, bitwise" bf_nock zb_bf16 bitwise 8
same_file "llama zb-h1 in bf16" bf_nock zb_bf16
# with activation checkpointing (every 2: layers 0 and 2 recompute, their weight gradients in
# B; decision 81): bitwise pp 1 with the same checkpointing, stage 0 at 1f1b's activations
ck=(--set memory.activation_checkpointing=full --set memory.activation_checkpointing_every=2)
run ck_ref 1 "${ck[@]}" --save-weights "$dir/ck_ref.st"
run zb_ck 2 --set parallel.pp=2 "${zb[@]}" "${ck[@]}" --save-weights "$dir/zb_ck.st"
check "llama zb-h1 with full checkpointing every 2 == pp 1 with it, bitwise" ck_ref zb_ck bitwise 8
same_file "llama zb-h1 with checkpointing" ck_ref zb_ck
run ck_1f1b 2 --set parallel.pp=2 "${ck[@]}"
z=$(acts zb_ck) o=$(acts ck_1f1b)
[ -n "$z" ] && [ "$z" = "$o" ] && pass "llama zb-h1 with checkpointing: stage 0's activations $z bytes == 1f1b's" \
  || fail "llama zb-h1 with checkpointing: stage 0's activations '$z' bytes, 1f1b's '$o'"
model=(--set model.preset=gpt2-tiny --set model.n_layer=4 --seq 32)
run zb_gpt2 2 --set parallel.pp=2 "${zb[@]}" "${clip[@]}" --save-weights "$dir/zb_gpt2.st"
check "gpt2 (tied head) zb-h1 pp 2 with clipping binding == blocks mode, bitwise" gpt2_blk2 zb_gpt2 bitwise 8
same_file "gpt2 (tied head) zb-h1 pp 2" gpt2_blk2 zb_gpt2
model=(--set model.preset=vit-tiny --set model.n_layer=4 --seq 64)
run zb_vit 2 --set parallel.pp=2 "${zb[@]}" --save-weights "$dir/zb_vit.st"
check "vit zb-h1 pp 2 == pp 1, bitwise" vit_ref zb_vit bitwise 8
same_file "vit zb-h1 pp 2" vit_ref zb_vit
model=("${llama[@]}")

# Real data through the shuffling sampler, with validation and checkpoints.
pangram_corpus 400 20 0.1
ck=(--data "$dir/corpus_train_*.bin" --set data.val="$dir/corpus_val_*.bin" --set training.eval_interval=5
    --set training.eval_batches=2 --model.vocab_size 256 --set checkpoint.every=4 --set checkpoint.keep_last=0
    --set checkpoint.async=false)
run ckR 1 --set checkpoint.dir="$dir/ckR" "${ck[@]}"
run ckU 2 --set parallel.pp=2 --set checkpoint.dir="$dir/ckU" "${ck[@]}"
check "pp 2 on real data with validation == pp 1, bitwise" ckR ckU bitwise 8
e1=$(evals ckR) e2=$(evals ckU)
[ "$e1" = "$e2" ] && [ "$e1" != "[]" ] && pass "validation through the pipeline: pp 2's losses $e2 are pp 1's" ||
  fail "validation losses: pp 1 $e1, pp 2 $e2"
run ck1 1 --resume "$dir/ckU/step-00000004" --set checkpoint.dir="$dir/ck1" "${ck[@]}"
check "pp 2 checkpoint resumed at pp 1: continues bitwise" ckU ck1 bitwise 4
run ck4 4 --set parallel.pp=4 --resume "$dir/ckU/step-00000004" --set checkpoint.dir="$dir/ck4" "${ck[@]}"
check "pp 2 checkpoint resumed at pp 4: continues bitwise" ckU ck4 bitwise 4
run ckI 2 --set parallel.pp=2 "${il[@]}" --resume "$dir/ckU/step-00000004" --set checkpoint.dir="$dir/ckI" "${ck[@]}"
check "pp 2 checkpoint resumed interleaved (v 2), with validation through every chunk: continues bitwise" ckU ckI bitwise 4
e3=$(evals ckI)
[ "$e3" = "$(evals ckU | python3 -c 'import sys,ast; v=ast.literal_eval(sys.stdin.read()); print(v[1:])')" ] &&
  pass "validation through the interleaved pipeline: $e3" || fail "interleaved validation losses $e3 vs $(evals ckU)"
cmp -s "$dir/ckU/step-00000008/model.safetensors" "$dir/ck4/step-00000008/model.safetensors" &&
  pass "pp 2 -> pp 4 resume: the same final model file" || fail "the final model files of pp 2 and its pp 4 resume differ"
# HF export and eval read a pipeline checkpoint as any other (the canonical index space).
hf_eval() { # NAME: export and eval of NAME's last checkpoint
  "$bin" ckpt export --hf "$dir/$1/step-00000008" "$dir/$1.hf" >"$dir/$1.export.log" 2>&1 || fail "export $1: $(tail -2 "$dir/$1.export.log")"
  "$bin" eval "$dir/$1/step-00000008" --data.val "$dir/corpus_val_*.bin" --seq 32 --batch 2 --set training.eval_batches=2 \
    2>&1 | awk '/model.safetensors/ {print $2, $3}'
}
ev1=$(hf_eval ckR) ev2=$(hf_eval ckU)
cmp -s "$dir/ckR.hf/model.safetensors" "$dir/ckU.hf/model.safetensors" && [ -s "$dir/ckU.hf/model.safetensors" ] &&
  pass "HF export of a pp 2 checkpoint: the pp 1 run's file" || fail "HF exports of the pp 1 and pp 2 checkpoints differ"
[ -n "$ev1" ] && [ "$ev1" = "$ev2" ] && pass "dtrain eval of a pp 2 checkpoint: tokens and loss $ev2, as pp 1's" || fail "eval: pp 1 '$ev1', pp 2 '$ev2'"
same() { # WHAT DIR: DIR's step 4 holds exactly ckU's
  local out
  if out=$(/usr/bin/python3 "$src/tests/ref/ckpt_canon.py" "$dir/ckU/step-00000004" "$dir/$2/step-00000004" 2>&1)
  then pass "$1: $out"; else fail "$1: $out"; fi
}
reshard=(--set training.steps=4 "${ck[@]}")
nohw=1 run rt4 4 --set parallel.pp=4 --resume "$dir/ckU/step-00000004" --set checkpoint.dir="$dir/rt4" "${reshard[@]}"
same "resharded pp 2 -> pp 4" rt4
nohw=1 run rt2 2 --set parallel.pp=2 --resume "$dir/rt4/step-00000004" --set checkpoint.dir="$dir/rt2" "${reshard[@]}"
same "resharded pp 4 -> pp 2" rt2
nohw=1 run rt1 1 --resume "$dir/rt2/step-00000004" --set checkpoint.dir="$dir/rt1" "${reshard[@]}"
same "resharded pp 2 -> pp 1" rt1
nohw=1 run rt4b 4 --set parallel.pp=4 --resume "$dir/rt1/step-00000004" --set checkpoint.dir="$dir/rt4b" "${reshard[@]}"
same "resharded pp 1 -> pp 4 (round trip 4 -> 2 -> 1 -> 4)" rt4b

# parallel.layout auto with parallel.pp=2 fixed (issue 35 item 1): rank 0 plans on cpu-core
# and every rank runs the fastest fitting pipeline layout dtrain plan ranks first.
auto=(--set parallel.layout=auto --set parallel.layout_catalog="$src/configs/hardware.yaml" --set training.batch=16)
train_saved=("${train[@]}")
train=(--batch 2 --steps 4 --seed 11 --set logging.progress=lines --set logging.every=1) # the batch: training.batch
run autopp 4 "${auto[@]}" --set parallel.pp=2
train=("${train_saved[@]}")
want=$(cd "$src" && "$bin" plan "${llama[@]}" --batch 2 --global-batch 16 --gpus 4 --nodes 2 --hardware cpu-core --pp 2 --json \
  2>/dev/null | /usr/bin/python3 -c "
import json, sys
for l in json.load(sys.stdin)['layouts']:
    if l['fits'] and l['dtrain_runs']:
        print(l['layout']); break")
got=$(sed -n 's/.*parallel.layout auto on 4 x cpu-core: \([^,]*\), the fastest.*/\1/p' "$dir/autopp.log")
if [ -n "$want" ] && [ "$got" = "$want" ] && grep -q "pipeline: pp 2 x tp " "$dir/autopp.log"; then
  pass "layout auto with parallel.pp=2: $got (dtrain plan's fastest runnable), run as a pipeline"
else fail "layout auto with pp=2: got '$got', plan says '$want': $(grep -m1 'layout auto\|error' "$dir/autopp.log")"; fi

# Refusals: one line naming the key, before training.
refused "the blocks mode without stages" 1 "parallel.pp_blocks needs parallel.pp >= 2" --set parallel.pp_blocks=true
refused "Top-K compression under a pipeline" 4 "parallel.compression with parallel.pp=2" --set parallel.compression=topk --set parallel.pp=2
refused "interleaved chunks that do not divide the layers" 2 "must divide model.n_layer=4" --set parallel.pp=2 \
  --set parallel.pp_schedule=interleaved --set parallel.pp_virtual=3
refused "a bad parallel.zero_reduce" 1 "parallel.zero_reduce: 'sometimes' is not one of" --set parallel.zero_reduce=sometimes
refused "a bad parallel.zero3_gather" 1 "parallel.zero3_gather: 'never' is not one of" --set parallel.zero3_gather=never
refused "more stages than layers" 4 "parallel.pp=4: more stages than layers" --set model.n_layer=2 --set parallel.pp=4

echo "test_pp: $fails failure(s)"
[ $fails -eq 0 ]
