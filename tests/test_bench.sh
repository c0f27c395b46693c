#!/bin/bash
# dtrain bench end to end on a tiny model (few steps; no timing is checked): tables, JSON
# whose keys are exactly those of docs/FORMATS.md "Bench results (JSON)", CSV, cost, a
# Chrome trace that parses and nests per (pid, tid), 2 ranks under mpiexec, a sweep over
# world and strategy, the batch finder, bench comm --json (rows the median call), bench_memcpy
# (bench/shm.sh's yardstick), one-line usage errors (exit 2).
set -u
bin=$1 dir=$2 src=$3 memcpy_bin=$4
. "$src/tests/lib.sh"
fresh_dir "$dir"
mpi_env
export OMPI_MCA_rmaps_base_oversubscribe=1
tiny=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.vocab_size=64
      --set model.context=16 --set training.seq_len=16 --set training.micro_batch=2)
# --peak far above any CPU: MFU is always computed (the unknown case has its own run below)
fast=(--warmup-steps 1 --bench-steps 3 --peak 100000)
check=$src/tests/check_bench.py

# One rank, 2 repeats: tables, equal hashes, JSON keys, CSV, cost, trace.
"$bin" bench "${tiny[@]}" "${fast[@]}" --repeats 2 --json one.json --csv one.csv --trace one.trace.json \
  --prices "$src/configs/prices.yaml" --instance all --train-tokens 1e9 >one.log 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "^# Training Summary" one.log && grep -q "equal across repeats" one.log \
   && grep -q "^# MFU = (6 N + 12 L T d)" one.log && grep -q "^  idle/other" one.log \
   && grep -q "^  p4d.24xlarge" one.log && ! grep -q MISMATCH one.log; then
  pass "bench: tables, Training Summary, equal loss hashes over 2 repeats, cost rows"
else
  fail "bench (rc $rc): $(tail -5 one.log)"
fi
if out=$(python3 "$check" keys one.json "$src/docs/FORMATS.md" 2>&1); then pass "JSON keys = documented keys ($out)"; else fail "JSON keys: $out"; fi
if out=$(python3 "$check" run one.json 1 2 3 2>&1); then pass "JSON values consistent ($out)"; else fail "JSON values: $out"; fi
if [ "$(wc -l <one.csv)" -eq 2 ] && head -1 one.csv | grep -q "^id,kind,preset,world" \
   && [ "$(head -1 one.csv | tr , '\n' | wc -l)" -eq "$(tail -1 one.csv | python3 -c 'import csv,sys; print(len(next(csv.reader(sys.stdin))))')" ]; then
  pass "CSV: header + one row, same column count"
else
  fail "CSV: $(cat one.csv)"
fi
if out=$(python3 "$check" trace one.trace.json 1 2>&1); then pass "trace (1 rank): $out"; else fail "trace (1 rank): $out"; fi

# A peak below what the steps reach (--peak 0.001 GFLOP/s, as a start-up measurement on a busy
# machine can be): MFU is unknown (null, said why), never above 100%.
"$bin" bench "${tiny[@]}" --warmup-steps 1 --bench-steps 3 --repeats 1 --peak 0.001 --json low.json >low.log 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "^# MFU unknown: a step ran at .* GFLOP/s per rank, above the peak 0.0 it is relative to" low.log \
   && ! grep -q "^  MFU " low.log && out=$(python3 "$check" run low.json 1 1 3 2>&1) &&
   python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; assert s["mfu"] is None and "above the peak 0.001" in s["mfu_unknown"], s' low.json; then
  pass "bench --peak below the steps' rate: MFU unknown, not above 100% ($out)"
else
  fail "bench low peak (rc $rc): $(grep -i mfu low.log | head -3) ${out:-}"
fi

# Two ranks, ZeRO-3: every rank's memory, a merged trace with the comm thread's tasks.
timeout 120 "${mpi[@]}" -n 2 "$bin" bench "${tiny[@]}" "${fast[@]}" --repeats 2 --set parallel.strategy=zero3 \
  --json two.json --trace two.trace.json >two.log 2>&1
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '^# Training Summary' two.log)" -eq 1 ] && ! grep -q MISMATCH two.log; then
  pass "bench under mpiexec -n 2 (zero3): one table, equal hashes"
