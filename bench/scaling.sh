#!/usr/bin/env bash
# Data-parallel benchmarks, each a ratio measured in the same run:
#   1. dtrain DDP vs PyTorch DDP (gloo), 2 processes x 1 thread, bench-small (b=8/rank) and
#      gpt2 (b=4/rank), context 256, fp32;
#   2. weak scaling of bench-small (b=8/rank): 2 ranks x 1 thread vs 1 rank x 1 thread,
#      overlap on and off, with exposed communication time, and vs two independent 1-rank runs
#      at once (the machine as loaded, nothing communicated: vs_loaded);
#   3. ZeRO-1/2/3 step time relative to DDP (2 ranks, bench-small) and bytes each rank sends
#      per step next to the theory (2(n-1)/n Psi for DDP/ZeRO-1/2, 3(n-1)/n Psi for ZeRO-3).
#   bash bench/scaling.sh build/dtrain [sections...]   (sections: peer weak zero; default all)
# Env: STEPS (timed steps, default 5), WARMUP (default 2), ROUNDS (weak: default 3).
# DTRAIN_ISA=avx2: dtrain runs its AVX2 kernels (oneDNN capped at AVX2) and PyTorch is capped
# alike (ATen AVX2 kernels, OpenBLAS Haswell, oneDNN AVX2), as bench/compare.sh does: an
# AVX2-only CPU emulated on this one.
set -euo pipefail
bin=${1:-build/dtrain}
shift || true
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(peer weak zero)
steps=${STEPS:-5}
warmup=${WARMUP:-2}
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1)
peer_env=()
if [ "${DTRAIN_ISA:-}" = avx2 ]; then
  mpi+=(-x DTRAIN_ISA)
  peer_env=(ATEN_CPU_CAPABILITY=avx2 OPENBLAS_CORETYPE=Haswell DNNL_MAX_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=AVX2)
  echo "# DTRAIN_ISA=avx2: PyTorch runs with ${peer_env[*]}"
fi

# dtrain_bench RANKS MODEL BATCH [args...] -> "tokens/s median_ms exposed_ms total_ms MB_sent"
dtrain_bench() {
  local n=$1 model=$2 b=$3; shift 3
  local out
  out=$(OMP_NUM_THREADS=1 "${mpi[@]}" -n "$n" "$bin" bench --model "$model" --batch "$b" --seq 256 \
        --lr 3e-4 --threads 1 --warmup-steps "$warmup" --bench-steps "$steps" --peak 105 "$@")
  local row comm
  grep -m1 '^# kernels ' <<<"$out" | sed "s/^# /  [$model, $n rank(s)] /" >&2 # the kernel path that ran
  row=$(grep -A1 '^# median_ms' <<<"$out" | tail -1)
  comm=$(grep 'communication per step' <<<"$out" || true)
  local exp=0 tot=0 mb=0
  if [ -n "$comm" ]; then
    tot=$(sed -E 's/.*step: ([0-9.]+) ms in collectives.*/\1/' <<<"$comm")
    exp=$(sed -E 's/.*, ([0-9.]+) ms exposed.*/\1/' <<<"$comm")
    mb=$(sed -E 's/.*, ([0-9.]+) MB sent.*/\1/' <<<"$comm")
  fi
  echo "$(awk '{print $5, $1}' <<<"$row") $exp $tot $mb"
}

torch_ddp() { # MODEL BATCH RANKS -> tokens/s
  env "${peer_env[@]}" /usr/bin/python3 "$here/pytorch_gpt2.py" --model "$1" --batch "$2" --seq 256 --threads 1 \
    --ddp "$3" --warmup "$warmup" --steps "$steps" --json \
    | /usr/bin/python3 -c 'import json,sys; j = json.load(sys.stdin); print("%.1f" % j["tokens_per_s"])
print("  [pytorch %s] ATen kernels: %s" % (j["model"], j.get("cpu_capability")), file=sys.stderr)'
}

