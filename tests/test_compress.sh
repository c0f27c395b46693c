#!/usr/bin/env bash
# Gradient compression in training (parallel.compression: topk, parallel/topk.h), 2-3 ranks
# under mpiexec / dtrain launch, tiny model:
#  - compression_ratio 1 sends every element: DDP at 2 ranks, ZeRO-1 at 3 (uneven shards) and
#    hybrid ZeRO-1 on 2 simulated nodes x 2 give bitwise the losses and weights of uncompressed
#    DDP (fp32 values);
#  - Top-K 1% compresses (weights differ from DDP's), is deterministic (two runs bitwise), and
#    learns (DDP and ZeRO-1: the loss falls by > 0.5 in 50 steps); 10% ends within 5% of DDP;
#  - parallel.compression_warmup=20: the first 20 steps are DDP's bit for bit, then Top-K;
#  - resume: stop at step 25 + resume, and rank 0 killed (-9) mid-save + restart by the
#    supervisor, both bitwise the uninterrupted Top-K run (losses, weights, every optimizer
#    file, which holds each rank's residual, non-zero, and its element ages); resuming on 3
#    ranks warns that the residual starts empty and trains on;
#  - parallel.compression_adam: age (the default) keeps each rank's element ages (tensor
#    compression_age: its shard's length, whole numbers >= 1, some > 1; under DDP the same bits
#    on both ranks) in its optimizer file;
#    plain keeps none, learns too, and gives other weights; a plain checkpoint resumed with age
#    starts every age at 1;
#  - a step skipped for a NaN loss (training.nonfinite=skip) clears the residual (the
#    checkpoint of that step holds none; later ones do again), and the run goes on finite;
#  - parallel.grad_dtype=fp16 (casting): DDP == ZeRO-1/2/3 bitwise, losses within 1e-4 of fp32's,
#    weights neither fp32's nor bf16's; an fp16 overflow (loss scale 2^24) skips the step;
#  - bytes on the wire (dtrain bench, summary.comm_bytes_step, 2 ranks): fp16 half of fp32's;
#    Top-K 1% >= 50x fewer than uncompressed fp32 DDP, with fp32, bf16 and fp16 values.
set -uo pipefail
bin=$1
dir=$2
. "$(dirname "$0")/lib.sh"
fresh_dir "$dir"
mpi_env

raw16_tokens tok.bin
common=(--set model.preset= --model.n_layer 2 --model.d_model 64 --model.n_head 4 --model.vocab_size 2048
        --model.context 32 --seq 32 --batch 2 --set training.batch=12 --steps 50
        --set schedule.decay_steps=50 --set optimizer.lr=3e-3 --data tok.bin --set data.format=raw16
        --set logging.progress=lines --set checkpoint.every=5 --set checkpoint.keep_last=0)
topk=(--set parallel.compression=topk --set parallel.compression_ratio=0.01)
# run NAME RANKS [launch flags --] train flags...
run() {
  local name=$1 n=$2
  shift 2
  mkdir -p "$name"
  "$bin" launch -n "$n" "$@" --set checkpoint.dir="$name/ck" --set logging.metrics="$name/m.jsonl" \
    --save-weights "$name/w.safetensors" >"$name.log" 2>&1
}
check() { # LABEL A B TOL [losses-only]
  local out
  if out=$(cmp_runs "$2/m.jsonl" "$2/w.safetensors" "$3/m.jsonl" "$3/w.safetensors" "$4" ${5:-}); then pass "$1: $out"
  else fail "$1: $out"; fi
}
same_optim() { # RUN REF: every optimizer file of REF's last step bitwise in RUN
  local a n=0 bad=""
  for a in "$2"/ck/step-00000050/optim-*.safetensors; do
    n=$((n + 1))
    cmp -s "$a" "$1/ck/step-00000050/$(basename "$a")" || bad="$bad $(basename "$a")"
  done
  [ $n -gt 0 ] && [ -z "$bad" ] && echo "$n optimizer files bitwise" && return 0
  echo "optimizer files differ:${bad:- none found}"
  return 1
}