else
  fail "bench -n 2 (rc $rc): $(tail -5 two.log)"
fi
if out=$(python3 "$check" run two.json 2 2 3 2>&1); then pass "JSON (2 ranks): $out"; else fail "JSON (2 ranks): $out"; fi
if out=$(python3 "$check" trace two.trace.json 2 comm 2>&1) && ! ls two.trace.json.rank* >/dev/null 2>&1; then
  pass "trace (2 ranks, merged): $out"
else
  fail "trace (2 ranks): $out"
fi

# Sweep: world 1,2 x ddp,zero1 through dtrain launch, one JSON per point, CSV, efficiency.
timeout 200 "$bin" bench "${tiny[@]}" "${fast[@]}" --repeats 1 --sweep world=1,2 strategy=ddp,zero1 \
  --json sweep/s.json --csv sweep.csv >sweep.log 2>&1 # sweep/ does not exist: every point must fail
rc=$?
if [ $rc -eq 1 ] && grep -q "4 of 4 point(s) failed" sweep.log; then pass "sweep: failing points reported, exit 1"; else fail "sweep failure (rc $rc): $(tail -3 sweep.log)"; fi
mkdir -p sweep
timeout 200 "$bin" bench "${tiny[@]}" "${fast[@]}" --repeats 1 --sweep world=1,2 strategy=ddp,zero1 \
  --json sweep/s.json --csv sweep.csv >sweep.log 2>&1
rc=$?
if [ $rc -eq 0 ] && [ "$(ls sweep/s.*.json | wc -l)" -eq 4 ] && [ "$(wc -l <sweep.csv)" -eq 5 ] \
   && out=$(python3 "$check" sweep sweep/s.world2-strategyzero1.json "$src/docs/FORMATS.md" 2>&1); then
  pass "sweep: 4 points, 4 JSON files, CSV rows, efficiency vs world 1 ($out)"
else
  fail "sweep (rc $rc): $(tail -5 sweep.log) ${out:-}"
fi
# The same global batch at every world size: strong scaling (training.batch).
timeout 200 "$bin" bench "${tiny[@]}" "${fast[@]}" --repeats 1 --set training.batch=4 --sweep world=1,2 \
  --json strong.json >strong.log 2>&1
if [ $? -eq 0 ] && python3 -c "
import json,sys; a=json.load(open('strong.world2.json')); b=json.load(open('strong.world1.json'))
s=a['sweep']; assert s['weak_efficiency'] is None and s['strong_efficiency'] > 0, s
assert a['parallel']['global_batch']==b['parallel']['global_batch']==4 and a['parallel']['accum']==1 and b['parallel']['accum']==2
assert a['summary']['loss_hash']==b['summary']['loss_hash'], 'same global batch: bitwise equal losses'"; then
  pass "sweep with training.batch: strong efficiency, same losses at world 1 and 2"
else
  fail "strong sweep: $(tail -3 strong.log)"
fi

# Every family: llama and vit bench runs; a vit run counts images (table and report), and the
# batch finder plans its memory.
"$bin" bench --set model.preset=llama-tiny --set training.micro_batch=2 "${fast[@]}" --repeats 1 \
  --json llama.json >llama.log 2>&1 && grep -q "^  rmsnorm" llama.log && grep -q "^  rope" llama.log \
  && pass "bench llama-tiny: rmsnorm, rope and swiglu kernels in the table" || fail "bench llama: $(tail -3 llama.log)"
"$bin" bench --set model.preset=vit-tiny --set training.micro_batch=4 "${fast[@]}" --repeats 1 \
  --json vit.json >vit.log 2>&1
if [ $? -eq 0 ] && grep -q "^  images/s  " vit.log && grep -q "^# MFU = FLOP/image" vit.log \
   && grep -q "images/s (global)" vit.log && out=$(python3 "$check" run vit.json 1 1 3 2>&1) \
   && "$bin" report vit.json one.json -o vit.html >vit_report.log 2>&1 && grep -q "images/s</td>" vit.html; then
  pass "bench vit-tiny: images/s rows, FLOP/image, JSON consistent, the report counts images ($out)"
else
  fail "bench vit: $(tail -3 vit.log) $(tail -2 vit_report.log 2>/dev/null)"
