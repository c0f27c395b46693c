#!/usr/bin/env bash
# The seed-004 benchmark at small scale: QLoRA fine-tuning of a small LLaMA (4 layers,
# d_model 256, 8 heads / 4 KV heads, SwiGLU 688, vocabulary 512, 128 tokens) with LoRA rank
# 16 (alpha 32) on q,k,v,o,gate,up,down over an NF4 base (lora.base_dtype=nf4), DDP on
#   1 rank, 2 ranks on one node (mpiexec -n 2), 4 ranks = 2 simulated nodes x 2 ranks
#   (scripts/mnhosts.sh: network namespaces; needs root, else that row is skipped, said so).
# The base is a short pre-train of the same model (BASE_STEPS steps on synthetic tokens,
# saved with --save-weights and read through model.init_from: quantized to NF4 at load);
# the fine-tuning data are synthetic tokens too (throughput does not depend on them).
# One `dtrain bench --json` per configuration (weak scaling: micro-batch per rank fixed),
# priced with configs/prices.yaml (instance INSTANCE, per node). Prints the seed's table:
#   config, ranks, nodes, samples/s, tokens/s, scaling efficiency (tokens/s per rank vs the
#   1-rank run), communication overhead (exposed communication / step), time and cost for
#   10K samples (10000 / samples/s; hours x the instance's on-demand $/hour x nodes),
#   trainable parameters (bench JSON model.trainable_params: the adapters), gradient bytes
#   per step (trainable x 4: fp32 adapter gradients) and bytes rank 0 sent per step
#   (summary.comm_bytes_step),
# then `dtrain report` over the JSON files (OUT/report.html).
#   bash bench/qlora.sh build/dtrain [OUT_DIR]
# Env: STEPS (timed steps, default 30), WARMUP (5), REPEATS (3), MB (micro-batch, 8),
#      BASE_STEPS (50), THREADS (OpenMP threads per rank, 1), INSTANCE (c7i.xlarge),
#      PEAK (GFLOP/s per rank for MFU; unset: measured), NODES2 (0: skip the 2-node row).
set -euo pipefail
bin=$(readlink -f "${1:-build/dtrain}")
src=$(cd "$(dirname "$0")/.." && pwd)
out=${2:-$(mktemp -d)}
mkdir -p "$out"
out=$(readlink -f "$out")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=${THREADS:-1}
model=(--set model.preset= --set model.family=llama --model.n_layer 4 --model.d_model 256 --model.n_head 8
       --set model.n_kv_head=4 --set model.d_ff=688 --model.vocab_size 512 --model.context 128 --seq 128
       --batch "${MB:-8}")
qlora=(--set model.init_from="$out/base.st" --set lora.rank=16 --set lora.alpha=32
       --set lora.targets=q,k,v,o,gate,up,down --set lora.base_dtype=nf4)
bench=(--warmup-steps "${WARMUP:-5}" --bench-steps "${STEPS:-30}" --repeats "${REPEATS:-3}"
       --prices "$src/configs/prices.yaml" --instance "${INSTANCE:-c7i.xlarge}")
[ -n "${PEAK:-}" ] && bench+=(--peak "$PEAK")

echo "# host: $(grep -o -w 'avx512[a-z_0-9]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc --all) cores, $OMP_NUM_THREADS thread(s) per rank; files in $out"
"$bin" train "${model[@]}" --steps "${BASE_STEPS:-50}" --lr 3e-3 --seed 1 --save-weights "$out/base.st" \
  >"$out/base.log" 2>&1 || { echo "base pre-training FAILED: $(tail -3 "$out/base.log")"; exit 1; }

run() { # NAME LAUNCH...: one bench, its JSON in OUT/NAME.json
  local name=$1; shift
  "$@" "$bin" bench "${model[@]}" "${qlora[@]}" "${bench[@]}" --json "$out/$name.json" >"$out/$name.log" 2>&1 \
    || { echo "$name FAILED: $(tail -3 "$out/$name.log")"; exit 1; }
}
run qlora-1rank env
run qlora-2ranks mpiexec --oversubscribe --bind-to none -x OMP_NUM_THREADS -n 2
if [ "${NODES2:-1}" != 0 ] && [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
  mn=$src/scripts/mnhosts.sh
  export MN_PREFIX=dtmnb- MN_STATE=${TMPDIR:-/tmp}/dtrain-mn-bench
  trap '"$mn" down >/dev/null 2>&1 || true' EXIT
  "$mn" up 2 >/dev/null
  run qlora-2nodes "$mn" mpirun --host h1:2,h2:2 -n 4 -x OMP_NUM_THREADS
else
  echo "# 2 nodes x 2 ranks skipped (needs root and iproute2 for scripts/mnhosts.sh, or NODES2=0)"
fi

python3 - "$out" <<'PY'
import glob, json, os, sys
rows = []
for p in sorted(glob.glob(os.path.join(sys.argv[1], "qlora-*.json"))):
    b = json.load(open(p))
    rows.append((os.path.basename(p)[:-5], b))
rows.sort(key=lambda r: r[1]["parallel"]["world"])
base = next((b for _, b in rows if b["parallel"]["world"] == 1), None)
b0 = rows[0][1]
lo = b0["model"].get("lora", {})
print("# QLoRA rank %s (alpha %g, targets %s, base %s): %d model parameters; micro-batch %d x %d tokens per rank"
      % (lo.get("rank"), lo.get("alpha", 0), lo.get("targets"), lo.get("base_dtype"), b0["model"]["params"],
         b0["parallel"]["micro_batch"], b0["model"]["seq_len"]))
print("# price: %s, $%.4f/hour per node (on-demand, configs/prices.yaml)" % (b0["cost"][0]["instance"], b0["cost"][0]["price_hour"]))
hdr = ("config", "ranks", "nodes", "samples/s", "tokens/s", "scaling_eff", "comm_overhead", "time_10K_s",
       "cost_10K_$", "trainable", "grad_bytes/step", "sent_bytes/step")
print("%-14s %5s %5s %10s %10s %11s %13s %10s %10s %10s %15s %15s" % hdr)
for name, b in rows:
    s, m, cost, world, nodes = b["summary"], b["model"], b["cost"][0], b["parallel"]["world"], b["environment"]["nodes"]
    sps, tps = s["samples_per_s"]["mean"], s["tokens_per_s"]["mean"]
    eff = s["tokens_per_s_rank"]["mean"] / base["summary"]["tokens_per_s_rank"]["mean"] if base else float("nan")
    t10k = 10000.0 / sps
    usd = t10k / 3600.0 * cost["price_hour"] * nodes
    assert cost["nodes"] == nodes, (cost, nodes)
    print("%-14s %5d %5d %10.1f %10.0f %10.1f%% %12.2f%% %10.1f %10.5f %10d %15d %15d"
          % (name, world, nodes, sps, tps, 100 * eff, 100 * s["comm_overhead"], t10k, usd, m["trainable_params"],
             4 * m["trainable_params"], s["comm_bytes_step"]))
PY
"$bin" report "$out"/qlora-*.json -o "$out/report.html" >"$out/report.log" 2>&1 \
  && echo "# report: $out/report.html" || { echo "report FAILED: $(tail -3 "$out/report.log")"; exit 1; }
