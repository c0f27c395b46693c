#!/usr/bin/env bash
# dtrain plan --emit: job files for clusters (docs/launch.md "Job files", decision 64).
#  - every bad input is one line naming the flag, exit 2: unknown kind, unwritable --emit-out,
#    no checkpoint.dir, a layout only model parallelism fits (--tp 2), --hosts that do not
#    match the nodes, flags of another kind, k8s without --image/--pvc or with a bad name;
#  - --emit k8s: the MPIJob validates against the MPI operator's CRD kept in tests/data/k8s
#    (tests/k8s_check.py; strict: an undeclared field or a wrong type fails it, checked too);
#  - the sbatch script's requeue logic with a stand-in supervisor and scontrol (no Slurm):
#    USR1 short of the last step requeues, after it (checkpoint.dir/latest) does not; the last
#    step from training.tokens;
#  - --emit slurm on a real Slurm cluster (scripts/mnhosts.sh, 2 hosts x 2 ranks): the sbatch
#    script runs 4 ranks on 2 nodes under the supervisor; `scancel --signal=USR1 --batch`
#    during it ends in a checkpoint at that step and a requeue; the job runs again, resumes
#    from that checkpoint, survives a rank killed on h2 (the supervisor's restart inside the
#    allocation) and finishes (COMPLETED, 1 requeue);
#  - --emit mpirun --hosts h1,h2: the script runs 4 ranks on the 2 hosts and finishes.
# Needs root, network namespaces, Slurm (slurm-wlm slurmctld slurmd slurm-client munge) and
# python3-yaml, python3-jsonschema (scripts/install-deps.sh); missing: skip, a failure under
# CI=true. Everything is torn down (trap).
set -uo pipefail
bin=$(readlink -f "$1")
dir=$(readlink -m "$2")
src=$(cd "$(dirname "$0")/.." && pwd)
mn=$src/scripts/mnhosts.sh
for v in $(compgen -e | grep -E '^(SLURM_|SLURMD_|PMIX_|PMI_|OMPI_)' || true); do unset "$v"; done
unset DTRAIN_NODE_ID DTRAIN_TEST_STEP_DELAY_MS
export OMP_NUM_THREADS=1 PATH=$PATH:/usr/sbin:/sbin
export MN_PREFIX=dtmnj- MN_STATE=$dir/mn MN_NET=10.78.0
start=$(date +%s.%N)
. "$(dirname "$0")/lib.sh"
elapsed() { awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

python3 -c 'import yaml, jsonschema' 2>/dev/null || skip "python3-yaml and python3-jsonschema are needed (scripts/install-deps.sh)"
rm -rf "$dir" && mkdir -p "$dir/work" && cd "$dir/work" || exit 1
cat=(--catalog "$src/configs/hardware.yaml")
tiny=(--set model.preset= --model.n_layer 2 --model.d_model 48 --model.n_head 4 --model.vocab_size 300
      --model.context 32 --seq 32 --batch 2 --set logging.progress=lines)
big=(--model gpt2 --seq 1024 --micro-batch 8 --precision bf16 --gpus 16 --hardware h100-sxm "${cat[@]}")

# One line on stderr naming the flag, exit 2, nothing on stdout.
bad() {  # WANT(grep -E) ARGS...
  local want=$1
  shift
  "$bin" plan "$@" >bad.out 2>bad.err
  local rc=$?
  if [ $rc -eq 2 ] && [ "$(wc -l <bad.err)" -eq 1 ] && grep -qE -- "$want" bad.err && [ ! -s bad.out ]; then
    pass "refused: $(cat bad.err)"
  else
    fail "plan $* (rc $rc, want one line matching '$want'): $(head -c 300 bad.err) | $(head -c 200 bad.out)"
  fi
}
bad "--emit yaml: unknown kind" "${big[@]}" --emit yaml --set checkpoint.dir=ck
bad "--emit-out /nonexistent/dir/job.sh: No such file" "${big[@]}" --emit slurm --set checkpoint.dir=ck --emit-out /nonexistent/dir/job.sh
bad "--emit needs checkpoint.dir" "${big[@]}" --emit slurm
bad "--emit: no layout a dtrain job can run .* \(layouts a job cannot run yet do" "${big[@]}" --seq 1000 --cp 8 --emit slurm \
  --set checkpoint.dir=ck
bad "--hosts names 3 host\(s\); the plan has 2 node" "${big[@]}" --emit mpirun --hosts a,b,c --set checkpoint.dir=ck
bad "--emit mpirun needs the nodes: --hosts" "${big[@]}" --emit mpirun --set checkpoint.dir=ck
bad "--partition is a Slurm flag" "${big[@]}" --emit mpirun --hosts a,b --partition gpu --set checkpoint.dir=ck
bad "--emit k8s needs --image" "${big[@]}" --emit k8s --pvc ck --set checkpoint.dir=/ck
bad "--emit k8s needs --pvc" "${big[@]}" --emit k8s --image img --set checkpoint.dir=/ck
bad "--job-name Big_Run: an MPIJob name" "${big[@]}" --emit k8s --image img --pvc ck --job-name Big_Run --set checkpoint.dir=/ck
bad "checkpoint.dir ck must be an absolute path" "${big[@]}" --emit k8s --image img --pvc ck --set checkpoint.dir=ck
bad "--time 1 h: not a Slurm value" "${big[@]}" --emit slurm --time "1 h" --set checkpoint.dir=ck
bad "--emit-out needs --emit" "${big[@]}" --emit-out x.sh
bad "--job-name needs --emit" "${big[@]}" --job-name x
bad "--hosts goes with --emit mpirun" "${big[@]}" --emit slurm --hosts a,b --set checkpoint.dir=ck
bad "--emit goes with one plan" --sweep gpus=8,16 --model gpt2 --hardware h100-sxm "${cat[@]}" --emit slurm --set checkpoint.dir=ck

# k8s: the manifest validates against the operator's CRD; the same manifest with an undeclared
# field, or a count that is not a number, does not (the checker can fail).
crd=$src/tests/data/k8s/kubeflow.org_mpijobs.yaml
"$bin" plan "${big[@]}" --emit k8s --image registry.example/dtrain:1 --pvc ckpt --job-name gpt2-run \
  --set checkpoint.dir=/ckpt/run1 --set checkpoint.resume=latest --emit-out job.yaml >plan.out 2>emit.err
rc=$?
if [ $rc -eq 0 ] && grep -q "^fastest layout that fits: " plan.out && grep -q "^apiVersion: kubeflow.org/v2beta1" job.yaml \
   && python3 "$src/tests/k8s_check.py" "$crd" job.yaml >check.out 2>&1 && grep -q "^ok 1 document" check.out \
   && grep -q "^  slotsPerWorker: 8$" job.yaml && grep -q '^            - "parallel.strategy=zero3"$' job.yaml \
   && grep -q '^            - "checkpoint.resume=auto"$' job.yaml && [ "$(grep -c 'checkpoint\.resume=' job.yaml)" = 1 ] \
   && grep -q "^      replicas: 2$" job.yaml && [ "$(grep -c "^          terminationGracePeriodSeconds: 120$" job.yaml)" = 2 ] \
   && grep -q "k8s job gpt2-run for hybrid-zero3 dp16 .* written to job.yaml" emit.err; then
  pass "k8s: MPIJob (2 workers x 8 slots, zero3) valid against $(basename "$crd"); the plan printed beside --emit-out"
else
  fail "k8s (rc $rc): $(cat emit.err check.out 2>/dev/null | head -5)"
fi
sed 's/^  slotsPerWorker: 8$/  slotsPerWorker: 8\n  slotsPerNode: 8/' job.yaml >extra.yaml
sed 's/^      replicas: 2$/      replicas: two/' job.yaml >type.yaml
for m in extra type; do
  if python3 "$src/tests/k8s_check.py" "$crd" $m.yaml >$m.out 2>&1; then
    fail "k8s checker accepted $m.yaml"
  else
    pass "k8s checker rejects $m.yaml: $(head -1 $m.out)"
  fi
done
# Tensor-parallel layouts run (checkpoints in the canonical index space): a fixed --tp 2 gives a
# job with parallel.tp=2; mistral-7b on 16 A100-40GB fits only model-parallel layouts, and the
# job runs the fastest tensor-parallel one.
"$bin" plan "${big[@]}" --tp 2 --emit slurm --set checkpoint.dir=ck >tp.sh 2>tp.err
rc=$?
# the file's keys are the chosen layout's (hybrid or not, as the plan picked it)
tphyb=false
grep -q "slurm job dtrain for hybrid-" tp.err && tphyb=true
if [ $rc -eq 0 ] && grep -q "parallel.tp=2 " tp.sh && grep -q "parallel.hybrid=$tphyb " tp.sh \
   && grep -qE "slurm job dtrain for (hybrid-)?[a-z0-9]+ dp[0-9]+ tp2 " tp.err; then
  pass "--tp 2: the job runs tp 2 ($(grep -o 'slurm job [^ ]* for [^ ]* [^ ]* [^ ]*' tp.err))"
else fail "--tp 2 (rc $rc): $(head -3 tp.err)"; fi
"$bin" plan --model mistral-7b --seq 4096 --micro-batch 1 --precision bf16 --gpus 16 --hardware a100-40gb "${cat[@]}" \
  --emit slurm --set checkpoint.dir=ck >m7.sh 2>m7.err
rc=$?
if [ $rc -eq 0 ] && grep -qE "parallel.tp=(2|4|8) " m7.sh; then
  pass "mistral-7b on 16 A100-40GB: $(grep -o 'slurm job [^ ]* for [^ ]* [^ ]* [^ ]*' m7.err)"
else fail "mistral-7b on 16 A100-40GB (rc $rc): $(head -3 m7.err)"; fi
# A pipeline-parallel winner: the job runs it (parallel.pp in the file), nothing said about a
# layout it cannot run.
"$bin" plan --model gpt2-xl --seq 1024 --micro-batch 1 --precision bf16 --gpus 16 --hardware h100-sxm "${cat[@]}" \
  --emit slurm --set checkpoint.dir=ck >mp.sh 2>mp.err
rc=$?
# the plan's winner on this catalog is a pipeline (pp > 1); the file runs exactly it
lay=$(grep -oE "slurm job dtrain for (hybrid-)?[a-z0-9]+ dp[0-9]+ tp[0-9]+ pp[0-9]+ cp1 ep1 on 2 node\(s\)" mp.err)
read -r st dp tp pp <<<"$(sed -E 's/.* for (hybrid-)?([a-z0-9]+) dp([0-9]+) tp([0-9]+) pp([0-9]+) .*/\2 \3 \4 \5/' <<<"$lay")"
hyb=false
[[ $lay == *"for hybrid-"* ]] && hyb=true
if [ $rc -eq 0 ] && [ -n "$lay" ] && [ "${pp:-1}" -gt 1 ] && ! grep -q "cannot run" mp.err mp.sh \
   && grep -q "parallel.strategy=$st " mp.sh && grep -q "parallel.pp=$pp " mp.sh && grep -q "parallel.hybrid=$hyb " mp.sh; then
  pass "pipeline-parallel winner: the job runs it ($st dp$dp tp$tp pp$pp: parallel.pp=$pp in the file)"
else
  fail "pipeline-parallel winner (rc $rc): $(head -3 mp.err)"
fi

# The sbatch script's own logic, without Slurm: a stand-in supervisor (DTRAIN) that runs until
# SIGUSR1 and exits 0, a stand-in scontrol that records its arguments. USR1 while the run is
# short of its last step: requeue; after the last step (checkpoint.dir/latest = step 120): not.
mkdir -p fake/bin
# (it gives up with status 1 after about 60 s: a script that did not pass the signal on fails)
printf '#!/bin/bash\ntrap "exit 0" USR1\n: >"$FAKE_DIR/running"\nfor _ in $(seq 1200); do sleep 0.05; done\nexit 1\n' >fake/dtrain
printf '#!/bin/sh\necho "$@" >>"$FAKE_DIR/scontrol.args"\n' >fake/bin/scontrol
chmod 755 fake/dtrain fake/bin/scontrol
"$bin" plan "${tiny[@]}" --steps 120 --gpus 4 --hardware cpu-core "${cat[@]}" --emit slurm --emit-out fake/job.sh \
  --set checkpoint.dir=fake/ck >/dev/null 2>emit.err || fail "emit for the stand-ins: $(cat emit.err)"
mkdir -p fake/ck
for latest in 00000050 00000120; do
  rm -f fake/running fake/scontrol.args
  echo "step-$latest" >fake/ck/latest
  FAKE_DIR=$dir/work/fake DTRAIN=$dir/work/fake/dtrain PATH=$dir/work/fake/bin:$PATH SLURM_JOB_ID=7 \
    SLURM_JOB_NODELIST=n1 bash fake/job.sh >fake/out 2>&1 &
  jpid=$!
  for _ in $(seq 1 300); do [ -e fake/running ] && break; sleep 0.05; done
  kill -USR1 $jpid
  wait $jpid
  rc=$?
  args=$(cat fake/scontrol.args 2>/dev/null)
  if [ $latest = 00000050 ] && [ $rc = 0 ] && [ "$args" = "requeue 7" ] \
     && grep -q "checkpointed after SIGUSR1; requeueing" fake/out; then
    pass "sbatch script, USR1 before the last step: the supervisor is signalled, then scontrol requeue 7"
  elif [ $latest = 00000120 ] && [ $rc = 0 ] && [ -z "$args" ] \
     && grep -q "SIGUSR1 came after the last step (120): finished, not requeueing" fake/out; then
    pass "sbatch script, USR1 after the last step: finished, no requeue"
  else
    fail "sbatch script with latest step-$latest: rc $rc, scontrol '$args': $(tail -2 fake/out)"
  fi
done

# The last step from training.tokens: ceil(30000 / (8 sequences x 32 tokens)) = 118.
"$bin" plan "${tiny[@]}" --set training.tokens=30000 --gpus 4 --hardware cpu-core "${cat[@]}" --emit slurm \
  --set checkpoint.dir=ck >tokens.sh 2>emit.err
grep -q "= step-00000118 \]; then$" tokens.sh && grep -q "training.batch=8 " tokens.sh \
  && pass "sbatch script: the last step from training.tokens over the global batch (118)" \
  || fail "last step from training.tokens: $(grep -E 'step-0|training.batch' tokens.sh; cat emit.err)"

# ---- the cluster
[ "$(id -u)" = 0 ] || skip "network namespaces and Slurm daemons need root"
for t in ip nsenter unshare runuser flock munged slurmctld slurmd sbatch scontrol; do
  command -v $t >/dev/null || skip "'$t' is not installed (scripts/install-deps.sh)"
done
ip netns add "${MN_PREFIX}probe" 2>probe.err || skip "cannot create a network namespace: $(cat probe.err)"
ip netns del "${MN_PREFIX}probe"
exec 9>/tmp/dtrain-test-jobs.lock
flock -w 120 9 || { echo "FAIL: another test_jobs holds /tmp/dtrain-test-jobs.lock"; exit 1; }
"$mn" down >/dev/null 2>&1
save_logs() {
  mkdir -p "$dir/slurm-logs"
  cp -r "$MN_STATE/slurm/log/." "$MN_STATE/slurm/slurm.conf" "$dir/slurm-logs/" 2>/dev/null
  return 0
}
trap 'save_logs; "$mn" down >/dev/null 2>&1' EXIT
"$mn" up 2 || { echo "FAIL: mnhosts.sh up 2"; exit 1; }
"$mn" slurm-up || { echo "FAIL: mnhosts.sh slurm-up (logs: $dir/slurm-logs)"; exit 1; }
pass "Slurm up on h1, h2 ($(elapsed) s)"

# The job: 4 ranks (cpu-core: 2 per node) of a tiny model, 120 steps of >= 25 ms each, a
# checkpoint every 50. The signal comes once 10 steps are logged: the run cannot finish first.
steps=120
"$bin" plan "${tiny[@]}" --steps $steps --gpus 4 --hardware cpu-core "${cat[@]}" --emit slurm --emit-out job.sh \
  --job-name tiny --max-restarts 2 --set checkpoint.dir=ck --set checkpoint.every=50 >plan.out 2>emit.err
rc=$?
if [ $rc -eq 0 ] && grep -q "^fastest layout that fits: " plan.out && grep -q "^#SBATCH --nodes=2$" job.sh && grep -q "^#SBATCH --ntasks-per-node=2$" job.sh \
   && grep -q "^#SBATCH --signal=B:USR1@120$" job.sh && grep -q "^#SBATCH --requeue$" job.sh \
   && grep -q -- "--max-restarts 2 --grace 90 " job.sh && grep -q "^#SBATCH --cpus-per-task=1$" job.sh \
   && grep -q "^DTRAIN=\${DTRAIN:-$bin}$" job.sh && grep -q "checkpoint.dir=$dir/work/ck " job.sh \
   && [ -x job.sh ] && bash -n job.sh; then
  pass "slurm: sbatch script for 2 nodes x 2 ranks, USR1@120, requeue, restart budget 2"
else
  fail "slurm emit (rc $rc): $(cat emit.err)"
fi
export DTRAIN_TEST_STEP_DELAY_MS=25   # forwarded to the ranks by sbatch and dtrain launch
id=$("$mn" exec h1 sbatch --parsable --chdir="$dir/work" job.sh 2>sbatch.err)
log=$dir/work/tiny-$id.out
unset DTRAIN_TEST_STEP_DELAY_MS
job_state() { "$mn" exec h1 scontrol show job "$id" 2>/dev/null | grep -oE "$1=[^ ]*" | head -1 | cut -d= -f2; }
for _ in $(seq 1 600); do grep -q "^h1:0 step 10/$steps " "$log" 2>/dev/null && break; sleep 0.1; done
if grep -q "^h1:0 4 rank(s) on 2 node(s)" "$log" 2>/dev/null; then
  pass "job $id: 4 rank(s) on 2 node(s) under the supervisor"
else
  fail "job $id did not start 4 ranks on 2 nodes: $(cat sbatch.err; tail -3 "$log" 2>/dev/null)"
fi
"$mn" exec h1 scancel --signal=USR1 --batch "$id"
# Slurm holds a requeued job (BeginTime, about 2 minutes) before it may start again: release it
# (StartTime=now also schedules it at once) 3 s after the requeue: a start within the second of
# the old run's end is refused ("Job credential revoked": whole-second time stamps).
requeued=0
for _ in $(seq 1 600); do
  if [ "$(job_state JobState)" = PENDING ] && [ "$(job_state Restarts)" = 1 ]; then requeued=1; break; fi
  sleep 0.1
done
at=$(grep -oE "preempted \(signal received\): checkpoint written at step [0-9]+" "$log" | grep -oE "[0-9]+$" | head -1)
if [ $requeued = 1 ] && [ -n "$at" ] && [ "$at" -ge 10 ] && [ "$at" -lt $steps ] \
   && grep -q "checkpointed after SIGUSR1; requeueing" "$log"; then
  pass "USR1 at step >= 10: checkpoint at step $at, job requeued (PENDING, Restarts=1)"
else
  fail "preemption: requeued=$requeued step '$at': $(grep -E 'preempt|requeue|error' "$log" | tail -3)"
fi
sleep 3
"$mn" exec h1 scontrol update JobId="$id" StartTime=now
# In the second run a rank on h2 is killed: the supervisor restarts the attempt inside the
# allocation (restart 1 of 2) from the newest checkpoint.
for _ in $(seq 1 600); do grep -q "^h1:0 step $((at + 5))/$steps " "$log" && break; sleep 0.1; done
killed=""
for p in $(ip netns pids "${MN_PREFIX}h2" 2>/dev/null); do
  [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$bin" ] && grep -q "^train" <(tr '\0' '\n' <"/proc/$p/cmdline" | sed -n 2p) \
    && kill -9 "$p" && killed=$p && break
done
[ -n "$killed" ] || fail "no rank of the second run found on h2 to kill"
for _ in $(seq 1 900); do
  s=$(job_state JobState)
  [ "$s" = COMPLETED ] || [ "$s" = FAILED ] || [ "$s" = CANCELLED ] || [ "$s" = TIMEOUT ] && break
  sleep 0.1
done
s=$(job_state JobState) r=$(job_state Restarts) x=$(job_state ExitCode)
if [ "$s" = COMPLETED ] && [ "$r" = 1 ] && [ "$x" = 0:0 ] && grep -q "run 2 on" "$log" \
   && grep -q "job failed after .*: rank [23] .*killed by signal 9" "$log" && grep -q "restart 1 of 2 in" "$log" \
   && grep -qE "resumed from .*/ck/step-0*$at: step $at," "$log" && grep -q "^h1:0 step $steps/$steps " "$log" \
   && [ "$(cat ck/latest 2>/dev/null)" = "step-$(printf %08d $steps)" ]; then
  pass "the requeued job resumed from step $at, was restarted by the supervisor after a rank on h2 was killed, and finished: $s, Restarts=$r, ExitCode=$x ($(elapsed) s so far)"
else
  fail "rerun: state $s restarts $r exit $x: $(grep -E 'run 2|resumed|error' "$log" | tail -3)"
fi

# mpirun: a hostfile launch over the same hosts (ssh stand-in of mnhosts.sh).
"$bin" plan "${tiny[@]}" --steps 20 --gpus 4 --hardware cpu-core "${cat[@]}" --emit mpirun --hosts h1,h2 \
  --emit-out run.sh --job-name tiny --set checkpoint.dir=ck2 >/dev/null 2>emit.err
rc=$?
timeout 120 "$mn" exec h1 bash run.sh >run.log 2>&1
rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(cat tiny.hosts)" = "$(printf 'h1 slots=2\nh2 slots=2')" ] \
   && ! grep -q OMP_NUM_THREADS run.sh \
   && grep -q "^h1:0 4 rank(s) on 2 node(s)" run.log && [ "$(cat ck2/latest 2>/dev/null)" = step-00000020 ]; then
  pass "mpirun: hostfile h1,h2 x 2 slots, 4 ranks on 2 nodes, finished"
else
  fail "mpirun (emit rc $rc, run rc $rc2): $(cat emit.err; tail -3 run.log)"
fi

save_logs
"$mn" down
echo "test_jobs: $fails failure(s) in $(elapsed) s"
[ $fails -eq 0 ]
