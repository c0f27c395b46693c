#!/usr/bin/env bash
# The node's shared-memory segment (src/comm/shm.h) leaves nothing in /dev/shm:
#  - a stale name from a dead creator (a rank killed between creating and unlinking it) is
#    removed by the next job's set-up;
#  - kill -9 of a rank in the middle of a 2-rank DDP run (which uses the segment for its
#    gradient all-reduce): the kill is asserted to have happened (the pid is gone, the job
#    failed), and no name of this job's segment is left;
#  - DDP over the segment trains the same bits as DDP over MPI (DTRAIN_SHM=0);
#  - DDP on 2 simulated nodes x 2: the hierarchical all-reduce == flat, bitwise; forcing it on
#    one node is refused naming parallel.allreduce;
#  - the cost model on 2 x 2 fits the link levels apart and parallel.allreduce=auto picks what it
#    predicts faster.
# Every run meant to use the segment is asserted to have used it: its banner names the routing
# (dt_comm_routing: "shared memory inside the node", ...) and no rank logged the fallback warning
# ("node-local shared-memory collectives unavailable (...); using MPI"), so a node without a
# usable /dev/shm fails the test instead of passing it over MPI; the DTRAIN_SHM=0 run is
# asserted to have used MPI.
# Usage: tests/test_shm_cleanup.sh DTRAIN_BIN
set -uo pipefail
bin=$(readlink -f "$1")
. "$(dirname "$0")/lib.sh"
tmp_dir
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpiexec --oversubscribe --bind-to none)
# routing LOG: how the run's collectives went, from the train banner ("ddp over mpi (ROUTING), bucket
# ..."), with "; fallback: ..." added if any rank warned that the segment was unavailable.
routing() {
  local r
  r=$(grep -o -m1 ' over mpi ([^)]*)' "$1")
  r=${r#* over mpi (}
  r=${r%)}
  grep -q "shared-memory collectives unavailable" "$1" &&
    r="$r; fallback: $(grep -o -m1 'shared-memory collectives unavailable.*' "$1")"
  echo "${r:-no banner}"
}
# The warning matched above is still the one dtrain logs (else its absence would prove nothing).
grep -q '"node-local shared-memory collectives unavailable (%s); using MPI"' "$src/src/comm/comm_mpi.c" ||
  fail "the fallback warning's text changed in src/comm/comm_mpi.c: update routing() here"
one="shared memory inside the node"
common=(--set model.preset= --model.n_layer 2 --model.d_model 48 --model.n_head 4 --model.vocab_size 500
        --model.context 32 --seq 32 --batch 2 --lr 3e-3 --warmup 2 --seed 5 --set logging.every=1)

# 1. A stale name: a pid that has exited (a child we reaped), a segment-sized file.
sh -c 'exit 0' &
dead=$!
wait $dead
stale=/dev/shm/dtrain-shm-$dead-0
head -c 4096 /dev/zero >"$stale"
timeout 120 "${mpi[@]}" -n 2 "$bin" train "${common[@]}" --steps 4 >"$dir/stale.log" 2>&1 ||
  fail "2-rank job after the stale name: $(tail -2 "$dir/stale.log")"
r=$(routing "$dir/stale.log")
if [ -e "$stale" ]; then fail "stale $stale (creator pid $dead gone) was not removed"; rm -f "$stale"
elif [ "$r" != "$one" ]; then fail "the job after the stale name did not use shared memory: $r"
else pass "a stale segment name of a dead creator (pid $dead) removed by the next job's set-up ($r)"; fi