fi
# A sweep of each new family at the same global batch: world 1 and 2 give bitwise the same
# losses (llama-tiny: tokens; vit-tiny: images).
for fam in llama vit; do
  timeout 200 "$bin" bench --set model.preset=$fam-tiny "${fast[@]}" --repeats 1 --set training.batch=4 \
    --set training.micro_batch=2 --sweep world=1,2 --json sw_$fam.json >sw_$fam.log 2>&1
  if [ $? -eq 0 ] && python3 -c "
import json; a=json.load(open('sw_$fam.world2.json')); b=json.load(open('sw_$fam.world1.json'))
assert a['summary']['loss_hash']==b['summary']['loss_hash'] and a['sweep']['strong_efficiency'] > 0"; then
    pass "sweep of $fam-tiny over world 1,2 (global batch 4): same losses, strong efficiency"
  else
    fail "sweep $fam: $(tail -3 sw_$fam.log)"
  fi
done
"$bin" bench --set model.preset=vit-tiny --find-batch --mem-budget 40M >vitfind.log 2>&1
if [ $? -eq 0 ] && grep -q "^micro_batch=[0-9]" vitfind.log; then
  pass "find-batch for vit: $(grep '^# picked' vitfind.log | sed 's/^# //')"
else
  fail "find-batch vit: $(tail -3 vitfind.log)"
fi

# Stragglers in bench and report: rank 1's forward is 200 ms slower per micro-step (test aid
# DTRAIN_TEST_SLOW=RANK:MS); the bench names it, the JSON holds every rank's compute time, the
# report lists it; a run where every rank has the same delay names nobody. The delay, a sleep,
# dominates the model's compute (measured 5 to 22 ms per step on a host loaded 6x its cores),
# so no verdict depends on the host's speed or load: rank 1 is named unless rank 0 computes
# over 130 ms per step, its JSON compute time exceeds rank 0's by 100 ms unless rank 0 computes
# 100 ms more than rank 1, and the even run names nobody unless one rank computes 100 ms more
# than 1.5x the other (logging.straggler_factor 1.5).
strag=(--set model.n_layer=2 --set model.d_model=128 --set model.n_head=4 --set model.vocab_size=256
       --set model.context=64 --set training.seq_len=64 --set training.micro_batch=4 --warmup-steps 2
       --bench-steps 10 --peak 10)
# Each rank's own DTRAIN_TEST_SLOW (RANK:MS names one rank): every rank delayed alike.
every_rank_slow=(bash -c 'DTRAIN_TEST_SLOW=$OMPI_COMM_WORLD_RANK:200 exec "$0" "$@"')
# Both runs must succeed and write both ranks' results: "nobody named" in a run that failed
# (or a JSON left by an earlier run) would prove nothing.
rm -f slow.json even.json
DTRAIN_TEST_SLOW=1:200 timeout 120 "${mpi[@]}" -x DTRAIN_TEST_SLOW -n 2 "$bin" bench "${strag[@]}" \
  --repeats 1 --json slow.json >slow.log 2>&1
rc_slow=$?
timeout 120 "${mpi[@]}" -n 2 "${every_rank_slow[@]}" "$bin" bench "${strag[@]}" --repeats 1 --json even.json >even.log 2>&1
rc_even=$?
if [ $rc_slow -eq 0 ] && [ $rc_even -eq 0 ] && grep -q "^# straggler: rank 1 computes" slow.log \
   && ! grep -q "^# straggler: rank 0" slow.log && ! grep -q "^# straggler" even.log && python3 -c "
import json
r = json.load(open('slow.json'))['ranks']; assert [x['rank'] for x in r] == [0, 1] and r[1]['compute_ms'] > r[0]['compute_ms'] + 100, r
e = json.load(open('even.json'))['ranks']; assert [x['rank'] for x in e] == [0, 1] and min(x['compute_ms'] for x in e) >= 200, e" \
   && "$bin" report slow.json even.json -o strag.html >strag.log 2>&1 && grep -q "rank 1 computes" strag.html \
   && [ "$(grep -c "computes .* ms per step" strag.html)" = 1 ]; then
  pass "straggler: rank 1 named by bench and report ($(grep '^# straggler' slow.log | cut -c3-80)...), nobody with every rank delayed alike ($(grep '^# compute per rank' even.log | cut -c3-)); both runs rc 0, 2 ranks each"