run ddp2 2 -- train "${common[@]}" || fail "DDP: $(tail -3 ddp2.log)"
run ddp3 3 -- train "${common[@]}" || fail "DDP x3: $(tail -3 ddp3.log)"
run all2 2 -- train "${common[@]}" --set parallel.compression=topk --set parallel.compression_ratio=1 \
  || fail "topk ratio 1: $(tail -3 all2.log)"
grep -q "Top-K 100% with error feedback" all2.log && pass "banner names Top-K" || fail "banner: $(grep rank all2.log | head -2)"
check "compression_ratio=1: DDP 2 ranks == uncompressed DDP (bitwise)" all2 ddp2 0
run all3z1 3 -- train "${common[@]}" --set parallel.strategy=zero1 --set parallel.compression=topk \
  --set parallel.compression_ratio=1 || fail "topk ratio 1 zero1: $(tail -3 all3z1.log)"
check "compression_ratio=1: ZeRO-1 3 ranks == uncompressed DDP x3 (bitwise)" all3z1 ddp3 0
# Hybrid ZeRO-1 on 2 simulated nodes x 2 (small buckets): every rank sums whole buckets, so the
# cross-node gather of the shards is skipped; still DDP x4's bits.
run ddp4 4 -- train "${common[@]}" --set training.batch=16 || fail "DDP x4: $(tail -3 ddp4.log)"
run all4h 4 --simulate-nodes 2 -- train "${common[@]}" --set training.batch=16 --set parallel.strategy=zero1 --set parallel.hybrid=true \
  --set parallel.bucket_mb=0.05 --set parallel.compression=topk --set parallel.compression_ratio=1 \
  || fail "topk ratio 1 hybrid zero1: $(tail -3 all4h.log)"
grep -q "4 rank(s) on 2 node(s)" all4h.log || fail "hybrid run not on 2 nodes: $(grep 'rank(s) on' all4h.log)"
check "compression_ratio=1: hybrid ZeRO-1 2 nodes x 2 == uncompressed DDP x4 (bitwise)" all4h ddp4 0

# Casting (parallel.grad_dtype: fp16, the 16-bit rule of comm.h in IEEE half): every strategy
# the same bits (without accumulation: ZeRO-2/3 round every micro-step's reduction), losses
# near fp32's, not bf16's.
for s in ddp zero1 zero2 zero3; do
  run h_$s 2 -- train "${common[@]}" --steps 20 --set training.batch=4 --set parallel.strategy=$s --set parallel.grad_dtype=fp16 \
    || fail "fp16 $s: $(tail -3 h_$s.log)"
  [ $s != ddp ] && check "grad_dtype=fp16: $s == DDP (bitwise)" h_$s h_ddp 0
done
run h_bf16 2 -- train "${common[@]}" --steps 20 --set training.batch=4 --set parallel.grad_dtype=bf16 || fail "bf16: $(tail -3 h_bf16.log)"
run h_fp32 2 -- train "${common[@]}" --steps 20 --set training.batch=4 || fail "fp32 20 steps: $(tail -3 h_fp32.log)"
check "grad_dtype=fp16 vs fp32 (losses)" h_ddp h_fp32 1e-4 losses-only
grep -q "gradients sent in fp16" h_ddp.log || fail "banner: $(grep 'gradients sent' h_ddp.log)"
cmp -s h_ddp/w.safetensors h_bf16/w.safetensors && fail "grad_dtype=fp16 gave bf16's weights"
cmp -s h_ddp/w.safetensors h_fp32/w.safetensors && fail "grad_dtype=fp16 gave fp32's weights: nothing was rounded"
# fp16 overflows above 65504: with a static loss scale of 2^24 the fp32 reduction is fine, the
# fp16 one gives Inf and every step is skipped as an overflow.
for gd in fp32 fp16; do
  run ov_$gd 2 -- train "${common[@]}" --steps 4 --set training.loss_scale=16777216 --set parallel.grad_dtype=$gd \
    || fail "loss scale 2^24, $gd: $(tail -3 ov_$gd.log)"
