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
import json
import math
import os
import socket
import statistics
import sys
import time

sys.dont_write_bytecode = True

import torch                                    # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "gpt2_torch", os.path.join(_HERE, "..", "tests", "ref", "gpt2_torch.py"))
gpt2_torch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpt2_torch)

PRESETS = {
    "gpt2": dict(n_layer=12, d_model=768, n_head=12, vocab=50257, context=1024),
    "bench-small": dict(n_layer=6, d_model=384, n_head=6, vocab=50257, context=1024),
    "gpt2-tiny": dict(n_layer=2, d_model=64, n_head=4, vocab=256, context=64),
}
LR, BETAS, WEIGHT_DECAY, CLIP, SEED = 3e-4, (0.9, 0.95), 0.1, 1.0, 1337


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch fp32 GPT-2 training benchmark (dtrain peer)")
    ap.add_argument("--model", choices=sorted(PRESETS), help="preset model")
    ap.add_argument("--n-layer", type=int)
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--n-head", type=int)
    ap.add_argument("--vocab", type=int, help="vocabulary size (default 50257)")
    ap.add_argument("--context", type=int, help="context length (default 1024)")
    ap.add_argument("--batch", type=int, default=4, help="micro-batch B per rank (default 4)")
    ap.add_argument("--seq", type=int, default=256, help="sequence length T (default 256)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per rank (default 2)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps (default 3)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--ddp", type=int, default=1, metavar="N", help="ranks (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    cfg = dict(PRESETS[args.model]) if args.model else dict(vocab=50257, context=1024)
    for k in ("n_layer", "d_model", "n_head", "vocab", "context"):
        v = getattr(args, k)
        if v is not None:
            cfg[k] = v
    missing = [k for k in ("n_layer", "d_model", "n_head") if k not in cfg]
    if missing:
        ap.error("give --model or all of --n-layer --d-model --n-head (missing: %s)"
                 % ", ".join("--" + m.replace("_", "-") for m in missing))
    for k, v in cfg.items():
        if v < 1:
            ap.error("%s must be >= 1" % k)
    if cfg["d_model"] % cfg["n_head"]:
        ap.error("d_model %d not divisible by n_head %d" % (cfg["d_model"], cfg["n_head"]))
    if args.seq > cfg["context"]:
        ap.error("--seq %d exceeds context %d" % (args.seq, cfg["context"]))
    if min(args.batch, args.seq, args.threads, args.steps, args.ddp) < 1 or args.warmup < 0:
        ap.error("--batch, --seq, --threads, --steps, --ddp must be >= 1, --warmup >= 0")
    args.cfg = cfg
    args.model_name = args.model if args.model else "custom-L%d-d%d-h%d-v%d-c%d" % (
        cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["vocab"], cfg["context"])
    if args.model and any(getattr(args, k) is not None and getattr(args, k) != PRESETS[
            args.model][k] for k in cfg):
        args.model_name += "-custom"
    return args


def run(rank, world, args, port, queue):
    """Runs the benchmark on one rank; rank 0 puts its step times into queue (or returns them)."""
    torch.set_num_threads(args.threads)
    ddp = world > 1
    if ddp:
        import torch.distributed as dist
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = args.cfg
    torch.manual_seed(SEED)                         # same init on every rank
    model = gpt2_torch.GPT2(cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["vocab"],
                            cfg["context"])
    gpt2_torch.gpt2_init_(model)
    n_params = gpt2_torch.count_params(model)
    net = model
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)
    opt = torch.optim.AdamW(gpt2_torch.param_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS,
                            weight_decay=WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(SEED + 1 + rank)   # each rank its own data
    B, T, V = args.batch, args.seq, cfg["vocab"]
    times = []
    for step in range(args.warmup + args.steps):
        data = torch.randint(0, V, (B, T + 1), generator=gen)
        x, y = data[:, :-1], data[:, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = net(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        dt = time.perf_counter() - t0
        if not math.isfinite(loss.item()):
            raise RuntimeError("non-finite loss at step %d" % step)
        if step >= args.warmup:
            times.append(dt)
    result = dict(times=times, n_params=n_params, final_loss=loss.item())
    if ddp:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        if queue is not None:
            queue.put(result)
        return result
    return None


def _ddp_entry(rank, world, args, port, queue):
    run(rank, world, args, port, queue)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    args = parse_args()
    world = args.ddp
    if world > 1:
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.spawn(_ddp_entry, args=(world, args, free_port(), queue), nprocs=world, join=True)
        result = queue.get()
    else:
        result = run(0, 1, args, None, None)

    times = result["times"]
    median = statistics.median(times)
    tokens_per_s = world * args.batch * args.seq / median
    if args.json:
        print(json.dumps({
            "peer": "pytorch", "torch_version": torch.__version__, "model": args.model_name,
            "config": args.cfg, "n_params": result["n_params"], "batch": args.batch,
            "seq": args.seq, "threads": args.threads, "ranks": world,
            "median_step_s": median, "tokens_per_s": tokens_per_s, "step_times_s": times,
            "final_loss": result["final_loss"]}))
    else:
        print("# peer     torch      model                ranks threads batch seq    "
              "params       median_step_s  tokens_per_s(global)")
        print("pytorch  %-10s %-20s %5d %7d %5d %-6d %-12d %-14.6f %.1f" % (
            torch.__version__, args.model_name, world, args.threads, args.batch, args.seq,
            result["n_params"], median, tokens_per_s))


if __name__ == "__main__":
    main()