# 2. kill -9 of a rank mid-run.
mark="$dir/kill"
"${mpi[@]}" -n 2 "$bin" train "${common[@]}" --steps 100000 --set logging.metrics="$mark.jsonl" >"$dir/kill.log" 2>&1 &
lp=$!
if v=$(kill_rank_at "$bin" "$mark" "$mark.jsonl" 2 3 50 $lp " "); then
  read -r pid rank step <<<"$v"
  wait $lp
  rc=$?
  # A name carries its creator's pid (node-local rank 0): one whose creator is gone is a
  # leak (names of other jobs running now have live creators).
  leaked=""
  for f in /dev/shm/dtrain-shm-*; do
    [ -e "$f" ] || continue
    p=${f#/dev/shm/dtrain-shm-}
    kill -0 "${p%%-*}" 2>/dev/null || leaked="$leaked ${f#/dev/shm/}"
  done
  r=$(routing "$dir/kill.log")
  if kill -0 "$pid" 2>/dev/null; then fail "rank $rank (pid $pid) still alive after kill -9"
  elif [ $rc -eq 0 ]; then fail "the job exited 0 after rank $rank was killed"
  elif [ "$r" != "$one" ]; then fail "the killed job did not use shared memory: $r"
  elif [ -n "$leaked" ]; then fail "segment names of dead creators left in /dev/shm:$leaked"
  else pass "kill -9 of rank $rank (pid $pid) at step $step of a job over $r: the job failed (rc $rc), no segment name left"; fi
else
  fail "no rank killed: $v"
  kill $lp 2>/dev/null
  wait $lp 2>/dev/null
fi

# 3. DDP over shared memory == DDP over MPI, bitwise (gradient all-reduce, parameter checks).
timeout 120 "${mpi[@]}" -n 2 "$bin" train "${common[@]}" --steps 6 --save-weights "$dir/shm.st" >"$dir/shm.log" 2>&1 ||
  fail "shm run: $(tail -2 "$dir/shm.log")"
timeout 120 "${mpi[@]}" -x DTRAIN_SHM=0 -n 2 "$bin" train "${common[@]}" --steps 6 --save-weights "$dir/mpi.st" \
  >"$dir/mpi.log" 2>&1 || fail "MPI run: $(tail -2 "$dir/mpi.log")"
rs=$(routing "$dir/shm.log") rm=$(routing "$dir/mpi.log")
if [ "$rs" != "$one" ] || [ "$rm" != MPI ]; then fail "shared memory vs MPI: the runs went over '$rs' and '$rm'"
elif cmp -s "$dir/shm.st" "$dir/mpi.st"; then pass "DDP 2 ranks: shared-memory all-reduce ($rs) == MPI's ($rm), weights bitwise"
else fail "DDP weights differ between shared memory and MPI"; fi

# 4. DDP on 2 simulated nodes x 2 ranks: the hierarchical all-reduce (the default there) trains
#    the bits of the flat one; forcing it where it cannot run is refused naming the key.
node2=(bash -c 'DTRAIN_NODE_ID=node$((OMPI_COMM_WORLD_RANK / 2)) exec "$0" "$@"')
for a in hierarchical flat; do
  timeout 120 "${mpi[@]}" -n 4 "${node2[@]}" "$bin" train "${common[@]}" --steps 6 --set parallel.allreduce=$a \
    --save-weights "$dir/$a.st" >"$dir/$a.log" 2>&1 || fail "2 x 2 $a: $(tail -2 "$dir/$a.log")"
done
rh=$(routing "$dir/hierarchical.log") rf=$(routing "$dir/flat.log")
if [ "$rh" != "shared memory inside nodes, hierarchical all-reduce across them" ] ||
   [ "$rf" != "shared memory inside nodes, MPI across them" ]; then
  fail "DDP 2 x 2: hierarchical over '$rh', flat over '$rf'"
elif cmp -s "$dir/hierarchical.st" "$dir/flat.st" && grep -q "4 rank(s) on 2 node(s)" "$dir/hierarchical.log"; then
  pass "DDP 2 nodes x 2 ranks: hierarchical all-reduce ($rh) == flat ($rf), weights bitwise"
else fail "DDP 2 x 2: hierarchical and flat weights differ (or not 2 nodes)"; fi
# 5. The cost model on 2 x 2: bench comm --fit measures the flat all-reduce beside the
#    hierarchical one and each link level on its own (node and cross groups), fitted apart;
#    parallel.allreduce=auto with it picks what the file predicts faster (a copy whose
#    hierarchical line is made slow picks flat), with the same bits either way.
timeout 120 "${mpi[@]}" -n 4 "${node2[@]}" "$bin" bench comm --min-bytes 64K --max-bytes 1M --iters 2 --warmup 1 \
  --fit "$dir/fit22.json" >"$dir/fit22.log" 2>&1 || fail "bench comm --fit on 2 x 2: $(tail -2 "$dir/fit22.log")"
if python3 - "$dir/fit22.json" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
have = {(l["group"], l["op"]) for l in f["lines"]}
need = {("world", "allreduce_ordered"), ("world", "allreduce_ordered_flat"), ("node", "allreduce_ordered"),
        ("node", "reduce_scatter_ordered"), ("node", "allgather"), ("cross", "allreduce"), ("cross", "allreduce_ordered"),
        ("cross", "allgather")}
assert f["ranks"] == 4 and f["nodes"] == 2, (f["ranks"], f["nodes"])
assert need <= have, sorted(need - have)
slow = json.loads(json.dumps(f))
for l in slow["lines"]:
    if l["group"] == "world" and l["op"] == "allreduce_ordered": l["alpha_us"] = 1e7
json.dump(slow, open(sys.argv[1] + ".slowhier", "w"))
PY
then pass "bench comm --fit on 2 x 2: world flat + hierarchical, node and cross groups fitted apart"
else fail "bench comm --fit on 2 x 2: lines missing"; fi
timeout 120 "${mpi[@]}" -n 4 "${node2[@]}" "$bin" train "${common[@]}" --steps 6 --set parallel.comm_model="$dir/fit22.json.slowhier" \
  --save-weights "$dir/autoflat.st" >"$dir/autoflat.log" 2>&1 || fail "2 x 2 auto (slow hierarchical): $(tail -2 "$dir/autoflat.log")"
if grep -q "parallel.allreduce=auto: flat (" "$dir/autoflat.log" \
   && [ "$(routing "$dir/autoflat.log")" = "shared memory inside nodes, MPI across them" ] \
   && cmp -s "$dir/autoflat.st" "$dir/hierarchical.st"; then
  pass "auto with a model that predicts flat faster: $(grep -o 'parallel.allreduce=auto: flat ([^)]*)' "$dir/autoflat.log" | head -1), same bits"
else fail "auto with a slow hierarchical line did not pick flat (or not over shared memory): $(grep -m1 'allreduce=auto' "$dir/autoflat.log"); over $(routing "$dir/autoflat.log")"; fi
python3 -c 'import json,sys; f=json.load(open(sys.argv[1])); f["ranks"]=8; json.dump(f,open(sys.argv[1]+".other","w"))' "$dir/fit22.json.slowhier"
timeout 120 "${mpi[@]}" -n 4 "${node2[@]}" "$bin" train "${common[@]}" --steps 4 --set parallel.comm_model="$dir/fit22.json.slowhier.other" \
  >"$dir/autoother.log" 2>&1 || fail "2 x 2 run with an 8-rank model: $(tail -2 "$dir/autoother.log")"
if grep -q "parallel.allreduce=auto: hierarchical (.*fitted on 8 ranks x 2 nodes" "$dir/autoother.log" \
   && [ "$(routing "$dir/autoother.log")" = "shared memory inside nodes, hierarchical all-reduce across them" ]; then
  pass "a model fitted on another layout (8 ranks x 2 nodes) chooses nothing: the default, hierarchical"
else fail "a model of another layout was used to choose (or not over shared memory): $(grep -m1 'allreduce=auto' "$dir/autoother.log"); over $(routing "$dir/autoother.log")"; fi

timeout 60 "${mpi[@]}" -n 2 "$bin" train "${common[@]}" --steps 4 --set parallel.allreduce=hierarchical >"$dir/h1.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "parallel.allreduce=hierarchical needs several nodes" "$dir/h1.log"; then
  pass "parallel.allreduce=hierarchical on one node refused (rc $rc): $(grep -o 'parallel.allreduce=hierarchical needs[^(]*' "$dir/h1.log" | head -1)"
else fail "hierarchical on one node (rc $rc): $(tail -2 "$dir/h1.log")"; fi

echo "test_shm_cleanup: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
