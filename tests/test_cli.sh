#!/usr/bin/env bash
# The dtrain binary end to end: help and version, bad shapes and flags refused with one
# line naming the key and exit code 2, two identical runs give bitwise-identical losses and
# weights, a bad token file is refused naming the file, bench prints MFU and the breakdown.
set -uo pipefail
bin=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
export OMP_NUM_THREADS=2
. "$(dirname "$0")/lib.sh"

# expect_refused NAME EXPECTED_TEXT ARGS... : exit 2, one error line containing the text.
expect_refused() {
  local name=$1 text=$2; shift 2
  "$bin" "$@" >"$dir/out" 2>"$dir/err"; local rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$text" "$dir/err" && [ "$(wc -l <"$dir/err")" -eq 1 ]; then
    pass "$name: $(cat "$dir/err")"
  else
    fail "$name (rc=$rc, stderr: $(cat "$dir/err"))"
  fi
}

out_has "^dtrain " "$bin" --version && pass "--version" || fail "--version"
out_has "model.n_layer" "$bin" train --help && pass "train --help lists keys" || fail "train --help"
expect_refused "heads not dividing d_model" "model.n_head" train --set model.n_head=5
expect_refused "zero layers" "model.n_layer" train --model.n_layer 0
expect_refused "context above preset max" "model.context" train --model gpt2 --set model.context=2048
expect_refused "seq above context" "training.seq_len" train --seq 65
expect_refused "misspelt key" "model.n_layer" train --set model.nlayer=3
expect_refused "bad number" "optimizer.lr" train --lr fast
expect_refused "unknown precision" "training.precision" train --set training.precision=fp8
expect_refused "bad checkpointing mode" "memory.activation_checkpointing" train --set memory.activation_checkpointing=some
expect_refused "checkpointing interval 0" "memory.activation_checkpointing_every" train --set memory.activation_checkpointing_every=0
expect_refused "negative fused-loss block" "memory.fused_loss_rows" train --set memory.fused_loss_rows=-1
expect_refused "fused loss not a boolean" "memory.fused_loss" train --set memory.fused_loss=maybe
expect_refused "negative loss scale" "training.loss_scale" train --set training.loss_scale=-2
expect_refused "bad gradient dtype" "parallel.grad_dtype" train --set parallel.grad_dtype=fp8
expect_refused "unknown compression" "parallel.compression" train --set parallel.compression=zstd
expect_refused "compression ratio 0" "parallel.compression_ratio must be in (0, 1]" train --set parallel.compression=topk --set parallel.compression_ratio=0
expect_refused "compression ratio above 1" "parallel.compression_ratio must be in (0, 1]" train --set parallel.compression_ratio=1.5
expect_refused "negative compression warm-up" "parallel.compression_warmup must be >= 0" train --set parallel.compression_warmup=-1
expect_refused "unknown compression_adam" "parallel.compression_adam" train --set parallel.compression_adam=lazy
expect_refused "Top-K with ZeRO-2" "parallel.compression=topk works with parallel.strategy ddp or zero1 only" train --set parallel.compression=topk --set parallel.strategy=zero2
expect_refused "Top-K with FULL_SHARD" "parallel.compression=topk works with parallel.strategy ddp or zero1 only (full_shard" train --set parallel.compression=topk --set parallel.strategy=full_shard
expect_refused "unknown flag" "--frobnicate" train --frobnicate
expect_refused "unknown preset" "model.preset" train --model gpt5
expect_refused "warmup beyond decay" "schedule.decay_steps" train --steps 5 --warmup 5
expect_refused "flag without a value before another flag" "flag --lr needs a value (got the flag '--steps'" train --lr --steps 3
expect_refused "eval without a checkpoint" "the first argument must be the CHECKPOINT, got '--data.val'" eval --data.val x.bin
expect_refused "eval without arguments" "the first argument must be the CHECKPOINT" eval
expect_refused "config without a subcommand" "expected 'show' or 'keys'" config
expect_refused "unknown command" "unknown command 'trian'" trian
expect_refused "sample temperature" "--temperature must be >= 0" sample x --temperature -1
expect_refused "sample max-tokens" "--max-tokens must be in" sample x --max-tokens 0
expect_refused "eval_batches below 0" "training.eval_batches must be >= 0" train --set training.eval_batches=-1
out_has "^usage: dtrain config show" "$bin" config --help && pass "config --help: usage on stdout, exit 0" || fail "config --help"
# --help shows defaults as written, not as float noise (0.000600000028).
out_has "optimizer.lr +0.0006 " "$bin" train --help && ! out_has "0\.[0-9]*0000[0-9]{2}" "$bin" train --help \
  && pass "--help prints 0.0006, 0.9, 0.95" || fail "--help float noise: $("$bin" train --help | grep optimizer.lr)"