else
  fail "bench straggler (rc slow $rc_slow, even $rc_even): $(grep -h 'straggler\|compute per rank\|error' slow.log even.log strag.log | head -4)"
fi

# Batch finder.
"$bin" bench "${tiny[@]}" --find-batch --mem-budget 40M >find.log 2>&1
if [ $? -eq 0 ] && grep -q "^micro_batch=[0-9]" find.log && grep -q "would need" find.log; then
  pass "find-batch: $(grep '^# picked' find.log | sed 's/^# //')"
else
  fail "find-batch: $(tail -3 find.log)"
fi

# bench comm --json.
timeout 60 "${mpi[@]}" -n 2 "$bin" bench comm --min-bytes 1K --max-bytes 4K --iters 2 --json comm.json >comm.log 2>&1
if [ $? -eq 0 ] && python3 -c "
import json; d=json.load(open('comm.json')); assert d['schema']=='dtrain-bench/1' and d['kind']=='comm' and d['ranks']==2
assert len(d['rows'])==33 and all(r['wrong']==0 for r in d['rows'])
assert {r['op'] for r in d['rows']} == {'allreduce','allreduce_ordered','allreduce_ordered_mpi','reduce_scatter','reduce_scatter_ordered','reduce_scatter_ordered_mpi','allgather','allgather_mpi','broadcast','pingpong','alltoall'}
assert all(r['busbw_gbs']==r['algbw_gbs'] and r['ranks']==2 for r in d['rows'] if r['op']=='pingpong')
assert set(d['rows'][0])>={'op','bytes','time_us','time_mean_us','algbw_gbs','busbw_gbs','wrong'} and 'environment' in d" \
   && out=$(python3 "$check" keys comm.json "$src/docs/FORMATS.md" comm 2>&1); then
  pass "bench comm --json: 33 rows (10 collectives, the shared-memory ones also over MPI, and the point-to-point ping-pong), all data right, keys = documented ($out)"
else
  fail "bench comm --json: $(tail -3 comm.log)"
fi

# A row's time is the median timed call, the loop's mean beside it: with rank 0 asleep 60 ms
# in the first of 3 timed calls of every row (a call descheduled), every row's mean carries
# the 20 ms (the ping-pong's one message half of it) and its median does not.
DTRAIN_TEST_COMM_DELAY_MS=60 timeout 60 "${mpi[@]}" -x DTRAIN_TEST_COMM_DELAY_MS -n 2 "$bin" bench comm --min-bytes 1K \
  --max-bytes 1K --iters 3 --json comm_delay.json >comm_delay.log 2>&1
