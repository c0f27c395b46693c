#!/usr/bin/env bash
# make demo: train a small GPT on this machine and show the loss falling. Until the data
# pipeline lands (tokenizers, real corpus), the corpus is a token shard generated from a
# simple periodic grammar, so the loss visibly drops well below the uniform ln(256).
set -euo pipefail
bin=$1
dir=${DEMO_DIR:-build/demo}
mkdir -p "$dir"
/usr/bin/python3 - "$dir/demo.bin" <<'PY'
import random, struct, sys
random.seed(0)
words = [w.encode() for w in "the cat sat on a mat while dogs ran past small red houses".split()]
buf = bytearray()
while len(buf) < 200000:
    buf += b" ".join(random.choice(words) for _ in range(8)) + b".\n"
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(buf), *([0] * 253)))
    f.write(struct.pack("<%dH" % len(buf), *buf))
PY
echo "demo: training gpt2-tiny (byte vocabulary) on $dir/demo.bin"
"$bin" train --model gpt2-tiny --data "$dir/demo.bin" --steps 200 --batch 16 --seq 64 \
  --lr 3e-3 --warmup 20 --set logging.every=20