# Metrics go next to the checkpoints by default, never into the working directory.
mkdir -p "$dir/cwd" && (cd "$dir/cwd" && "$bin" train --steps 2 --set checkpoint.dir=ck >/dev/null 2>&1 \
  && "$bin" train --steps 2 >/dev/null 2>&1)
[ "$(last_step "$dir/cwd/ck/metrics.jsonl")" = 2 ] && [ "$(ls "$dir/cwd")" = ck ] \
  && pass "logging.metrics auto: checkpoint.dir/metrics.jsonl; nothing else in the working directory" \
  || fail "default metrics path: $(ls -R "$dir/cwd" | head -5)"
# A run that cannot fit in memory fails before allocating, in well under a second, naming
# the need, what the host has and the keys (1 GiB available, gpt2 at micro-batch 64 x 1024).
start=$(date +%s%N)
err=$(DTRAIN_MEM_AVAILABLE=1073741824 "$bin" train --model gpt2 --batch 64 --seq 1024 2>&1 >/dev/null); rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ $rc = 1 ] && [ "$(echo "$err" | wc -l)" = 1 ] && [[ $err == *"memory: each rank needs at least"* ]] \
  && [[ $err == *"training.micro_batch 64"* && $err == *"1.0 GiB available"* ]] && [ $ms -lt 1000 ] \
  && pass "too big for memory: refused in ${ms} ms: $err" || fail "memory check (rc $rc, ${ms} ms): $err"
# Loss spikes (training.spike_factor, default 3): step 30's loss made 100x larger (test aid) is
# reported once, in the log and the metrics; the same run without it reports none.
DTRAIN_TEST_SPIKE=30:0 "$bin" train --steps 40 --set logging.metrics="$dir/spike.jsonl" >"$dir/spike.log" 2>&1; rc=$?
"$bin" train --steps 40 --set logging.metrics="$dir/nospike.jsonl" >"$dir/nospike.log" 2>&1; rc2=$?
[ $rc = 0 ] && [ $rc2 = 0 ] && [ "$(grep -c '"type":"spike"' "$dir/spike.jsonl")" = 1 ] \
  && grep -q '"type":"spike","step":30,' "$dir/spike.jsonl" && grep -q "loss spike at step 30" "$dir/spike.log" \
  && ! grep -q '"type":"spike"' "$dir/nospike.jsonl" \
  && pass "loss spike at step 30 reported (log + metrics), none without it" \
  || fail "spike detection (rc $rc/$rc2): $(grep -h spike "$dir/spike.jsonl" "$dir/spike.log" | head -3)"
# training.spike_rollback: the spike at step 30 sends the run back to the checkpoint of step
# 20 and past the batches of steps 21-30: after the rollback, step 21 reads what an
# uninterrupted run reads at step 31 (the ledger shows it), the rollback is in the log and the
# metrics, the run finishes its 40 steps; without checkpoint.dir the key is refused.
/usr/bin/python3 -c "
import numpy as np
np.random.default_rng(3).integers(0, 256, 4000 * 64 + 1, dtype=np.uint16).tofile('$dir/rb.bin')"
rb=(--steps 40 --data "$dir/rb.bin" --set data.format=raw16 --set checkpoint.every=10)
"$bin" train "${rb[@]}" --set checkpoint.dir="$dir/rb_ref" --set data.ledger="$dir/rb_ref.ledger" >"$dir/rb_ref.log" 2>&1
DTRAIN_TEST_SPIKE=30:0 "$bin" train "${rb[@]}" --set checkpoint.dir="$dir/rb" --set training.spike_rollback=1 \
  --set data.ledger="$dir/rb.ledger" --set logging.metrics="$dir/rb.jsonl" >"$dir/rb.log" 2>&1; rc=$?