if [ $? -eq 0 ] && out=$(python3 -c "
import json; rows=json.load(open('comm_delay.json'))['rows']; assert len(rows)==11, len(rows)
# pingpong's time is one message, half the round trip that carries the delay
slow=[r['op'] for r in rows if not (r['time_mean_us']>=(9500 if r['op']=='pingpong' else 19000) and r['time_us']<10000)]
assert not slow, 'rows whose mean misses the delay or whose median carries it: %s' % slow
print('means %.0f-%.0f us, medians %.0f-%.0f us' % (min(r['time_mean_us'] for r in rows), max(r['time_mean_us'] for r in rows),
      min(r['time_us'] for r in rows), max(r['time_us'] for r in rows)))" 2>&1); then
  pass "bench comm: one slow call of 3 moves every row's mean, not its median ($out)"
else
  fail "bench comm median: ${out:-$(tail -3 comm_delay.log)}"
fi

# bench_memcpy, bench/shm.sh's yardstick: one line, best >= median > 0; a bad flag value: one
# line naming the flag, exit 2.
out=$("$memcpy_bin" --mib 4 --reps 3 2>&1)
if python3 -c "
import re, sys; m = re.fullmatch(r'memcpy 4 MiB x 3: best ([0-9.]+) GB/s, median ([0-9.]+) GB/s', sys.argv[1])
assert m and float(m.group(1)) >= float(m.group(2)) > 0, sys.argv[1]" "$out"; then
  pass "bench_memcpy: $out"
else
  fail "bench_memcpy: $out"
fi
out=$("$memcpy_bin" --mib 0 2>&1)
rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q -- "'--mib'" <<<"$out"; then
  pass "bench_memcpy --mib 0: exit 2, one line naming the flag"
else
  fail "bench_memcpy --mib 0: rc $rc: $out"
fi

# The cost model: bench comm --fit writes an alpha-beta file (keys = documented); a 2-rank
# bench with parallel.comm_model and parallel.bucket_mb=auto takes its bucket size from it and
# prints the predicted collective time beside the measured one (JSON summary.comm_predicted_s).
timeout 60 "${mpi[@]}" -n 2 "$bin" bench comm --min-bytes 1K --max-bytes 1M --iters 3 --fit fit.json >fit.log 2>&1
auto=$(sed -n 's/^# parallel.bucket_mb: auto with this file: \([0-9.]*\) MiB.*/\1/p' fit.log)
if [ -s fit.json ] && [ -n "$auto" ] && grep -q "^  allreduce_ordered " fit.log \
   && out=$(python3 "$check" keys fit.json "$src/docs/FORMATS.md" commfit 2>&1); then
  pass "bench comm --fit: lines written, keys = documented ($out), bucket auto $auto MiB"
else
  fail "bench comm --fit: $(tail -3 fit.log)"
fi
timeout 120 "${mpi[@]}" -n 2 "$bin" bench "${tiny[@]}" "${fast[@]}" --repeats 1 --set parallel.comm_model=fit.json \
  --set parallel.bucket_mb=auto --json pred.json >pred.log 2>&1
if grep -q "^# cost model (parallel.comm_model): [0-9.]* ms predicted" pred.log \
   && python3 -c "import json,sys; s=json.load(open('pred.json'))['summary']; assert s['comm_predicted_s'] > 0" \
   && out=$(python3 "$check" keys pred.json "$src/docs/FORMATS.md" 2>&1); then
  pass "bench with the cost model: $(grep '^# cost model' pred.log | sed 's/^# //'); keys = documented"
else
  fail "bench with parallel.comm_model: $(tail -3 pred.log)"
fi
"$bin" bench "${tiny[@]}" "${fast[@]}" --set parallel.bucket_mb=auto >noauto.log 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "parallel.bucket_mb=auto needs parallel.comm_model" noauto.log; then
  pass "parallel.bucket_mb=auto without a cost model refused (rc $rc)"
else
  fail "bucket auto without a model (rc $rc): $(tail -2 noauto.log)"
fi
echo '{"schema": "dtrain-commfit/1", "lines": []}' >badfit.json
"$bin" bench "${tiny[@]}" "${fast[@]}" --set parallel.comm_model=badfit.json >badfit.log 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "badfit.json: key 'lines'" badfit.log; then
  pass "a bad cost model file refused naming the file and key (rc $rc)"
else
  fail "bad cost model (rc $rc): $(tail -2 badfit.log)"
fi

# Usage errors: one line, exit 2.
printf 'instances:\n  x1: {on_demand: 1.0}\n  x2: {on_demand: cheap}\n' >bad.yaml
expect_usage() { # name, expected text, command...
  local name=$1 want=$2
  shift 2
  "$@" >err.out 2>&1
  local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <err.out)" -eq 1 ] && grep -qF -- "$want" err.out; then pass "$name: $(cat err.out)"
  else fail "$name (rc $rc): $(cat err.out)"; fi
}
expect_usage "bad price file" "bad.yaml:3: instances.x2.on_demand" "$bin" bench --prices bad.yaml
expect_usage "missing price file" "nope.yaml: cannot open" "$bin" bench --prices nope.yaml
expect_usage "unknown instance" "--instance zz: not in" "$bin" bench --prices "$src/configs/prices.yaml" --instance zz
expect_usage "bad --repeats" "--repeats must be" "$bin" bench --repeats 0
expect_usage "bad sweep axis" "unknown axis 'colour'" "$bin" bench --sweep colour=red
expect_usage "bad budget" "--mem-budget expects" "$bin" bench --find-batch --mem-budget lots
expect_usage "--json without value" "--json needs a value" "$bin" bench --json

echo "test_bench: $fails failure(s)"
[ $fails -eq 0 ]
