#!/usr/bin/env bash
# Load balance of the mixture of experts (docs/benchmarks.md, issue 34): 300 steps on the fortunes
# bytes with expert parallelism 2 on 2 ranks, at Mixtral's aux-loss coefficient 0.02, for each
# training.moe_aux_loss_type given (default: global layer); prints the worst layer's max/mean
# expert load along the way and writes OUT/TYPE.st (the trained weights, for throughput.sh).
# Usage: bash bench/moe/load_balance.sh BUILD/dtrain OUT [TYPE...]
set -euo pipefail
bin=$1 out=$2; shift 2

[ $# -gt 0 ] && types=("$@") || types=(global layer)
. "$(dirname "$0")/common.sh"
mkdir -p "$out"
fortunes "$out"
for t in "${types[@]}"; do
  mpirun2 "$bin" train "${E[@]}" "${MOE[@]}" "${B[@]}" --steps 300 --lr 1e-3 --warmup 20 --set parallel.ep=2 \
    --set data.train="$out/fortunes_train_*.bin" --set data.tokenizer=byte --set training.moe_aux_loss_coef=0.02 \
    --set training.moe_aux_loss_type="$t" --set logging.every=1 --set logging.metrics="$out/$t.jsonl" \
    --set logging.progress=lines --save-weights "$out/$t.st" >"$out/$t.log" 2>&1
  /usr/bin/python3 - "$out/$t.jsonl" "$t" <<'PY'
import json, statistics, sys
r = [j for j in map(json.loads, open(sys.argv[1])) if j.get("type") == "step"]
pts = [1, 50, 100, 150, 200, 250, 300]
print(f"{sys.argv[2]}: max/mean at steps {pts}: " + ", ".join(f"{r[s - 1]['moe_load_max_mean']:.2f}" for s in pts)
      + f"; mean 251-300 {statistics.mean(j['moe_load_max_mean'] for j in r[250:300]):.2f}"
      + f" (worst {max(j['moe_load_max_mean'] for j in r[250:300]):.2f}); ce at 300 {r[299]['ce_loss']:.3f}")
PY
done