ids() { awk -v s="$2" -v n="$3" '$1 == s { c++; if (c == n) { $1 = ""; $2 = ""; print } }' "$1"; }
if [ $rc = 0 ] && grep -q '"type":"rollback","step":30,.*"to_step":20,"skipped_samples":40' "$dir/rb.jsonl" \
   && grep -q "back to the checkpoint of step 20" "$dir/rb.log" && [ -n "$(ids "$dir/rb_ref.ledger.rank0" 31 1)" ] \
   && [ "$(ids "$dir/rb.ledger.rank0" 21 2)" = "$(ids "$dir/rb_ref.ledger.rank0" 31 1)" ] \
   && [ "$(ids "$dir/rb.ledger.rank0" 21 1)" = "$(ids "$dir/rb_ref.ledger.rank0" 21 1)" ] \
   && grep -q "step 40/40" "$dir/rb.log"; then
  pass "spike rollback: back to step 20, batches of steps 21-30 skipped (the new step 21 reads step 31's), 40 steps done"
else
  fail "spike rollback (rc $rc): $(grep -h -E 'rollback|error' "$dir/rb.jsonl" "$dir/rb.log" | head -3)"
fi
err=$("$bin" train --steps 5 --set training.spike_rollback=1 2>&1); rc=$?
[ $rc = 2 ] && [[ $err == *"training.spike_rollback needs checkpoint.dir"* ]] && pass "spike_rollback without checkpoints refused: $err" \
  || fail "spike_rollback config (rc $rc): $err"
# prepare --out into a folder that does not exist yet makes it.
echo "hello world" >"$dir/t.txt"
"$bin" prepare --out "$dir/new/sub/x" "$dir/t.txt" >/dev/null 2>&1 && [ -s "$dir/new/sub/x_train_000000.bin" ] \
  && pass "prepare --out into a missing folder creates it" || fail "prepare --out missing folder"

# A token file with a bad magic is refused naming the file (exit 1: a data error).
printf 'not a shard at all, definitely not 1024 bytes long' >"$dir/bad.bin"
"$bin" train --data "$dir/bad.bin" >"$dir/out" 2>"$dir/err"; rc=$?
if [ $rc -eq 1 ] && grep -q "bad.bin" "$dir/err"; then pass "bad shard: $(cat "$dir/err")"; else fail "bad shard (rc=$rc)"; fi

# Determinism through the CLI: same seed => identical loss lines and weight files.
args=(train --steps 20 --set logging.every=1 --seed 7)
"$bin" "${args[@]}" --save-weights "$dir/w1.safetensors" >"$dir/run1" 2>&1 || fail "run 1"
"$bin" "${args[@]}" --save-weights "$dir/w2.safetensors" >"$dir/run2" 2>&1 || fail "run 2"
grep -o "loss [0-9.]*" "$dir/run1" >"$dir/l1"; grep -o "loss [0-9.]*" "$dir/run2" >"$dir/l2"
if [ "$(wc -l <"$dir/l1")" -eq 20 ] && cmp -s "$dir/l1" "$dir/l2" && cmp -s "$dir/w1.safetensors" "$dir/w2.safetensors"; then
  pass "two 20-step runs: identical losses and weights"
else
  fail "determinism"
fi