done
n32=$(grep -c '"overflow":true' ov_fp32/m.jsonl) n16=$(grep -c '"overflow":true' ov_fp16/m.jsonl)
[ "$n32" = 0 ] && [ "$n16" = 4 ] && pass "fp16 gradients overflow at a 2^24 loss scale: 4 of 4 steps skipped (fp32: $n32)" \
  || fail "fp16 overflow: overflow steps fp32 $n32 (want 0), fp16 $n16 (want 4)"

run ref 2 -- train "${common[@]}" "${topk[@]}" || fail "topk 1%: $(tail -3 ref.log)"
run ref_again 2 -- train "${common[@]}" "${topk[@]}" || fail "topk 1% again: $(tail -3 ref_again.log)"
check "Top-K 1%: deterministic (two runs bitwise)" ref_again ref 0
run refz1 2 -- train "${common[@]}" "${topk[@]}" --set parallel.strategy=zero1 || fail "topk zero1: $(tail -3 refz1.log)"
run r10 2 -- train "${common[@]}" --set parallel.compression=topk --set parallel.compression_ratio=0.1 \
  || fail "topk 10%: $(tail -3 r10.log)"
cmp -s ref/w.safetensors ddp2/w.safetensors && fail "Top-K 1% gave DDP's weights bit for bit: nothing was compressed"
run plain 2 -- train "${common[@]}" "${topk[@]}" --set parallel.compression_adam=plain || fail "topk plain: $(tail -3 plain.log)"
cmp -s ref/w.safetensors plain/w.safetensors && fail "compression_adam=plain gave age's weights bit for bit"
grep -q "Top-K 1% with error feedback, AdamW by age" ref.log && ! grep -q "AdamW by age" plain.log all2.log \
  && pass "banner names AdamW by age (not for plain or ratio 1)" || fail "banner: $(grep -h 'Top-K' ref.log plain.log | head -2)"
# 50 steps of a 230k-parameter model is where sparsification costs most (the issue's target,
# 1% within 2% after 1000 steps of the demo corpus, is tests/long/compression.sh): here 1%
# must learn (ZeRO-1 too: its buckets end at units, so its blocks and choices differ from
# DDP's), and 10% must be within 5% of DDP's final loss.
if out=$(/usr/bin/python3 - ddp2/m.jsonl ref/m.jsonl refz1/m.jsonl r10/m.jsonl plain/m.jsonl <<'PY'
import json, sys
rows = lambda p: [json.loads(l) for l in open(p) if '"loss"' in l]
d, t1, z1, t10, pl = (rows(p) for p in sys.argv[1:])
f = lambda r: r[-1]["loss"]
print("final loss: DDP %.4f, Top-K 1%% %.4f (ZeRO-1 %.4f, plain Adam %.4f; first step %.4f), 10%% %.4f (%+.2f%% of DDP's)"
      % (f(d), f(t1), f(z1), f(pl), t1[0]["loss"], f(t10), 100 * (f(t10) / f(d) - 1)))
ok = all(f(r) < r[0]["loss"] - 0.5 for r in (t1, z1, pl)) and abs(f(t10) / f(d) - 1) <= 0.05
sys.exit(0 if ok else 1)
PY
); then pass "Top-K trains: $out"; else fail "Top-K training: $out"; fi
# parallel.compression_warmup=20: steps 1-20 are reduced uncompressed, so the losses of steps
# 1-21 (21's is computed before its reduction) are DDP's, bit for bit; from step 22 on they differ.
run wu 2 -- train "${common[@]}" "${topk[@]}" --set parallel.compression_warmup=20 || fail "warm-up: $(tail -3 wu.log)"
if out=$(/usr/bin/python3 - wu/m.jsonl ddp2/m.jsonl <<'PY'
import json, sys
L = lambda p: {r["step"]: r["loss"] for r in (json.loads(l) for l in open(p)) if "loss" in r and r.get("type") != "eval"}
a, b = L(sys.argv[1]), L(sys.argv[2])
same = [s for s in sorted(a) if a[s] == b[s]]
print("steps with DDP's loss bit for bit: %s..%s (%d), final loss %.4f (DDP %.4f)" % (same[0], same[-1], len(same), a[50], b[50]))
sys.exit(0 if same == list(range(1, 22)) else 1)
PY
); then pass "compression warm-up: $out"; else fail "compression warm-up: $out"; fi
grep -Eq "memory high-water: allocator=([0-9]+) plan=\1 " wu.log || fail "warm-up: plan != allocator: $(grep -o 'memory high-water.*' wu.log)"
# The memory plan counts the residual and the message buffers: it equals the allocator.
for r in ref refz1; do
  grep -Eq "memory high-water: allocator=([0-9]+) plan=\1 " $r.log && pass "$r: plan == allocator ($(grep -o 'allocator=[0-9]* plan=[0-9]*' $r.log | head -1))" \
    || fail "$r: plan != allocator: $(grep -o 'memory high-water.*' $r.log | head -1)"
