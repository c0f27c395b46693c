#!/usr/bin/env bash
# Instruction data end to end (`dtrain prepare --instruct`, loss masks):
#  - JSONL (prompt/response and chat messages) -> shards + .mask files: the counted tokens
#    are exactly the assistant turns and what closes them (chatml), checked from the files;
#  - training on them: 2 ranks == 1 rank x 2 micro-steps, bitwise, under DDP and ZeRO-3 (the
#    loss is the mean over the global batch's counted targets, whichever rank holds them);
#  - context parallelism (cp 2, each rank part of every sequence): the losses and validation
#    losses within 1e-5 of one rank's;
#  - stop at step 10 + resume == an uninterrupted run, bitwise; the loss goes down;
#  - bad flags and a bad line refused with one line naming the flag or file:line.
# Usage: tests/test_instruct.sh DTRAIN_BIN
set -uo pipefail
bin=$(readlink -f "$1")
. "$(dirname "$0")/lib.sh"
tmp_dir
cd "$dir"
mpi_env

/usr/bin/python3 - <<'PY'
import json, random
random.seed(3)
w = "red green blue black white pink gray gold".split()
with open("sft.jsonl", "w") as f:
    for i in range(300):
        a, b = random.randrange(50), random.randrange(50)
        if i % 3 == 0:
            ex = {"messages": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{a}+{b}"},
                               {"role": "assistant", "content": str(a + b)}]}
        else:
            ex = {"prompt": f"Twice {w[a % 8]}:", "response": f" {w[a % 8]} {w[a % 8]}"}
        f.write(json.dumps(ex) + "\n")
PY
"$bin" prepare --instruct --template chatml --val-fraction 0.1 --out data/sft sft.jsonl >prep.log 2>&1 ||
  fail "prepare --instruct: $(tail -2 prep.log)"
if /usr/bin/python3 - <<'PY'
import json, struct
def load(p):
    b = open(p, "rb").read()
    h = struct.unpack("<3i", b[:12])
    return h, b[1024:]
exs = [json.loads(l) for l in open("sft.jsonl")]
for split, pick in (("train", lambda i: i % 10 != 9), ("val", lambda i: i % 10 == 9)):
    (magic, ver, n), tok = load(f"data/sft_{split}_000000.bin")
    (mmagic, mver, mn), mask = load(f"data/sft_{split}_000000.bin.mask")
    assert (magic, ver, mmagic, mver) == (20240520, 1, 20261126, 1) and n == mn == len(mask), (magic, mmagic, n, mn)
    ids = struct.unpack(f"<{n}H", tok)
    counted = bytes(t for t, m in zip(ids, mask) if m).decode()
    want = ""
    for i, ex in enumerate(exs):
        if not pick(i): continue
        turns = ex["messages"] if "messages" in ex else [{"role": "assistant", "content": ex["response"]}]
        want += "".join(t["content"] + "<|im_end|>\n" for t in turns if t["role"] == "assistant")
    assert counted == want, (split, counted[:80], want[:80])
    print(f"{split}: {n} tokens, {sum(mask)} counted = the assistant turns")
PY
then pass "prepare --instruct (chatml): the counted tokens are exactly the assistant turns, train and val"
else fail "prepare --instruct: mask does not cover exactly the assistant turns"; fi

common=(--set model.preset= --model.n_layer 2 --model.d_model 48 --model.n_head 4 --model.vocab_size 256
        --model.context 32 --seq 32 --lr 3e-3 --warmup 2 --seed 5 --set data.train=data/sft_train_000000.bin
        --set data.val=data/sft_val_000000.bin --set training.eval_interval=10 --set logging.every=1)
for s in ddp zero3; do
  timeout 120 "$bin" train "${common[@]}" --batch 4 --set training.grad_accum=2 --steps 20 --set parallel.strategy=$s \
    --save-weights $s-1.st >$s-1.log 2>&1 || fail "$s 1 rank: $(tail -2 $s-1.log)"
  timeout 120 "${mpi[@]}" -n 2 "$bin" train "${common[@]}" --batch 4 --steps 20 --set parallel.strategy=$s \
    --save-weights $s-2.st >$s-2.log 2>&1 || fail "$s 2 ranks: $(tail -2 $s-2.log)"
  if cmp -s $s-1.st $s-2.st && [ "$(grep 'val loss' $s-1.log)" = "$(grep 'val loss' $s-2.log)" ]; then
    pass "$s with a loss mask: 2 ranks == 1 rank x 2 micro-steps, weights and validation losses bitwise"
  else fail "$s with a loss mask: 2 ranks and 1 rank x 2 differ"; fi