for s in "${sections[@]}"; do
  case $s in
  peer)
    echo "## dtrain DDP vs PyTorch DDP (gloo), 2 processes x 1 thread"
    printf '# %-12s %-6s %-14s %-14s %-8s\n' workload b/rank dtrain_tok/s pytorch_tok/s ratio
    for w in bench-small:8 gpt2:4; do
      m=${w%%:*} b=${w##*:}
      read -r d _ _ _ _ <<<"$(dtrain_bench 2 "$m" "$b")"
      p=$(torch_ddp "$m" "$b" 2)
      printf '  %-12s %-6s %-14s %-14s %-8s\n' "$m" "$b" "$d" "$p" "$(awk -v a="$d" -v b="$p" 'BEGIN{printf "%.2f", a/b}')"
    done ;;
  weak)
    # efficiency: vs 2 x one rank alone (the other core idle); vs_loaded: vs two independent
    # 1-rank runs at once, the machine as busy as under the 2-rank run but nothing communicated
    # (on one machine the ranks share its cache, memory bus and clock, which an idle core does not).
    # ROUNDS rounds (default 3), each every config once in turn: this host's speed drifts by 8-25%
    # over minutes, so each round's ratios compare runs minutes apart, and the summary
    # is the median of the rounds' ratios.
    rounds=${ROUNDS:-3}
    echo "## weak scaling, bench-small, b=8 per rank, 1 thread per rank, $rounds round(s)"
    printf '# %-5s %-26s %-12s %-10s %-12s %-12s %-10s %-10s\n' round config tokens/s step_ms exposed_ms comm_ms efficiency vs_loaded
    eff_on=() eff_off=() vl_on=() vl_off=() eff_pair=()
    for ((r = 1; r <= rounds; r++)); do
      read -r t1 s1 _ _ _ <<<"$(dtrain_bench 1 bench-small 8)"
      printf '  %-5s %-26s %-12s %-10s %-12s %-12s %-10s %-10s\n' "$r" "1 rank" "$t1" "$s1" 0 0 1.000 -
      pair=$(mktemp -d)
      dtrain_bench 1 bench-small 8 >"$pair/a" &
      first=$!
      dtrain_bench 1 bench-small 8 >"$pair/b"
      wait "$first" # (a failed run stops the script, as every other run does)
      read -r ta sa _ _ _ <"$pair/a"
      read -r tb _ _ _ _ <"$pair/b"
      rm -rf "$pair"
      tl=$(awk -v a="$ta" -v b="$tb" 'BEGIN{printf "%.1f", a + b}')
      e=$(awk -v a="$tl" -v b="$t1" 'BEGIN{printf "%.3f", a/(2*b)}')
      eff_pair+=("$e")
      printf '  %-5s %-26s %-12s %-10s %-12s %-12s %-10s %-10s\n' "$r" "2 x 1 rank at once (sum)" "$tl" "$sa" 0 0 "$e" 1.000
      for ov in true false; do
        read -r t2 s2 e2 c2 _ <<<"$(dtrain_bench 2 bench-small 8 --set parallel.overlap=$ov)"
        e=$(awk -v a="$t2" -v b="$t1" 'BEGIN{printf "%.3f", a/(2*b)}')
        v=$(awk -v a="$t2" -v b="$tl" 'BEGIN{printf "%.3f", a/b}')
        if [ "$ov" = true ]; then eff_on+=("$e"); vl_on+=("$v"); else eff_off+=("$e"); vl_off+=("$v"); fi
        printf '  %-5s %-26s %-12s %-10s %-12s %-12s %-10s %-10s\n' "$r" "2 ranks, overlap $ov" "$t2" "$s2" "$e2" "$c2" "$e" "$v"
      done
    done
    med() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
    echo "# median over $rounds round(s): efficiency (vs_loaded)"
    printf '  %-32s %s\n' "2 x 1 rank at once" "$(med "${eff_pair[@]}")"
    printf '  %-32s %s (%s)\n' "2 ranks, overlap true" "$(med "${eff_on[@]}")" "$(med "${vl_on[@]}")"
    printf '  %-32s %s (%s)\n' "2 ranks, overlap false" "$(med "${eff_off[@]}")" "$(med "${vl_off[@]}")" ;;
  zero)
    echo "## ZeRO stages vs DDP, 2 ranks x 1 thread, bench-small b=8"
    # Psi = floats communicated: the padded vocabulary (50304) x 384 + positions 1024 x 384 +
    # 6 layers x (12 d^2 + 13 d) + ln_f 2d.
    psi=$(awk 'BEGIN{C=384; print 50304*C + 1024*C + 6*(12*C*C + 13*C) + 2*C}')
    printf '# %-8s %-12s %-10s %-10s %-12s %-14s\n' strategy tokens/s step_ms vs_ddp MB_sent theory_MB
    base=
    for st in ddp zero1 zero2 zero3; do
      read -r t s e c mb <<<"$(dtrain_bench 2 bench-small 8 --set parallel.strategy=$st)"
      [ -z "$base" ] && base=$s
      factor=2; [ "$st" = zero3 ] && factor=3
      theory=$(awk -v f=$factor -v p="$psi" 'BEGIN{printf "%.1f", f*(2-1)/2*p*4/1e6}')
      printf '  %-8s %-12s %-10s %-10s %-12s %-14s\n' "$st" "$t" "$s" "$(awk -v a="$s" -v b="$base" 'BEGIN{printf "%.3f", a/b}')" "$mb" "$theory"
    done ;;
  esac
done
