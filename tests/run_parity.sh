#!/usr/bin/env bash
# PyTorch parity: parity_dump writes dtrain's weights, batches and results; the PyTorch
# oracle (Debian's python3-torch, float64) rebuilds the model and compares.
set -euo pipefail
dump=$1
out=$2
rm -rf "$out" && mkdir -p "$out"
OMP_NUM_THREADS=2 "$dump" "$out"
exec /usr/bin/python3 "$(dirname "$0")/ref/gpt2_ref.py" "$out"
