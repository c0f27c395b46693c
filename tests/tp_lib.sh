# Helpers of the model-parallel tests (tests/test_tp.sh, test_pp.sh, test_pp_moe.sh, test_cp.sh,
# test_ep.sh, test_ep_pp.sh, tests/long/tp.sh), sourced after lib.sh with these set: bin, dir, mpi (mpi_env),
# model and train (argument arrays).
run() { # NAME NRANKS [args...] (nohw=1: a run that trains nothing logs no high-water; ranks per
        # simulated node: PPN, 2 by default)
  local name=$1 n=$2; shift 2
  if [ "$n" = 1 ]; then
    "$bin" train "${model[@]}" "${train[@]}" --set logging.metrics="$dir/$name.jsonl" "$@" >"$dir/$name.log" 2>&1
  else
    timeout 300 "${mpi[@]}" -n "$n" bash -c 'DTRAIN_NODE_ID=node$((OMPI_COMM_WORLD_RANK / ${PPN:-2})) exec "$0" "$@"' \
      "$bin" train "${model[@]}" "${train[@]}" --set logging.metrics="$dir/$name.jsonl" "$@" >"$dir/$name.log" 2>&1
  fi || { fail "$name: $(tail -3 "$dir/$name.log")"; return 1; }
  [ -n "${nohw:-}" ] || grep -q "memory high-water: allocator=\([0-9]*\) plan=\1 " "$dir/$name.log" ||
    fail "$name: allocator high-water is not the plan: $(grep 'high-water' "$dir/$name.log")"
}
# compare A B MODE [N]: the steps B logged (N of them, 20 by default) against A's; MODE bitwise
# (losses and gradient norms identical) or a relative tolerance on the losses
compare() {
  /usr/bin/python3 - "$dir/$1.jsonl" "$dir/$2.jsonl" "$3" "${4:-20}" <<'PY'
import json, math, sys
def rows(p):  # an fp16 overflow step (skipped, its scale halved) logs a null norm: kept as "overflow"
    return {j["step"]: (j["loss"], "overflow" if j.get("overflow") else j["grad_norm"])
            for j in map(json.loads, open(p)) if j.get("step") and "loss" in j}
a, b, mode, want = rows(sys.argv[1]), rows(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if len(b) != want or not set(b) <= set(a): sys.exit(f"{len(b)} steps logged (want {want}), {len(a)} in the reference")
for s in b:
    if not all(v == "overflow" or math.isfinite(v) for v in a[s] + b[s]): sys.exit(f"step {s} non-finite: {a[s]} {b[s]}")
if mode == "bitwise":
    bad = [s for s in sorted(b) if a[s] != b[s]]
    if bad: sys.exit(f"steps {bad} differ: {a[bad[0]]} vs {b[bad[0]]}")
    print(f"{want} losses and gradient norms identical (steps {min(b)}-{max(b)}, last loss {b[max(b)][0]})")
else:
    tol = float(mode)
    err = max(abs(a[s][0] - b[s][0]) / abs(a[s][0]) for s in b)
    if not err <= tol: sys.exit(f"losses differ by {err:.3g} relative (> {tol})")
    print(f"{want} losses within {err:.3g} relative (<= {tol})")
PY
}
check() { # WHAT A B MODE [N]
  local out
  if out=$(compare "$2" "$3" "$4" "${5:-20}" 2>&1); then pass "$1: $out"; else fail "$1: $out"; fi
}
refused() { # WHAT NRANKS PATTERN ARGS...: the run stops before training, one line matching PATTERN
  local what=$1 n=$2 pat=$3; shift 3
  local out
  out=$(timeout 120 "${mpi[@]}" -n "$n" "$bin" train "${model[@]}" "${train[@]}" "$@" 2>&1)
  if [ $? -ne 0 ] && grep -q -- "$pat" <<<"$out"; then pass "refused: $what ($(grep -m1 -o -- "$pat.*" <<<"$out" | head -c 150))"
  else fail "$what: not refused as expected: $(tail -2 <<<"$out")"; fi
}
# A mixture of experts' numbers of every step of run NAME: cross-entropy, aux, z, dropped, and the
# expert load (decision 86: every layer's counts, each layer's sum the same), and two runs'
# compared exactly.
moe_rows() {
  /usr/bin/python3 -c "
import json, math, sys
rows = [(j['step'], j['ce_loss'], j['moe_aux_loss'], j['moe_z_loss'], j['moe_dropped'], j['moe_load'],
         j['moe_load_max_mean']) for j in map(json.loads, open(sys.argv[1])) if 'moe_aux_loss' in j]
assert rows and all(math.isfinite(v) for r in rows for v in r[1:4] + (r[6],)), rows
assert all(len({sum(x) for x in r[5]}) == 1 and sum(r[5][0]) > 0 for r in rows), rows
print(rows)" "$dir/$1.jsonl"
}
same_moe() { # WHAT A B
  local a b
  a=$(moe_rows "$2") b=$(moe_rows "$3")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$1: ce, aux, z, dropped choices and every layer's expert load of every step identical"
  else fail "$1: the router's numbers differ: ${a:0:200} vs ${b:0:200}"; fi
}
# grads_close WHAT REF OTHER...: every tensor of the gradient files OTHER (DTRAIN_TEST_SAVE_GRADS)
# within 1e-4 normwise of REF's (the context-parallel tests)
grads_close() {
  local what=$1 out; shift
  if out=$(/usr/bin/python3 - "$@" 2>&1 <<'PY'

import json, struct, sys
import numpy as np
def st(p):
    raw = open(p, "rb").read()
    n, = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32).astype(np.float64)
            for k, v in h.items()}
ref = st(sys.argv[1])
assert len(ref) >= 10
for p in sys.argv[2:]:
    got = st(p)
    assert set(got) == set(ref), p
    worst = 0.0
    for k, r in ref.items():
        g = got[k]
        assert np.all(np.isfinite(g)) and np.all(np.isfinite(r)), k
        nr = np.linalg.norm(r)
        assert nr > 0, k
        e = np.linalg.norm(g - r) / nr
        worst = max(worst, e)
        assert e <= 1e-4, (p, k, e)
    print(f"{p.rsplit('/', 1)[-1]}: worst tensor {worst:.2e}")
PY
  ); then pass "$what: $(echo $out)"; else fail "$what: $out"; fi
}
# A byte-level corpus of LINES numbered pangram lines, a document every EVERY of them, prepared
# into $dir/corpus_{train,val}_*.bin with VALFRAC of the documents held out (real data for the
# sampler, validation and checkpoints).
pangram_corpus() { # LINES EVERY VALFRAC
  printf '%s\n' "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs." \
    | awk -v n="$1" -v e="$2" '{for (i = 0; i < n; i++) { print $0 " " i; if (i % e == e - 1) print "%" }}' >"$dir/text.txt"
  "$bin" prepare --tokenizer byte --doc-sep % --val-fraction "$3" --out "$dir/corpus" "$dir/text.txt" >/dev/null 2>&1 ||
    fail "prepare the corpus"
}
# The validation losses run NAME logged, as a list.
evals() { /usr/bin/python3 -c "import json,sys; print([j['val_loss'] for j in map(json.loads, open(sys.argv[1])) if 'val_loss' in j])" "$dir/$1.jsonl"; }