done
# The residual is in every rank's optimizer file, and is not nothing.
if out=$(/usr/bin/python3 - ref/ck/step-00000050 <<'PY'
import glob, json, struct, sys, numpy as np
n = 0
for p in sorted(glob.glob(sys.argv[1] + "/optim-rank*-of-2.safetensors")):
    b = open(p, "rb").read()
    h = struct.unpack("<Q", b[:8])[0]
    t = json.loads(b[8:8 + h])["compression_residual"]
    a = np.frombuffer(b[8 + h + t["data_offsets"][0]:8 + h + t["data_offsets"][1]], dtype=np.float32)
    nz = int(np.count_nonzero(a))
    print("%s: %d of %d residual values non-zero" % (p.split("/")[-1], nz, a.size), end="; ")
    n += nz > a.size // 2
sys.exit(0 if n == 2 else 1)
PY
); then pass "residual saved per rank: $out"; else fail "residual in the checkpoint: $out"; fi
# compression_adam: age keeps each rank's element ages beside its residual (DDP: every element;
# ZeRO-1: its shard, the length of its moments); plain keeps none.
if out=$(/usr/bin/python3 - ref/ck/step-00000050 refz1/ck/step-00000050 plain/ck/step-00000050 <<'PY'
import glob, json, struct, sys, numpy as np
def tensors(p):
    b = open(p, "rb").read()
    h = struct.unpack("<Q", b[:8])[0]
    meta = json.loads(b[8:8 + h])
    get = lambda k: np.frombuffer(b[8 + h + meta[k]["data_offsets"][0]:8 + h + meta[k]["data_offsets"][1]], dtype=np.float32)
    return meta, get
ok = True
for d, share in zip(sys.argv[1:3], (1, 2)): # DDP: every element on each rank; ZeRO-1: half each
    sizes, ages = [], []
    for p in sorted(glob.glob(d + "/optim-rank*-of-2.safetensors")):
        meta, get = tensors(p)
        n = int(meta["__metadata__"]["n_params"])
        a = get("compression_age") if "compression_age" in meta else None
        ok &= a is not None and a.size > 0 and bool(np.all(a >= 1)) and bool(np.all(a == np.round(a))) \
            and int((a > 1).sum()) > 0
        sizes.append(0 if a is None else a.size)
        ages.append(a)
        print("%s %s: %s" % (d.split("/")[0], p.split("/")[-1], "missing" if a is None else
              "%d ages, max %d, %d > 1" % (a.size, a.max(), (a > 1).sum())), end="; ")
    ok &= len(sizes) == 2 and sum(sizes) == 2 * n // share
    if share == 1: # DDP: the ages come from the summed gradient, so both ranks hold the same bits
        same = ages[0] is not None and ages[1] is not None and ages[0].tobytes() == ages[1].tobytes()
        ok &= same
        print("DDP ranks' ages %s" % ("bitwise equal" if same else "DIFFER"), end="; ")
pl = [p for p in glob.glob(sys.argv[3] + "/optim-rank*-of-2.safetensors") if "compression_age" in tensors(p)[0]]
print("plain: %d files with ages" % len(pl))
sys.exit(0 if ok and not pl else 1)
PY
); then pass "ages saved per rank: $out"; else fail "ages in the checkpoint: $out"; fi

