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
vit_torch = peer_common.load_ref("vit_torch")

PRESETS = {
    "vit-fashion": dict(image_size=28, patch_size=4, channels=1, n_classes=10, n_layer=6,
                        d_model=128, n_head=4, d_ff=256),
    "vit-tiny": dict(image_size=8, patch_size=4, channels=1, n_classes=10, n_layer=2,
                     d_model=32, n_head=4, d_ff=64),
}
KEYS = ("image_size", "patch_size", "channels", "n_classes", "n_layer", "d_model", "n_head",
        "d_ff")


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
    peer_common.add_run_args(ap, batch=64, unit=" (images)", seq=False)
    peer_common.add_json_arg(ap)
    args = ap.parse_args(argv)

    cfg = peer_common.preset_cfg(args, PRESETS, dict(channels=1, n_classes=10), KEYS)
    if "d_ff" not in cfg and "d_model" in cfg:
        cfg["d_ff"] = 4 * cfg["d_model"]
    peer_common.require(ap, cfg, KEYS, ("image_size", "patch_size", "n_layer", "d_model",
                                        "n_head"))
    peer_common.require_positive(ap, cfg)
    peer_common.require_divisible(ap, cfg, "d_model", "n_head")
    if cfg["image_size"] % cfg["patch_size"]:
        ap.error("image_size %d not a multiple of patch_size %d" % (cfg["image_size"],
                                                                     cfg["patch_size"]))
    peer_common.check_run_args(ap, args, cfg, seq=False)
    args.cfg = cfg
    args.pixels = cfg["channels"] * cfg["image_size"] ** 2
    args.model_name = peer_common.model_name(
        args, PRESETS, cfg, "custom-i%d-p%d-c%d-L%d-d%d-h%d-f%d-k%d" % (
            cfg["image_size"], cfg["patch_size"], cfg["channels"], cfg["n_layer"],
            cfg["d_model"], cfg["n_head"], cfg["d_ff"], cfg["n_classes"]))
    return args


def build(args):
    cfg = args.cfg
    model = vit_torch.ViT(cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["d_ff"],
                          cfg["image_size"], cfg["patch_size"], cfg["channels"],
                          cfg["n_classes"])
    vit_torch.vit_init_(model)
    return model, vit_torch.count_params(model)


def param_groups(model):
    return vit_torch.param_groups(model, peer_common.WEIGHT_DECAY)


def batch(args, gen):
    x = torch.randint(0, 256, (args.batch, args.pixels), generator=gen, dtype=torch.uint8)
    y = torch.randint(0, args.cfg["n_classes"], (args.batch,), generator=gen)
    return x, y


def main():
    args = parse_args()
    result = peer_common.measure(args, build, param_groups, batch)
    images_per_s = args.ddp * args.batch / result["median"]
    tokens_per_s = images_per_s * args.pixels
    cfg = args.cfg
    peer_common.report(args, result, ("pixels", args.pixels), dict(
        pixels_per_image=args.pixels,
        seq_tokens_per_image=(cfg["image_size"] // cfg["patch_size"]) ** 2 + 1), [
        ("images_per_s", "images_per_s(global)", images_per_s),
        ("tokens_per_s", "tokens_per_s(=pixels/s)", tokens_per_s)], family="vit")


if __name__ == "__main__":
    main()
