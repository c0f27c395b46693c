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
import math
import os
import sys

sys.dont_write_bytecode = True

import torch                                    # noqa: E402
import torch.nn.functional as F                 # noqa: E402

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("peer_common",
                                               os.path.join(_HERE, "peer_common.py"))
peer_common = importlib.util.module_from_spec(_spec)
sys.modules["peer_common"] = peer_common        # --ddp's spawned ranks unpickle its entry point
_spec.loader.exec_module(peer_common)
llama_torch = peer_common.load_ref("llama_torch")

PRESETS = {
    "llama-100m": dict(n_layer=12, d_model=768, n_head=12, n_kv_head=4, d_ff=2048, vocab=32000,
                       context=1024, untied=0, rope_theta=10000.0, norm_eps=1e-5),
    "llama-tiny": dict(n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=176, vocab=256,
                       context=64, untied=1, rope_theta=10000.0, norm_eps=1e-5),
}
INT_KEYS = ("n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "vocab", "context")

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
    peer_common.add_run_args(ap)
    ap.add_argument("--no-check", action="store_true",
                    help="skip the start-up check of the attention against llama_torch")
    peer_common.add_json_arg(ap)
    args = ap.parse_args(argv)

    cfg = peer_common.preset_cfg(args, PRESETS, dict(
        vocab=32000, context=1024, untied=0, rope_theta=10000.0, norm_eps=1e-5),
        INT_KEYS + ("untied", "rope_theta", "norm_eps"))
    if "n_kv_head" not in cfg and "n_head" in cfg:
        cfg["n_kv_head"] = cfg["n_head"]
    peer_common.require(ap, cfg, ("n_layer", "d_model", "n_head", "d_ff"))
    peer_common.require_positive(ap, cfg, INT_KEYS)
    if cfg["rope_theta"] <= 0 or cfg["norm_eps"] <= 0:
        ap.error("--rope-theta and --norm-eps must be > 0")
    peer_common.require_divisible(ap, cfg, "d_model", "n_head")
    if (cfg["d_model"] // cfg["n_head"]) % 2:
        ap.error("head size d_model/n_head must be even for RoPE")
    peer_common.require_divisible(ap, cfg, "n_head", "n_kv_head")
    peer_common.check_run_args(ap, args, cfg)
    args.cfg = cfg
    args.model_name = peer_common.model_name(
        args, PRESETS, cfg, "custom-L%d-d%d-h%d-kv%d-f%d-v%d-c%d%s" % (
            cfg["n_layer"], cfg["d_model"], cfg["n_head"], cfg["n_kv_head"], cfg["d_ff"],
            cfg["vocab"], cfg["context"], "-untied" if cfg["untied"] else ""))
    return args


def check(args):
    if not args.no_check:
        check_forward(args.cfg, min(args.seq, 32))


def build(args):
    model = llama_torch.llama_init_(build_model(args.cfg))
    return model, llama_torch.count_params(model)


def param_groups(model):
    return llama_torch.param_groups(model, peer_common.WEIGHT_DECAY)


def batch(args, gen):
    data = torch.randint(0, args.cfg["vocab"], (args.batch, args.seq + 1), generator=gen)
    return data[:, :-1], data[:, 1:]


def main():
    args = parse_args()
    result = peer_common.measure(args, build, param_groups, batch, check)
    tokens_per_s = args.ddp * args.batch * args.seq / result["median"]
    peer_common.report(args, result, ("seq", args.seq), dict(seq=args.seq),
                       [("tokens_per_s", "tokens_per_s(global)", tokens_per_s)], family="llama")


if __name__ == "__main__":
    main()