# Stop at 25 + resume.
run stop 2 -- train "${common[@]}" "${topk[@]}" --steps 25 || fail "stop at 25: $(tail -3 stop.log)"
"$bin" launch -n 2 -- train "${common[@]}" "${topk[@]}" --resume --set checkpoint.dir=stop/ck \
  --set logging.metrics=stop/m.jsonl --save-weights stop/w.safetensors >>stop.log 2>&1 || fail "resume: $(tail -3 stop.log)"
grep -q "resumed from .*step-00000025" stop.log || fail "no resume logged: $(grep -E 'resum|error' stop.log | tail -2)"
out=$(cmp_runs stop/m.jsonl stop/w.safetensors ref/m.jsonl ref/w.safetensors 0) && out="$out; $(same_optim stop ref)" \
  && pass "Top-K: stop at 25 + resume == uninterrupted ($out)" || fail "Top-K stop/resume: $out"
# Rank 0 killed at its 40th checkpoint I/O point (mid-save), restarted by the supervisor.
DTRAIN_CKPT_FAULT=crash@40:0 run kill 2 --max-restarts 3 --backoff 0.1 -- train "${common[@]}" "${topk[@]}" \
  || fail "Top-K with a crash mid-save: $(tail -3 kill.log)"
grep -q "killed by signal 9" kill.log && grep -q "job finished after 1 restart" kill.log \
  || fail "crash mid-save not reported/restarted: $(grep 'dtrain launch' kill.log | tail -3)"
out=$(cmp_runs kill/m.jsonl kill/w.safetensors ref/m.jsonl ref/w.safetensors 0) && out="$out; $(same_optim kill ref)" \
  && pass "Top-K: kill -9 mid-save + restart == uninterrupted ($out)" || fail "Top-K kill/resume: $out"
# A checkpoint written with compression_adam=plain (no ages) resumed with age: the residual
# comes back, the ages start at 1 (so after 25 more steps none exceeds 26), and it trains on.
mkdir -p pa && cp -r plain/ck pa/ck && rm -rf pa/ck/step-000000[3-5]* && echo step-00000025 >pa/ck/latest
if "$bin" launch -n 2 -- train "${common[@]}" "${topk[@]}" --resume --set checkpoint.dir=pa/ck \
     --set logging.metrics=pa/m.jsonl >pa.log 2>&1 && grep -q "resumed from .*step-00000025" pa.log \
   && out=$(/usr/bin/python3 - pa/ck/step-00000050 <<'PY'
import glob, json, struct, sys, numpy as np
m = []
for p in sorted(glob.glob(sys.argv[1] + "/optim-rank*-of-2.safetensors")):
    b = open(p, "rb").read()
    h = struct.unpack("<Q", b[:8])[0]
    t = json.loads(b[8:8 + h])["compression_age"]
    m.append(int(np.frombuffer(b[8 + h + t["data_offsets"][0]:8 + h + t["data_offsets"][1]], dtype=np.float32).max()))
print("oldest age at step 50 per rank: %s" % m)
sys.exit(0 if len(m) == 2 and max(m) == 26 else 1)
PY
); then pass "plain checkpoint resumed with age: $out"; else fail "plain -> age resume: $out $(grep -E 'error' pa.log | tail -2)"; fi
# Another world size: the residual (per rank) starts empty, with a warning.
mkdir -p w3 && cp -r stop/ck w3/ck && rm -rf w3/ck/step-000000[3-5]* && echo step-00000025 >w3/ck/latest
"$bin" launch -n 3 -- train "${common[@]}" "${topk[@]}" --resume --set checkpoint.dir=w3/ck \
  --set logging.metrics=w3/m.jsonl >w3.log 2>&1 && grep -q "written by another number of ranks (the residual is per rank), so parallel.compression=topk starts with an empty residual" w3.log \
  && pass "resume on 3 ranks: $(grep -o 'warning.*' w3.log | head -1 | cut -c1-150)" || fail "resume on 3 ranks: $(grep -E 'warn|error' w3.log | tail -2)"