# A token shard (llm.c format, version 1) is read and trained on.
/usr/bin/python3 - "$dir/ok.bin" <<'PY'
import struct, sys
toks = [(i * 7 + i // 13) % 256 for i in range(5000)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
    f.write(struct.pack("<%dH" % len(toks), *toks))
PY
"$bin" train --data "$dir/ok.bin" --steps 3 >"$dir/out" 2>&1 && grep -q "step 3/3" "$dir/out" \
  && pass "trains on an llm.c shard" || fail "shard training: $(cat "$dir/out")"

# The live status line (forced; a terminal gets it by default): carriage returns, ETA, MFU.
"$bin" train --steps 3 --set logging.progress=bar --set logging.peak_gflops=100 \
  --set logging.metrics="$dir/m.jsonl" >"$dir/bar" 2>&1
if grep -q $'\r' "$dir/bar" && grep -q "ETA" "$dir/bar" && grep -q "MFU" "$dir/bar" && [ "$(wc -l <"$dir/m.jsonl")" -eq 3 ]; then
  pass "live status line and JSONL"
else
  fail "status line: $(cat -A "$dir/bar" | head -3)"
fi

# Bench: a table with MFU and the per-kernel breakdown.
"$bin" bench --warmup-steps 1 --bench-steps 2 --peak 100 >"$dir/bench" 2>&1
if grep -q "MFU_%" "$dir/bench" && grep -q "attention" "$dir/bench" && grep -q "loss_hash" "$dir/bench"; then
  pass "bench prints MFU and breakdown"
else
  fail "bench: $(cat "$dir/bench")"
fi

# Mixed precision without 16-bit dot products (a forced AVX2 path, as on an AVX2-only EPYC):
# bf16 still trains, on operands widened to fp32, and the banner says the speed-up is missing;
# with them (this CPU's best path, when it has AVX512_BF16) the banner says native.
DTRAIN_ISA=avx2 "$bin" train --steps 2 --set training.precision=bf16 --set logging.metrics= >"$dir/bf16_avx2" 2>&1
if grep -q "precision bf16: matmuls on 16-bit operands widened to fp32 (the speed-up is not available on this CPU)" "$dir/bf16_avx2" &&
   grep -q "step 2/2" "$dir/bf16_avx2"; then
  pass "bf16 on a CPU path without bf16 dot products: trains, banner says widened"
else
  fail "bf16 on avx2: $(tail -3 "$dir/bf16_avx2")"
fi
if grep -q -w avx512_bf16 /proc/cpuinfo; then
  # the 16-bit engine rule (isa.h): native, except on Intel cores without AMX-BF16, where
  # oneDNN's bf16 matmul runs at half the fp32 rate; DTRAIN_LOWP_GEMM=native forces it
  want=native
  grep -q -m1 'vendor_id.*GenuineIntel' /proc/cpuinfo && ! grep -q -w amx_bf16 /proc/cpuinfo && want=widened
  "$bin" train --steps 2 --set training.precision=bf16 --set logging.metrics= >"$dir/bf16_rule" 2>&1
  DTRAIN_LOWP_GEMM=native "$bin" train --steps 2 --set training.precision=bf16 --set logging.metrics= >"$dir/bf16_native" 2>&1
  if { [ $want = native ] && grep -q "precision bf16: matmuls on native 16-bit instructions" "$dir/bf16_rule"; } ||
     { [ $want = widened ] && grep -q "precision bf16: matmuls on 16-bit operands widened to fp32" "$dir/bf16_rule"; }; then
    pass "bf16 on an AVX512_BF16 CPU: the rule's engine ($want)"
  else fail "bf16 engine by rule (want $want): $(grep precision "$dir/bf16_rule")"; fi
  grep -q "precision bf16: matmuls on native 16-bit instructions" "$dir/bf16_native" && grep -q "step 2/2" "$dir/bf16_native" &&
    pass "bf16 with DTRAIN_LOWP_GEMM=native: native GEMMs" || fail "bf16 native forced: $(grep precision "$dir/bf16_native")"
fi
DTRAIN_LOWP_GEMM=fast "$bin" train --steps 2 >"$dir/lowp_bad" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "DTRAIN_LOWP_GEMM=fast: unknown 16-bit matmul engine" "$dir/lowp_bad" &&
  pass "DTRAIN_LOWP_GEMM=fast refused (rc $rc)" || fail "bad DTRAIN_LOWP_GEMM (rc $rc): $(tail -1 "$dir/lowp_bad")"

echo "test_cli: $fails failure(s)"
[ $fails -eq 0 ]
