#!/usr/bin/env bash
# Tensor parallelism on larger matrices (make test-long; tests/test_tp.sh is the short suite):
# tp = 4 on 4 ranks of one simulated node, each against the blocks test mode (one process
# running the 4 shards' arithmetic), bitwise over 20 AdamW steps - losses and gradient norms:
#  - gpt2, 4 layers of width 256 (8 heads, 2 per rank), vocabulary 4000 (padded to 4096 = 128 x
#    4), fp32; and against plain tp = 1 within 1e-5 (the same model summed in another order);
#  - the same with sequence parallelism in bf16 and selective activation checkpointing;
#  - llama with grouped-query attention (8 query heads, 4 key/value heads: one group of 2 per
#    rank), d_ff 512, sequence parallelism, fp16 with dynamic loss scaling;
#  - LoRA on every llama projection under tp 4;
#  - tp 2 x dp 2 with ZeRO-3 and sequence parallelism, gpt2 at width 256, == blocks x dp 2 with
#    DDP (clipping that does not bind: decision 62).
#   tests/long/tp.sh BIN DIR
set -uo pipefail
bin=$1
dir=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$src/tests/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
start=$(date +%s)
mpi_env
mpi+=(-x DTRAIN_NODE_ID)
. "$src/tests/tp_lib.sh"
export PPN=4 # one node: a TP group of 4 stays inside it

gpt=(--set model.preset= --model.n_layer 4 --model.d_model 256 --model.n_head 8 --model.vocab_size 4000
     --model.context 64 --seq 64)
llama=(--set model.preset=llama-tiny --model.n_layer 4 --model.d_model 256 --model.n_head 8 --set model.n_kv_head=4
       --set model.d_ff=512 --seq 64)
train=(--batch 4 --steps 20 --lr 1e-3 --warmup 3 --seed 5 --set optimizer.grad_clip=100
       --set logging.progress=lines --set logging.every=1)
model=("${gpt[@]}")
tp4=(--set parallel.tp=4)
blk=(--set parallel.tp_blocks=true)

run plain 1
run blocks 1 "${tp4[@]}" "${blk[@]}"
run tp4 4 "${tp4[@]}"
check "gpt2 width 256, tp 4 on 4 ranks == blocks mode, bitwise" tp4 blocks bitwise
check "gpt2 width 256, tp 4 vs plain tp 1" tp4 plain 1e-5

sp=("${tp4[@]}" --set parallel.sequence_parallel=true --set training.precision=bf16
    --set memory.activation_checkpointing=selective)
run sp_blocks 1 "${sp[@]}" "${blk[@]}"
run sp_tp4 4 "${sp[@]}"
check "gpt2 tp 4, sequence parallel, bf16, selective checkpointing == blocks mode, bitwise" sp_tp4 sp_blocks bitwise

model=("${llama[@]}")
ll=("${tp4[@]}" --set parallel.sequence_parallel=true --set training.precision=fp16)
run llama_blocks 1 "${ll[@]}" "${blk[@]}"
run llama_tp4 4 "${ll[@]}"
check "llama GQA (8 heads, 4 kv heads) tp 4, sequence parallel, fp16 loss scaling == blocks mode, bitwise" \
  llama_tp4 llama_blocks bitwise
lo=("${tp4[@]}" --set lora.rank=8 --set lora.targets=q,k,v,o,gate,up,down --set lora.dropout=0.1)
run lora_blocks 1 "${lo[@]}" "${blk[@]}"
run lora_tp4 4 "${lo[@]}"
check "llama LoRA on every projection, tp 4 == blocks mode, bitwise" lora_tp4 lora_blocks bitwise

model=("${gpt[@]}")
export PPN=2 # 2 nodes of a TP pair each
z3=(--set parallel.tp=2 --set parallel.sequence_parallel=true)
run z3_blocks 2 "${z3[@]}" "${blk[@]}"
run z3_tp2dp2 4 "${z3[@]}" --set parallel.strategy=zero3
check "gpt2 width 256, tp 2 x dp 2 ZeRO-3 + sequence parallel (2 nodes) == blocks x dp 2 ddp, bitwise" z3_tp2dp2 z3_blocks bitwise

echo "long/tp: $fails failure(s) in $(($(date +%s) - start)) s"
[ $fails -eq 0 ]
