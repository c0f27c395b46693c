#!/usr/bin/env bash
# The Python test helpers fail on what they exist to catch. Tiny metrics.jsonl and safetensors
# files written here, then:
#  - tests/ref/compare_runs.py (every resume, reshard and N-rank test compares runs with it)
#    passes a correct copy (bitwise at TOL 0; one rounding off at TOL 1e-5) and fails on an
#    all-NaN tensor (in either run, also with losses-only and --normwise), one Inf, one small
#    element 100% wrong (which the normwise measure alone passes: --normwise shows it), a NaN
#    or null loss, a loss off by 2x TOL, and different steps;
#  - tests/ref/lora_ref.py's compare() (the LoRA oracle's verdict) the same on adapter
#    gradients and the loss, and tests/ref/tensor_check.py's measures themselves.
# The C helpers (testutil's tu_compare, tu_rel_err, tu_worse) are checked in test_testutil.
#   test_helpers.sh
set -uo pipefail
. "$(dirname "$0")/lib.sh"
tmp_dir
cd "$dir"
py=/usr/bin/python3

# ref: 3 steps of losses and two tensors, the second with one element 1e-4 of its largest.
$py - <<'PY' || { echo "FAIL cannot write the files"; exit 1; }
import json, struct
import numpy as np
def st(path, ts):
    hdr, off, blobs = {}, 0, []
    for k, v in ts.items():
        b = np.asarray(v, dtype="<f4").tobytes()
        hdr[k] = {"dtype": "F32", "shape": [len(v)], "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
def metrics(path, losses):
    with open(path, "w") as f:
        for s, l in enumerate(losses, 1):
            f.write('{"type":"step","step":%d,"loss":%s,"lr":0.001}\n' % (s, l))
rng = np.random.default_rng(5)
w = {"wte": rng.uniform(-0.1, 0.1, 96), "bias": rng.uniform(-1, 1, 32)}
w["bias"][0], w["bias"][7] = 1.0, 1e-4
st("ref.st", w)
metrics("ref.jsonl", ["5.5", "5.25", "5.125"])
st("copy.st", w)
metrics("copy.jsonl", ["5.5", "5.25", "5.125"])
st("round.st", {k: v * (1 + 1e-7) for k, v in w.items()})  # one rounding off: not bitwise
st("nan.st", {"wte": np.full(96, np.nan), "bias": w["bias"]})
st("inf.st", {"wte": w["wte"], "bias": np.where(np.arange(32) == 3, np.inf, w["bias"])})
bad = dict(w, bias=w["bias"].copy())
bad["bias"][7] = 2e-4  # 100% wrong, 1e-4 of the tensor's largest
st("small.st", bad)
metrics("nanloss.jsonl", ["5.5", "NaN", "5.125"])
metrics("nullloss.jsonl", ["5.5", "5.25", "null"])
metrics("offloss.jsonl", ["5.5", "5.25", repr(5.125 * (1 + 2e-5))])
metrics("steps.jsonl", ["5.5", "5.25"])
PY

# expect OK|FAIL LABEL ARGS...: compare_runs.py's verdict (exit status) is the one expected.
expect() {
  local want=$1 label=$2 out rc
  shift 2
  out=$(cmp_runs "$@" 2>&1); rc=$?
  if { [ "$want" = OK ] && [ $rc -eq 0 ]; } || { [ "$want" = FAIL ] && [ $rc -eq 1 ]; }; then
    pass "compare_runs: $label: $(tr '\n' ' ' <<<"$out" | cut -c1-220)"
  else
    fail "compare_runs: $label: wanted $want, exit $rc: $out"
  fi
}
expect OK "a correct copy, bitwise (TOL 0)" copy.jsonl copy.st ref.jsonl ref.st 0
expect OK "a correct copy (TOL 1e-5)" copy.jsonl copy.st ref.jsonl ref.st 1e-5
expect OK "one rounding off (TOL 1e-5)" copy.jsonl round.st ref.jsonl ref.st 1e-5
expect FAIL "one rounding off is not bitwise (TOL 0)" copy.jsonl round.st ref.jsonl ref.st 0
expect FAIL "an all-NaN tensor (TOL 1e-5)" copy.jsonl nan.st ref.jsonl ref.st 1e-5
expect FAIL "an all-NaN tensor (TOL 0)" copy.jsonl nan.st ref.jsonl ref.st 0
expect FAIL "an all-NaN tensor (TOL 1e-5, losses-only)" copy.jsonl nan.st ref.jsonl ref.st 1e-5 losses-only
expect FAIL "an all-NaN tensor (TOL 1e-5, --normwise)" copy.jsonl nan.st ref.jsonl ref.st 1e-5 --normwise
expect FAIL "an all-NaN tensor in the reference" copy.jsonl ref.st ref.jsonl nan.st 1e-5
expect FAIL "an all-NaN tensor in both runs, bitwise equal (TOL 0)" copy.jsonl nan.st ref.jsonl nan.st 0
expect FAIL "one Inf (TOL 1e-3)" copy.jsonl inf.st ref.jsonl ref.st 1e-3
expect FAIL "one small element 100% wrong (TOL 1e-4: elementwise)" copy.jsonl small.st ref.jsonl ref.st 1e-4
expect OK "one small element 100% wrong passes the normwise measure alone (--normwise)" \
  copy.jsonl small.st ref.jsonl ref.st 1e-4 --normwise
expect FAIL "a NaN loss (TOL 1e-5)" nanloss.jsonl copy.st ref.jsonl ref.st 1e-5
expect FAIL "a NaN loss (TOL 1e-5, losses-only)" nanloss.jsonl copy.st ref.jsonl ref.st 1e-5 losses-only
expect FAIL "a null (non-finite) loss (TOL 0)" nullloss.jsonl copy.st ref.jsonl ref.st 0
expect FAIL "a NaN loss in the reference" copy.jsonl copy.st nanloss.jsonl ref.st 1e-5
expect FAIL "a loss off by 2e-5 (TOL 1e-5)" offloss.jsonl copy.st ref.jsonl ref.st 1e-5
expect OK "a loss off by 2e-5 (TOL 1e-4)" offloss.jsonl copy.st ref.jsonl ref.st 1e-4
expect FAIL "a step missing" steps.jsonl copy.st ref.jsonl ref.st 1e-5

# lora_ref.compare and tensor_check: one line per case, "LABEL<TAB>0|1" (1: as expected).
if out=$($py - "$src/tests/ref" <<'PY' 2>&1
import math, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import tensor_check as tc
from lora_ref import GRAD_TOL, LOSS_TOL, compare
rng = np.random.default_rng(9)
refs = {"l.lora_A.weight": rng.uniform(-1, 1, (4, 16)), "l.lora_B.weight": rng.uniform(-1e-2, 1e-2, (16, 4))}
good = {k: v * (1 + 1e-7) for k, v in refs.items()}
def case(label, loss, grads, want_fail, refs=refs, want_loss=5.0):
    f, le, worst = compare(loss, want_loss, grads, refs)
    print("%s: %s\t%d" % (label, "; ".join(f) or "no failure", bool(f) == want_fail))
def changed(name, fn):
    g = {k: v.copy() for k, v in good.items()}
    fn(g[name])
    return g
case("a correct copy", 5.0 * (1 + 1e-7), good, False)
case("an all-NaN gradient", 5.0, changed("l.lora_B.weight", lambda a: a.fill(np.nan)), True)
case("one NaN element", 5.0, changed("l.lora_A.weight", lambda a: a.__setitem__((2, 3), np.nan)), True)
case("one Inf element", 5.0, changed("l.lora_B.weight", lambda a: a.__setitem__((0, 0), -np.inf)), True)
# 5e-5 of the tensor's largest, 100% off: normwise 5e-5 <= GRAD_TOL, the elementwise check fails
small = {k: v.copy() for k, v in refs.items()}
small["l.lora_A.weight"][1, 1] = 5e-5 * np.abs(small["l.lora_A.weight"]).max()
g = {k: v.copy() for k, v in small.items()}
g["l.lora_A.weight"][1, 1] *= 2
n, e, i = tc.errors(g["l.lora_A.weight"], small["l.lora_A.weight"], GRAD_TOL, 0)
print("(normwise %.1e passes GRAD_TOL %g alone)\t%d" % (n, GRAD_TOL, n <= GRAD_TOL))
case("one small element 100% wrong", 5.0, g, True, refs=small)
case("a NaN loss", math.nan, good, True)
case("an Inf loss", math.inf, good, True)
case("a loss off by 2x LOSS_TOL", 5.0 * (1 + 2 * LOSS_TOL), good, True)
case("a NaN reference gradient", 5.0, good, True, refs=changed("l.lora_A.weight", lambda a: a.fill(np.nan)))
case("a missing gradient", 5.0, {"l.lora_A.weight": good["l.lora_A.weight"]}, True)
# tensor_check's measures: NaN is an infinite error, never small; the running maximum keeps it
print("tensor_check.errors: NaN\t%d" % (tc.errors([1.0, math.nan], [1.0, 2.0], 1e-3, 0)[0] == math.inf))
print("tensor_check.close: NaN, Inf, one small element\t%d" % (
    not tc.close([math.nan], [1.0], 1e-3, 0) and not tc.close([1.0, math.inf], [1.0, 1.0], 1e-3, 0)
    and not tc.close([1.0, 2e-4], [1.0, 1e-4], 1e-3, 1e-9) and tc.close([1.0, 1e-4], [1.0, 1e-4], 1e-3, 0)))
print("tensor_check.scalar_rel: NaN, None, Inf\t%d" % all(
    tc.scalar_rel(a, b) == math.inf for a, b in ((math.nan, 1.0), (1.0, math.nan), (None, 1.0), (math.inf, 1.0))))
print("tensor_check.worse keeps NaN (max() drops it)\t%d" % (
    tc.worse(0.5, math.nan) == math.inf and max(0.5, math.nan) == 0.5))
PY
); then
  while IFS=$'\t' read -r label good; do
    if [ "$good" = 1 ]; then pass "lora_ref/tensor_check: $label"; else fail "lora_ref/tensor_check: $label"; fi
  done <<<"$out"
  [ "$(grep -c $'\t' <<<"$out")" -eq 15 ] || fail "lora_ref/tensor_check: $(grep -c $'\t' <<<"$out") of 15 cases ran: $out"
else
  fail "lora_ref/tensor_check: $out"
fi

echo "$test_name: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
