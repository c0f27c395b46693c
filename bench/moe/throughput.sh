#!/usr/bin/env bash
# Throughput of expert parallelism against the dense model of the same active width (issue 34,
# docs/benchmarks.md), on 2 ranks, PASSES (3) alternated passes of STEPS (40) training steps on
# the fortunes bytes: the dense model (d_ff 1024), the mixture of experts with every expert on
# both ranks, and with ep 2, both from WEIGHTS (a trained model's, e.g. load_balance.sh's
# layer.st: its routing, not initialisation's), lr 6e-5 constant; the median of steps 6-STEPS.
# Usage: bash bench/moe/throughput.sh BUILD/dtrain OUT WEIGHTS
set -euo pipefail
bin=$1 out=$2 w=$3
steps=${STEPS:-40} passes=${PASSES:-3}
. "$(dirname "$0")/common.sh"
mkdir -p "$out"
fortunes "$out"
C=("${B[@]}" --steps "$steps" --lr 6e-5 --warmup 0 --set schedule.kind=constant --set data.train="$out/fortunes_train_*.bin"
   --set data.tokenizer=byte --set logging.every=1 --set logging.progress=lines --set logging.peak_gflops=100)
M=("${MOE[@]}" --set model.init_from="$w" --set training.moe_aux_loss_type=layer --set training.moe_aux_loss_coef=0.02)
run() { local name=$1; shift; mpirun2 "$bin" train "${E[@]}" "${C[@]}" "$@" --set logging.metrics="$out/$name.jsonl" >"$out/$name.log" 2>&1; }
for p in $(seq "$passes"); do
  run "dense.$p" --set model.d_ff=1024
  run "moe.$p" "${M[@]}"
  run "ep.$p" "${M[@]}" --set parallel.ep=2
done
/usr/bin/python3 - "$out" "$passes" <<'PY'
import json, statistics as S, sys
o, P = sys.argv[1], int(sys.argv[2])
def st(name):
    r = [j for j in map(json.loads, open(f"{o}/{name}.jsonl")) if j.get("type") == "step"][5:]
    return (S.median(j["tokens_per_s"] for j in r), S.median(j.get("moe_load_max_mean", 0) for j in r),
            S.median(j.get("ep_comm_ms") or 0 for j in r), S.median(j["step_ms"] for j in r))
for p in range(1, P + 1):
    d, m, e = st(f"dense.{p}"), st(f"moe.{p}"), st(f"ep.{p}")
    print(f"pass {p}: dense {d[0]:.0f} tokens/s; MoE dp 2 {m[0]:.0f} ({m[0] / d[0]:.3f}); ep 2 {e[0]:.0f} "
          f"({e[0] / d[0]:.3f}), all-to-all {e[2]:.1f} of {e[3]:.0f} ms ({100 * e[2] / e[3]:.1f}%), load max/mean {e[1]:.2f}")
PY
