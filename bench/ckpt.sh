#!/usr/bin/env bash
# Checkpoint and recovery numbers for docs/benchmarks.md (issue 5), all in one run:
#  1. the disk's sequential write (dd, fsync) and read (dd, O_DIRECT) rate for a file the
#     size of the checkpoint;
#  2. synchronous save throughput (bench-small, 1 rank: model + AdamW moments + trainer.json,
#     fsynced, manifest last) and load throughput (--resume);
#  3. the training stall per asynchronous save, as a fraction of the step (2 ranks, DDP and
#     ZeRO-3: the loop pays the copy into the staging buffer and any wait for the disk);
#  4. failure detection and recovery: bench-small on 2 ranks under `dtrain launch
#     --max-restarts`, kill -9 of rank 1 (3 times): detection = kill -> the supervisor's
#     "failure detected" line, recovery = kill -> first step logged after the restart.
# usage: bash bench/ckpt.sh [DTRAIN] [WORKDIR]
set -uo pipefail
bin=$(realpath "${1:-build/dtrain}")
out=${2:-/tmp/dtrain-bench-ckpt}
rm -rf "$out" && mkdir -p "$out" && cd "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model=(--model bench-small --batch 8 --seq 256 --set logging.peak_gflops=210 --set logging.progress=lines
       --set logging.metrics=)
echo "# dtrain checkpoint benchmark, $(date -u +%Y-%m-%dT%H:%MZ), $(hostname), $(nproc) cores, $(df -h . | awk 'NR==2 {print $1}')"

# 2. synchronous save (3 saves), then load
"$bin" train "${model[@]}" --steps 3 --set schedule.decay_steps=10 --set checkpoint.dir=ck --set checkpoint.every=1 \
  --set checkpoint.async=false >save.log 2>&1 || { tail -3 save.log; exit 1; }
bytes=$(du -sb ck/step-00000003 | cut -f1)
save=$(grep -o '[0-9.]* MB written by rank 0 at [0-9.]* MB/s' save.log)
sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null && cold="page cache dropped" || cold="page cache warm (cannot drop it here)"
"$bin" train "${model[@]}" --steps 4 --set schedule.decay_steps=10 --set checkpoint.dir=ck --resume \
  --set checkpoint.every=0 >load.log 2>&1 || { tail -3 load.log; exit 1; }
load=$(grep -o 'loaded in .*' load.log)

# 1. the disk, same size
mb=$(( (bytes + 1048575) / 1048576 ))
w=$(dd if=/dev/zero of=dd.bin bs=1M count=$mb conv=fsync 2>&1 | tail -1 | awk -F, '{print $NF}')
sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null
r=$(dd if=dd.bin of=/dev/null bs=1M iflag=direct 2>&1 | tail -1 | awk -F, '{print $NF}')
rm -f dd.bin
echo "checkpoint size (step dir): $((bytes / 1000000)) MB"
echo "disk: sequential write (dd conv=fsync) $w, read (dd iflag=direct) $r"
echo "sync save (bench-small, 1 rank): $save"
echo "load (--resume, $cold): $load"

# 3. stall per async save, 2 ranks
for strat in ddp zero3; do
  "$bin" launch -n 2 -- train "${model[@]}" --steps 12 --set schedule.decay_steps=12 --set checkpoint.dir=ck_$strat \
    --set checkpoint.every=2 --set parallel.strategy=$strat >async_$strat.log 2>&1 || { tail -3 async_$strat.log; exit 1; }
  echo "async, 2 ranks $strat, every 2 steps: $(grep -o 'checkpoints: .*' async_$strat.log)"
done

# 4. detection and recovery
"$bin" launch -n 2 --max-restarts 5 --backoff 0 -- train "${model[@]}" --steps 60 --set schedule.decay_steps=60 \
  --set checkpoint.dir=ck_kill --set checkpoint.every=2 --set logging.metrics=kill.jsonl >kill.log 2>&1 &
lp=$!
nsteps() { local n; n=$(grep -c '"type":"step"' kill.jsonl 2>/dev/null); echo "${n:-0}"; }
for k in 1 2 3; do
  # wait for two steps of the current incarnation, then kill rank 1
  base=$(nsteps)
  while [ "$(nsteps)" -lt $((base + 2)) ]; do sleep 0.2; done
  pid=$(pgrep -f "dtrain train .*ck_kill" | tail -1)
  t0=$(date +%s.%N)
  kill -9 "$pid"
  echo "$t0" >>kill.times
  while [ "$(grep -c 'recovered:' kill.log)" -lt $k ]; do sleep 0.2; done
done
kill -TERM $lp 2>/dev/null
wait $lp
/usr/bin/python3 - kill.log kill.times <<'PY'
import datetime, re, sys
log = open(sys.argv[1]).read().splitlines()
kills = [float(x) for x in open(sys.argv[2])]
def t(line):  # the supervisor's [HH:MM:SS.mmm], on the kill's day
    hh, mm, ss = re.search(r"\[(\d\d):(\d\d):([\d.]+)\]", line).groups()
    return int(hh) * 3600 + int(mm) * 60 + float(ss)
failed = [t(l) for l in log if "failure detected" in l]
rec = [float(re.search(r"logged ([\d.]+) s", l).group(1)) for l in log if "recovered:" in l]
for i, k in enumerate(kills):
    d = datetime.datetime.fromtimestamp(k)
    ks = d.hour * 3600 + d.minute * 60 + d.second + d.microsecond / 1e6
    det = failed[i] - ks
    print("kill %d: detection %.2f s, recovery (kill -> first step after restart) %.2f s" % (i + 1, det, det + rec[i]))
PY
