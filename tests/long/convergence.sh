#!/usr/bin/env bash
# Mixed-precision convergence (issue 12): the demo job (configs/demo.yaml: a 4-layer byte-level
# GPT on the Debian fortunes corpus, 1000 steps, validation every 100) trained in fp32, bf16
# and fp16 on one process with the demo's global batch (micro_batch 16); the final validation
# loss of bf16 and fp16 must be within 1% of fp32's, and every run must have improved on its
# step-0 validation loss by at least 30%. About 3 minutes per run on 2 cores.
#   tests/long/convergence.sh BIN DIR
set -uo pipefail
bin=$1
dir=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$src/tests/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
corpus=/usr/share/games/fortunes
mapfile -t files < <(find "$corpus" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name '*art' | sort)
[ ${#files[@]} -gt 0 ] || fail "no fortune files in $corpus (install package fortunes)"
"$bin" prepare --tokenizer byte --doc-sep % --val-fraction 0.05 --out "$dir/fortunes" "${files[@]}" >"$dir/prepare.log" 2>&1 ||
  fail "prepare: $(tail -2 "$dir/prepare.log")"
for p in fp32 bf16 fp16; do
  ( cd "$src" && "$bin" train configs/demo.yaml --set training.micro_batch=16 --set training.precision=$p \
      --set data.train="$dir/fortunes_train_*.bin" --set data.val="$dir/fortunes_val_*.bin" \
      --set checkpoint.dir= --set logging.metrics="$dir/$p.jsonl" --set logging.progress=lines ) \
    >"$dir/$p.log" 2>&1 || fail "$p run: $(tail -2 "$dir/$p.log")"
done
out=$(/usr/bin/python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def evals(p):
    return [json.loads(l) for l in open("%s/%s.jsonl" % (d, p)) if '"type":"eval"' in l]
ok, msg = True, []
e = {p: evals(p) for p in ("fp32", "bf16", "fp16")}
ref = e["fp32"][-1]["val_loss"]
for p, ev in e.items():
    first, last = ev[0]["val_loss"], ev[-1]["val_loss"]
    rel = abs(last - ref) / ref
    good = ev[-1]["step"] == 1000 and last < 0.7 * first and rel <= 0.01
    ok &= good
    msg.append("%s val loss %.4f -> %.4f at step %d (%.2f%% from fp32)%s" % (p, first, last, ev[-1]["step"], 100 * rel, "" if good else " BAD"))
print("; ".join(msg))
sys.exit(0 if ok else 1)
PY
) && pass "convergence: $out" || fail "convergence: $out"
echo "convergence: $fails failure(s)"
[ $fails -eq 0 ]
