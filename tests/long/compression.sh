#!/usr/bin/env bash
# Gradient compression convergence (issue 14): the demo job (configs/demo.yaml: a 4-layer
# byte-level GPT on the Debian fortunes corpus, validation every 100 steps) on 2 ranks, DDP
# uncompressed vs parallel.compression=topk at 1% (parallel.compression_ratio=0.01, error
# feedback, AdamW by age, after 100 uncompressed warm-up steps); the final validation loss of
# Top-K must be within 2% of the uncompressed run's,
# and both must have improved on their step-0 validation loss by at least 30%. About 3-4
# minutes per run on 2 cores at the default 1000 steps.
#   tests/long/compression.sh BIN DIR [STEPS [WARMUP [RATIO [ADAM]]]]
# STEPS < 1000: a quicker look (the 30% bar is the 1000-step one); WARMUP: the uncompressed
# steps first (parallel.compression_warmup, default 100 = 10% of the run; 0: Top-K throughout);
# RATIO: parallel.compression_ratio (default 0.01, the issue's); ADAM:
# parallel.compression_adam (default age, the default of the key; plain: the rule before).
# Measured (decision 44; uncompressed 1.919 at 1000 steps): with AdamW by age Top-K 1% ends at
# 1.950 (+1.65%) after 100 warm-up steps - it passes - and at 1.973 (+2.8%, fails) after 50;
# 10% after 50: 1.905 (-0.7%). With ADAM=plain and 50 warm-up steps: 1% 2.536 (+32%), 10%
# 2.040 (+6.3%). The dense warm-up steps send everything: over the whole run 100 of them leave
# Top-K 1% (66.5x fewer bytes per step) at about 8.8x fewer bytes than uncompressed, 50 at 15.6x.
set -uo pipefail
bin=$1
dir=$2
steps=${3:-1000}
warmup=${4:-100}
ratio=${5:-0.01}
adam=${6:-age}
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$src/tests/lib.sh"
rm -rf "$dir" && mkdir -p "$dir"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
corpus=/usr/share/games/fortunes
mapfile -t files < <(find "$corpus" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' ! -name '*art' | sort)
[ ${#files[@]} -gt 0 ] || fail "no fortune files in $corpus (install package fortunes)"
"$bin" prepare --tokenizer byte --doc-sep % --val-fraction 0.05 --out "$dir/fortunes" "${files[@]}" >"$dir/prepare.log" 2>&1 ||
  fail "prepare: $(tail -2 "$dir/prepare.log")"
for c in none topk; do
  ( cd "$src" && "$bin" launch -n 2 -- train configs/demo.yaml --set training.steps=$steps \
      --set parallel.compression=$c --set parallel.compression_ratio=$ratio --set parallel.compression_warmup=$warmup \
      --set parallel.compression_adam=$adam \
      --set data.train="$dir/fortunes_train_*.bin" --set data.val="$dir/fortunes_val_*.bin" \
      --set checkpoint.dir= --set logging.metrics="$dir/$c.jsonl" --set logging.progress=lines ) \
    >"$dir/$c.log" 2>&1 || fail "$c run: $(tail -2 "$dir/$c.log")"
done
out=$(/usr/bin/python3 - "$dir" "$steps" <<'PY'
import json, sys
d, steps = sys.argv[1], int(sys.argv[2])
def evals(p):
    return [json.loads(l) for l in open("%s/%s.jsonl" % (d, p)) if '"type":"eval"' in l]
e = {p: evals(p) for p in ("none", "topk")}
ref = e["none"][-1]["val_loss"]
ok, msg = True, []
for p, ev in e.items():
    first, last = ev[0]["val_loss"], ev[-1]["val_loss"]
    rel = (last - ref) / ref
    good = ev[-1]["step"] == steps and (steps < 1000 or last < 0.7 * first) and abs(rel) <= 0.02
    ok &= good
    msg.append("%s val loss %.4f -> %.4f at step %d (%+.2f%% vs uncompressed)%s"
               % (p, first, last, ev[-1]["step"], 100 * rel, "" if good else " BAD"))
print("; ".join(msg))
sys.exit(0 if ok else 1)
PY
) && pass "compression convergence: $out" || fail "compression convergence: $out"
echo "compression: $fails failure(s)"
[ $fails -eq 0 ]
