#!/usr/bin/python3
"""Peer benchmark: dtrain's LLaMA trained by PyTorch in fp32 on the CPU.

The model is the one dtrain trains (tests/ref/llama_torch.py, shared with the parity oracle: HF
LlamaForCausalLM names, RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU MLP, no biases),
with llama_torch's init (N(0, 0.02), o_proj/down_proj N(0, 0.02/sqrt(2L)), RMSNorm weights 1),
random token batches from a fixed seed, AdamW(lr 3e-4, betas (0.9, 0.95), weight decay 0.1 on 2-D
tensors only: every matrix, embed_tokens and lm_head; not the RMSNorm weights) and global
grad-norm clipping at 1.0. Each step is zero_grad(set_to_none=True), forward, loss.backward(),
clip_grad_norm_, optimizer.step(), timed with time.perf_counter(); the first --warmup steps are
not counted. Reported: median step time, tokens/s = ranks*B*T/median, and the parameter count
(a tied head counted once).

Speed: the peer is not handicapped. torch 1.13 has no F.scaled_dot_product_attention (no flash /
memory-efficient attention on the CPU), so attention is the plain causal softmax(q k^T/sqrt(hs)) v
of llama_torch, with what HF's modeling_llama also does: the RoPE cos/sin tables and the causal
mask are built once per (T, dtype) and reused by every layer and step (llama_torch rebuilds them in
every layer's forward), and grouped-query attention does not materialise repeated k/v heads: the
n_head/n_kv_head query heads that share a kv head are stacked along the query axis, so q k^T and
att v run as one batched matmul per kv head group (the same arithmetic as repeat_kv). Everything
else is llama_torch's module code and default eager ops (no TorchScript, nothing fused by hand);
AdamW and clip_grad_norm_ use their defaults, as bench/pytorch_gpt2.py does. The forward is
checked against llama_torch's own at start (--no-check skips it).

Usage (Debian's interpreter has torch):
  /usr/bin/python3 bench/pytorch_llama.py --model llama-100m --batch 4 --seq 256 --threads 2
  /usr/bin/python3 bench/pytorch_llama.py --model llama-tiny --batch 4 --seq 64 --json
  /usr/bin/python3 bench/pytorch_llama.py --model llama-tiny --batch 4 --seq 64 --ddp 2

Presets: llama-100m (12 layers, d 768, 12 heads, 4 kv heads, d_ff 2048, vocab 32000, context 1024,
tied head, rope_theta 1e4, norm_eps 1e-5), llama-tiny (2, 64, 4, 2, 176, 256, 64, untied);
explicit --n-layer/--d-model/--n-head/--n-kv-head/--d-ff/--vocab/--context/--untied|--tied/
--rope-theta/--norm-eps override a preset's fields. --ddp N runs N processes (torch.multiprocessing,
gloo on 127.0.0.1, DistributedDataParallel), each with --threads threads and its own micro-batch
of B sequences; rank 0 prints. Output: a '#' header line with units and one result row, or with
--json one JSON object.
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
import torch.nn.functional as F                 # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "llama_torch", os.path.join(_HERE, "..", "tests", "ref", "llama_torch.py"))
llama_torch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(llama_torch)

PRESETS = {
    "llama-100m": dict(n_layer=12, d_model=768, n_head=12, n_kv_head=4, d_ff=2048, vocab=32000,
                       context=1024, untied=0, rope_theta=10000.0, norm_eps=1e-5),
    "llama-tiny": dict(n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=176, vocab=256,
                       context=64, untied=1, rope_theta=10000.0, norm_eps=1e-5),
}
INT_KEYS = ("n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "vocab", "context")
LR, BETAS, WEIGHT_DECAY, CLIP, SEED = 3e-4, (0.9, 0.95), 0.1, 1.0, 1337

_TABLES = {}    # (T, hs, theta, dtype, n_rep) -> (cos, sin, additive causal mask)


def _tables(T, hs, theta, dtype, device, n_rep):
    key = (T, hs, theta, dtype, str(device), n_rep)
    t = _TABLES.get(key)
    if t is None:
        cos, sin = llama_torch.rope_cos_sin(T, hs, theta, dtype, device)
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
        mask = torch.zeros(T, T, dtype=dtype, device=device).masked_fill(~causal, float("-inf"))
        # query rows are stacked n_rep times (one block per query head of a kv group)
        t = (cos, sin, mask.repeat(n_rep, 1))
        _TABLES[key] = t
    return t


def fast_attention_forward(self, x):
    """llama_torch.LlamaAttention.forward with cached tables and unrepeated k/v (same result)."""
    B, T, C = x.shape
    nh, nkv, hs = self.n_head, self.n_kv_head, self.hs
    rep = nh // nkv
    cos, sin, mask = _tables(T, hs, self.rope_theta, x.dtype, x.device, rep)
    q = self.q_proj(x).view(B, T, nh, hs).transpose(1, 2)
    k = self.k_proj(x).view(B, T, nkv, hs).transpose(1, 2)
    v = self.v_proj(x).view(B, T, nkv, hs).transpose(1, 2)
    q = llama_torch.apply_rope(q, cos, sin)                       # (B, nh, T, hs)
    k = llama_torch.apply_rope(k, cos, sin)                       # (B, nkv, T, hs)
    # query head h = g*rep + r uses kv head g: group g's queries are rows r*T + t
    q = q.reshape(B, nkv, rep * T, hs)
    att = torch.baddbmm(mask.expand(B * nkv, rep * T, T), q.reshape(B * nkv, rep * T, hs),
                        k.reshape(B * nkv, T, hs).transpose(1, 2), alpha=1.0 / math.sqrt(hs))
    att = F.softmax(att, dim=-1)
    y = torch.bmm(att, v.reshape(B * nkv, T, hs))                 # (B*nkv, rep*T, hs)
    y = y.view(B, nh, T, hs).transpose(1, 2).reshape(B, T, nh * hs)
    return self.o_proj(y)


class FastLlamaAttention(llama_torch.LlamaAttention):
    forward = fast_attention_forward


def build_model(cfg, fast=True):
    model = llama_torch.Llama(cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["n_kv_head"],
                              cfg["d_ff"], cfg["vocab"], cfg["context"], cfg["untied"],
                              rope_theta=cfg["rope_theta"], norm_eps=cfg["norm_eps"])
    if fast:
        for layer in model.model.layers:
            layer.self_attn.__class__ = FastLlamaAttention
    return model


def check_forward(cfg, T):
    """The fast attention gives llama_torch's loss and gradients (small copy of the model)."""
    small = dict(cfg, n_layer=1, vocab=min(cfg["vocab"], 512))
    torch.manual_seed(0)
    ref = llama_torch.llama_init_(build_model(small, fast=False))
    fast = build_model(small, fast=True)
    fast.load_state_dict(ref.state_dict())
    x = torch.randint(0, small["vocab"], (2, T + 1))
    losses, grads = [], []
    for m in (ref, fast):
        _, loss = m(x[:, :-1], x[:, 1:])
        loss.backward()
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    err = (grads[0] - grads[1]).abs().max().item() / max(grads[0].abs().max().item(), 1e-30)
    if abs(losses[0] - losses[1]) > 1e-4 * abs(losses[0]) or err > 1e-3:
        raise RuntimeError("fast attention differs from llama_torch: loss %r vs %r, grad rel err %g"
                           % (losses[0], losses[1], err))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch fp32 LLaMA training benchmark (dtrain peer)")
    ap.add_argument("--model", choices=sorted(PRESETS), help="preset model")
    ap.add_argument("--n-layer", type=int)
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--n-head", type=int)
    ap.add_argument("--n-kv-head", type=int, help="key/value heads (default n_head)")
    ap.add_argument("--d-ff", type=int, help="SwiGLU width (required without --model)")
    ap.add_argument("--vocab", type=int, help="vocabulary size (default 32000)")
    ap.add_argument("--context", type=int, help="context length (default 1024)")
    tie = ap.add_mutually_exclusive_group()
    tie.add_argument("--untied", dest="untied", action="store_const", const=1,
                     help="lm_head has its own weights")
    tie.add_argument("--tied", dest="untied", action="store_const", const=0,
                     help="lm_head is the token embedding (default without --model)")
    ap.add_argument("--rope-theta", type=float, help="RoPE base (default 10000)")
    ap.add_argument("--norm-eps", type=float, help="RMSNorm epsilon (default 1e-5)")
    ap.add_argument("--batch", type=int, default=4, help="micro-batch B per rank (default 4)")
    ap.add_argument("--seq", type=int, default=256, help="sequence length T (default 256)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per rank (default 2)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps (default 3)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--ddp", type=int, default=1, metavar="N", help="ranks (default 1)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the start-up check of the attention against llama_torch")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    cfg = dict(PRESETS[args.model]) if args.model else dict(
        vocab=32000, context=1024, untied=0, rope_theta=10000.0, norm_eps=1e-5)
    for k in INT_KEYS + ("untied", "rope_theta", "norm_eps"):
        v = getattr(args, k)
        if v is not None:
            cfg[k] = v
    if "n_kv_head" not in cfg and "n_head" in cfg:
        cfg["n_kv_head"] = cfg["n_head"]
    missing = [k for k in ("n_layer", "d_model", "n_head", "d_ff") if k not in cfg]
    if missing:
        ap.error("give --model or all of --n-layer --d-model --n-head --d-ff (missing: %s)"
                 % ", ".join("--" + m.replace("_", "-") for m in missing))
    for k in INT_KEYS:
        if cfg[k] < 1:
            ap.error("%s must be >= 1" % k)
    if cfg["rope_theta"] <= 0 or cfg["norm_eps"] <= 0:
        ap.error("--rope-theta and --norm-eps must be > 0")
    if cfg["d_model"] % cfg["n_head"]:
        ap.error("d_model %d not divisible by n_head %d" % (cfg["d_model"], cfg["n_head"]))
    if (cfg["d_model"] // cfg["n_head"]) % 2:
        ap.error("head size d_model/n_head must be even for RoPE")
    if cfg["n_head"] % cfg["n_kv_head"]:
        ap.error("n_head %d not divisible by n_kv_head %d" % (cfg["n_head"], cfg["n_kv_head"]))
    if args.seq > cfg["context"]:
        ap.error("--seq %d exceeds context %d" % (args.seq, cfg["context"]))
    if min(args.batch, args.seq, args.threads, args.steps, args.ddp) < 1 or args.warmup < 0:
        ap.error("--batch, --seq, --threads, --steps, --ddp must be >= 1, --warmup >= 0")
    args.cfg = cfg
    args.model_name = args.model if args.model else "custom-L%d-d%d-h%d-kv%d-f%d-v%d-c%d%s" % (
        cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["n_kv_head"], cfg["d_ff"],
        cfg["vocab"], cfg["context"], "-untied" if cfg["untied"] else "")
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
    if rank == 0 and not args.no_check:
        check_forward(cfg, min(args.seq, 32))
    torch.manual_seed(SEED)                         # same init on every rank
    model = llama_torch.llama_init_(build_model(cfg))
    n_params = llama_torch.count_params(model)
    net = model
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)
    opt = torch.optim.AdamW(llama_torch.param_groups(model, WEIGHT_DECAY), lr=LR, betas=BETAS,
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
            "family": "llama", "config": args.cfg, "n_params": result["n_params"],
            "batch": args.batch, "seq": args.seq, "threads": args.threads, "ranks": world,
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