# A NaN loss on rank 1 at step 3 (test aid), skipped (training.nonfinite=skip): the residual is
# cleared on every rank, so the checkpoint of step 3 holds none, and the run goes on finite.
residual_nonzero() { # STEP_DIR: the non-zero residual values of each rank's file
  /usr/bin/python3 - "$1" <<'PY'
import glob, json, struct, sys, numpy as np
for p in sorted(glob.glob(sys.argv[1] + "/optim-rank*-of-2.safetensors")):
    b = open(p, "rb").read()
    h = struct.unpack("<Q", b[:8])[0]
    t = json.loads(b[8:8 + h])["compression_residual"]
    a = np.frombuffer(b[8 + h + t["data_offsets"][0]:8 + h + t["data_offsets"][1]], dtype=np.float32)
    print(int(np.count_nonzero(a)), end=" ")
PY
}
DTRAIN_TEST_NAN=3:1 run nan 2 -- train "${common[@]}" "${topk[@]}" --steps 6 --set checkpoint.every=3 \
  --set training.nonfinite=skip || fail "nan skip: $(tail -3 nan.log)"
nz3=$(residual_nonzero nan/ck/step-00000003) nz6=$(residual_nonzero nan/ck/step-00000006)
if out=$(/usr/bin/python3 - nan/m.jsonl <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
sk = [r["step"] for r in rows if r.get("skipped")]
print("skipped steps %s, final loss %.4f" % (sk, rows[-1]["loss"]))
sys.exit(0 if sk == [3] and math.isfinite(rows[-1]["loss"]) and len(rows) == 6 else 1)
PY
) && [ "$nz3" = "0 0 " ] && [ "${nz6%% *}" -gt 0 ]; then
  pass "non-finite step with Top-K: $out; residual non-zero values after step 3: $nz3, after step 6: $nz6"
else fail "non-finite step with Top-K: $out; residual non-zero after step 3: '$nz3' (want 0 0), step 6: '$nz6'"; fi

# Bytes on the wire, as dtrain bench counts them.
for x in none fp16 topk topk_bf16 topk_fp16; do
  args=(); [[ $x == topk* ]] && args=("${topk[@]}")
  case $x in *bf16) args+=(--set parallel.grad_dtype=bf16) ;; *fp16) args+=(--set parallel.grad_dtype=fp16) ;; esac
  timeout 120 "${mpi[@]}" -n 2 "$bin" bench "${common[@]}" "${args[@]}" --set checkpoint.every=0 --warmup-steps 1 \
    --bench-steps 2 --peak 100 --json "bench_$x.json" >"bench_$x.log" 2>&1 || fail "bench $x: $(tail -2 "bench_$x.log")"
done
if out=$(/usr/bin/python3 - <<'PY'
import json, sys
b = {x: json.load(open("bench_%s.json" % x))["summary"]["comm_bytes_step"] for x in ("none", "fp16", "topk", "topk_bf16", "topk_fp16")}
print("bytes per step, rank 0: fp32 DDP %d, fp16 %d (%.4f), Top-K 1%% %d (%.1fx), with bf16 values %d (%.1fx), fp16 values %d (%.1fx)"
      % (b["none"], b["fp16"], b["fp16"] / b["none"], b["topk"], b["none"] / b["topk"], b["topk_bf16"], b["none"] / b["topk_bf16"],
         b["topk_fp16"], b["none"] / b["topk_fp16"]))
sys.exit(0 if all(b["none"] >= 50 * b[x] for x in ("topk", "topk_bf16", "topk_fp16")) and abs(b["fp16"] / b["none"] - 0.5) <= 0.005 else 1)
PY
); then pass "Top-K 1% cuts the bytes >= 50x: $out"; else fail "Top-K bytes: $out"; fi

echo "test_compress: $fails failure(s)"
[ $fails -eq 0 ]
