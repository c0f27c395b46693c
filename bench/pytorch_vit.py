#!/usr/bin/python3
"""Peer benchmark: dtrain's ViT (image classification) trained by PyTorch in fp32 on the CPU.

The model is the one dtrain trains (tests/ref/vit_torch.py, shared with the parity oracle: timm
names, a Linear patch embedding, cls token + learned pos_embed, pre-norm blocks with LayerNorm eps
1e-5 and tanh GELU, bidirectional attention, head on the cls token), with vit_torch's init
(N(0, 0.02), attn.proj/fc2 N(0, 0.02/sqrt(2L)), zero biases, LayerNorm 1/0), random uint8 images
and labels from a fixed seed (the model scales pixels by 1/255), AdamW(lr 3e-4, betas (0.9, 0.95),
weight decay 0.1 on 2-D tensors except pos_embed) and global grad-norm clipping at 1.0. Each step
is zero_grad(set_to_none=True), forward, loss.backward(), clip_grad_norm_, optimizer.step(), timed
with time.perf_counter(); the first --warmup steps are not counted. Reported: median step time,
images/s = ranks*B/median, tokens/s = images/s x pixels per image (dtrain's bench counts a ViT
sample's pixels as its tokens, so the two tokens/s compare), and the parameter count.

Speed: the peer is not handicapped. torch 1.13 has no F.scaled_dot_product_attention, so attention
is vit_torch's plain softmax(q k^T/sqrt(hs)) v (no mask); everything is vit_torch's module code and
default eager ops (no TorchScript, nothing fused by hand); AdamW and clip_grad_norm_ use their
defaults, as bench/pytorch_gpt2.py does.

Usage (Debian's interpreter has torch):
  /usr/bin/python3 bench/pytorch_vit.py --model vit-fashion --batch 64 --threads 2
  /usr/bin/python3 bench/pytorch_vit.py --model vit-tiny --batch 64 --json
  /usr/bin/python3 bench/pytorch_vit.py --model vit-tiny --batch 32 --ddp 2

Presets: vit-fashion (image 28, patch 4, 1 channel, 10 classes, 6 layers, d 128, 4 heads, d_ff
256), vit-tiny (8, 4, 1, 10, 2, 32, 4, 64); explicit --image-size/--patch-size/--channels/
--n-classes/--n-layer/--d-model/--n-head/--d-ff override a preset's fields. --ddp N runs N
processes (torch.multiprocessing, gloo on 127.0.0.1, DistributedDataParallel), each with --threads
threads and its own micro-batch of B images; rank 0 prints. Output: a '#' header line with units
and one result row, or with --json one JSON object.
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
    "vit_torch", os.path.join(_HERE, "..", "tests", "ref", "vit_torch.py"))
vit_torch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vit_torch)

PRESETS = {
    "vit-fashion": dict(image_size=28, patch_size=4, channels=1, n_classes=10, n_layer=6,
                        d_model=128, n_head=4, d_ff=256),
    "vit-tiny": dict(image_size=8, patch_size=4, channels=1, n_classes=10, n_layer=2,
                     d_model=32, n_head=4, d_ff=64),
}
KEYS = ("image_size", "patch_size", "channels", "n_classes", "n_layer", "d_model", "n_head",
        "d_ff")
LR, BETAS, WEIGHT_DECAY, CLIP, SEED = 3e-4, (0.9, 0.95), 0.1, 1.0, 1337


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch fp32 ViT training benchmark (dtrain peer)")
    ap.add_argument("--model", choices=sorted(PRESETS), help="preset model")
    ap.add_argument("--image-size", type=int)
    ap.add_argument("--patch-size", type=int)
    ap.add_argument("--channels", type=int, help="colour planes (default 1)")
    ap.add_argument("--n-classes", type=int, help="classes (default 10)")
    ap.add_argument("--n-layer", type=int)
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--n-head", type=int)
    ap.add_argument("--d-ff", type=int, help="MLP width (default 4 d_model)")
    ap.add_argument("--batch", type=int, default=64, help="micro-batch B (images) per rank "
                    "(default 64)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per rank (default 2)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps (default 3)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--ddp", type=int, default=1, metavar="N", help="ranks (default 1)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    cfg = dict(PRESETS[args.model]) if args.model else dict(channels=1, n_classes=10)
    for k in KEYS:
        v = getattr(args, k)
        if v is not None:
            cfg[k] = v
    if "d_ff" not in cfg and "d_model" in cfg:
        cfg["d_ff"] = 4 * cfg["d_model"]
    missing = [k for k in KEYS if k not in cfg]
    if missing:
        ap.error("give --model or all of --image-size --patch-size --n-layer --d-model --n-head "
                 "(missing: %s)" % ", ".join("--" + m.replace("_", "-") for m in missing))
    for k, v in cfg.items():
        if v < 1:
            ap.error("%s must be >= 1" % k)
    if cfg["d_model"] % cfg["n_head"]:
        ap.error("d_model %d not divisible by n_head %d" % (cfg["d_model"], cfg["n_head"]))
    if cfg["image_size"] % cfg["patch_size"]:
        ap.error("image_size %d not a multiple of patch_size %d" % (cfg["image_size"],
                                                                     cfg["patch_size"]))
    if min(args.batch, args.threads, args.steps, args.ddp) < 1 or args.warmup < 0:
        ap.error("--batch, --threads, --steps, --ddp must be >= 1, --warmup >= 0")
    args.cfg = cfg
    args.pixels = cfg["channels"] * cfg["image_size"] ** 2
    args.model_name = args.model if args.model else "custom-i%d-p%d-c%d-L%d-d%d-h%d-f%d-k%d" % (
        cfg["image_size"], cfg["patch_size"], cfg["channels"], cfg["n_layer"], cfg["d_model"],
        cfg["n_head"], cfg["d_ff"], cfg["n_classes"])
    if args.model and any(cfg[k] != PRESETS[args.model][k] for k in cfg):
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
    model = vit_torch.ViT(cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["d_ff"],
                          cfg["image_size"], cfg["patch_size"], cfg["channels"],
                          cfg["n_classes"])
    vit_torch.vit_init_(model)
    n_params = vit_torch.count_params(model)
    net = model
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)
    opt = torch.optim.AdamW(vit_torch.param_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS,
                            weight_decay=WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(SEED + 1 + rank)   # each rank its own data
    B, P = args.batch, args.pixels
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randint(0, 256, (B, P), generator=gen, dtype=torch.uint8)
        y = torch.randint(0, cfg["n_classes"], (B,), generator=gen)
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
    images_per_s = world * args.batch / median
    tokens_per_s = images_per_s * args.pixels
    if args.json:
        print(json.dumps({
            "peer": "pytorch", "torch_version": torch.__version__, "model": args.model_name,
            "family": "vit", "config": args.cfg, "n_params": result["n_params"],
            "batch": args.batch, "pixels_per_image": args.pixels,
            "seq_tokens_per_image": (args.cfg["image_size"] // args.cfg["patch_size"]) ** 2 + 1,
            "threads": args.threads, "ranks": world, "median_step_s": median,
            "images_per_s": images_per_s, "tokens_per_s": tokens_per_s, "step_times_s": times,
            "final_loss": result["final_loss"]}))
    else:
        print("# peer     torch      model                ranks threads batch pixels "
              "params       median_step_s  images_per_s(global) tokens_per_s(=pixels/s)")
        print("pytorch  %-10s %-20s %5d %7d %5d %-6d %-12d %-14.6f %-20.1f %.1f" % (
            torch.__version__, args.model_name, world, args.threads, args.batch, args.pixels,
            result["n_params"], median, images_per_s, tokens_per_s))


if __name__ == "__main__":
    main()
