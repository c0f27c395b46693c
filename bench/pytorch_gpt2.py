#!/usr/bin/python3
"""Peer benchmark: dtrain's GPT-2 trained by PyTorch in fp32 on the CPU.

The model is the one dtrain trains (tests/ref/gpt2_torch.py, shared with the parity oracle), with
GPT-2 init (N(0, 0.02), c_proj weights N(0, 0.02/sqrt(2L)), zero biases), random token batches
from a fixed seed, AdamW(lr 3e-4, betas (0.9, 0.95), weight decay 0.1 on 2-D tensors only) and
global grad-norm clipping at 1.0. Each step is zero_grad(set_to_none=True), forward,
loss.backward(), clip_grad_norm_, optimizer.step(), timed with time.perf_counter(); the first
--warmup steps are not counted. Reported: median step time, tokens/s = ranks*B*T/median, and the
parameter count (tied wte counted once).

Usage (Debian's interpreter has torch):
  /usr/bin/python3 bench/pytorch_gpt2.py --model gpt2 --batch 4 --seq 256 --threads 2
  /usr/bin/python3 bench/pytorch_gpt2.py --n-layer 4 --d-model 256 --n-head 4 --batch 8
  /usr/bin/python3 bench/pytorch_gpt2.py --model bench-small --batch 4 --ddp 2 --json

Presets: gpt2 (12 layers, d 768, 12 heads, vocab 50257, context 1024), bench-small (6, 384, 6,
50257, 1024), gpt2-tiny (2, 64, 4, 256, 64); explicit --n-layer/--d-model/--n-head/--vocab/
--context override a preset's fields. --ddp N runs N processes (torch.multiprocessing, gloo on
127.0.0.1, DistributedDataParallel), each with --threads threads and its own micro-batch of B
sequences; rank 0 prints. Output: a '#' header line with units and one result row, or with --json
one JSON object.
"""
import argparse
import importlib.util
import os
import sys

sys.dont_write_bytecode = True

import torch                                    # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("peer_common",
                                               os.path.join(_HERE, "peer_common.py"))
peer_common = importlib.util.module_from_spec(_spec)
sys.modules["peer_common"] = peer_common        # --ddp's spawned ranks unpickle its entry point
_spec.loader.exec_module(peer_common)
gpt2_torch = peer_common.load_ref("gpt2_torch")

PRESETS = {
    "gpt2": dict(n_layer=12, d_model=768, n_head=12, vocab=50257, context=1024),
    "bench-small": dict(n_layer=6, d_model=384, n_head=6, vocab=50257, context=1024),
    "gpt2-tiny": dict(n_layer=2, d_model=64, n_head=4, vocab=256, context=64),
}
KEYS = ("n_layer", "d_model", "n_head", "vocab", "context")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch fp32 GPT-2 training benchmark (dtrain peer)")
    ap.add_argument("--model", choices=sorted(PRESETS), help="preset model")
    ap.add_argument("--n-layer", type=int)
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--n-head", type=int)
    ap.add_argument("--vocab", type=int, help="vocabulary size (default 50257)")
    ap.add_argument("--context", type=int, help="context length (default 1024)")
    peer_common.add_run_args(ap)
    peer_common.add_json_arg(ap)
    args = ap.parse_args(argv)

    cfg = peer_common.preset_cfg(args, PRESETS, dict(vocab=50257, context=1024), KEYS)
    peer_common.require(ap, cfg, ("n_layer", "d_model", "n_head"))
    peer_common.require_positive(ap, cfg)
    peer_common.require_divisible(ap, cfg, "d_model", "n_head")
    peer_common.check_run_args(ap, args, cfg)
    args.cfg = cfg
    args.model_name = peer_common.model_name(args, PRESETS, cfg, "custom-L%d-d%d-h%d-v%d-c%d" % (
        cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["vocab"], cfg["context"]))
    return args


def build(args):
    cfg = args.cfg
    model = gpt2_torch.GPT2(cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["vocab"],
                            cfg["context"])
    gpt2_torch.gpt2_init_(model)
    return model, gpt2_torch.count_params(model)


def param_groups(model):
    return gpt2_torch.param_groups(model, peer_common.WEIGHT_DECAY)


def batch(args, gen):
    data = torch.randint(0, args.cfg["vocab"], (args.batch, args.seq + 1), generator=gen)
    return data[:, :-1], data[:, 1:]


def main():
    args = parse_args()
    result = peer_common.measure(args, build, param_groups, batch)
    tokens_per_s = args.ddp * args.batch * args.seq / result["median"]
    peer_common.report(args, result, ("seq", args.seq), dict(seq=args.seq),
                       [("tokens_per_s", "tokens_per_s(global)", tokens_per_s)])


if __name__ == "__main__":
    main()