done
# Context parallelism (decision 83) with a loss mask: each CP rank holds part of every
# sequence's counted targets; the loss is still the mean over the global batch's counted ones.
timeout 120 "$bin" train "${common[@]}" --batch 4 --steps 20 --set logging.metrics=cp1.jsonl >cp1.log 2>&1 ||
  fail "cp reference: $(tail -2 cp1.log)"
timeout 120 "${mpi[@]}" -n 2 "$bin" train "${common[@]}" --batch 4 --steps 20 --set parallel.cp=2 \
  --set logging.metrics=cp2.jsonl >cp2.log 2>&1 || fail "cp 2: $(tail -2 cp2.log)"
if /usr/bin/python3 - <<'PY'
import json, math
def rows(p, k):
    return [j[k] for j in map(json.loads, open(p)) if k in j]
for k in ("loss", "val_loss"):
    a, b = rows("cp1.jsonl", k), rows("cp2.jsonl", k)
    assert len(a) == len(b) and len(a) >= (20 if k == "loss" else 2), (k, len(a), len(b))
    assert all(math.isfinite(x) and math.isfinite(y) and abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)), (k, a, b)
PY
then pass "cp 2 with a loss mask: 20 losses and the validation losses within 1e-5 of 1 rank's"
else fail "cp 2 with a loss mask differs from 1 rank"; fi
first=$(sed -n 's/.*step 1\/20 | loss \([0-9.]*\).*/\1/p' ddp-1.log)
last=$(sed -n 's/.*step 20\/20 | loss \([0-9.]*\).*/\1/p' ddp-1.log)
if [ -n "$first" ] && [ -n "$last" ] && /usr/bin/python3 -c "import sys; sys.exit(not $last < 0.75 * $first)"; then
  pass "masked loss goes down: $first -> $last over 20 steps"
else fail "masked loss did not go down: '$first' -> '$last'"; fi

# stop at 10 + resume to 20 == 20 uninterrupted (ddp-2 above), bitwise
ck=(--set checkpoint.dir=ck --set checkpoint.every=10)
timeout 120 "${mpi[@]}" -n 2 "$bin" train "${common[@]}" --batch 4 --steps 10 --set schedule.decay_steps=20 "${ck[@]}" \
  >r1.log 2>&1 || fail "first half: $(tail -2 r1.log)"
timeout 120 "${mpi[@]}" -n 2 "$bin" train "${common[@]}" --batch 4 --steps 20 --resume "${ck[@]}" --save-weights r.st \
  >r2.log 2>&1 || fail "resume: $(tail -2 r2.log)"
if grep -q "resumed" r2.log && cmp -s r.st ddp-2.st; then pass "loss mask: stop at 10 + resume == uninterrupted, weights bitwise"
else fail "loss mask resume differs: $(grep -m1 -E 'resum|error' r2.log)"; fi

# bad input: one line naming the flag or the file:line
printf '{"prompt": "a", "response": "b"}\n{"prompt": "a"}\n' >bad.jsonl
check_bad() { # EXPECTED_MESSAGE prepare-args...
  local want=$1
  shift
  "$bin" prepare "$@" >bad.log 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && grep -q -- "$want" bad.log; then pass "refused (rc $rc): $(grep -m1 -o -- "$want.*" bad.log)"
  else fail "not refused as '$want' (rc $rc): $(tail -1 bad.log)"; fi
}
check_bad "bad.jsonl:2: key 'response' must be a string" --instruct --out data/bad bad.jsonl
check_bad "--template must be plain or chatml" --instruct --template alpaca --out data/bad sft.jsonl
check_bad "--template chatml needs --instruct" --template chatml --out data/bad sft.jsonl
check_bad "--doc-sep does not apply to --instruct" --instruct --doc-sep % --out data/bad sft.jsonl
[ ! -e data/bad_train_000000.bin ] && pass "nothing written for a bad input" || fail "a bad input left data/bad_train_000000.bin"

echo "test_instruct: $fails failure(s)$(skipped)"
[ $fails -eq 0 ]
