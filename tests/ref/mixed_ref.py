"""dtrain's mixed precision (training.precision bf16 | fp16) emulated in PyTorch, for the parity
oracle.

Not run directly. Imported by path from tests/ref/gpt2_ref.py.

dtrain's semantics (src/model/mixed.c, src/model/vocab.c, model/model.h), per matmul (every linear
layer, the lm_head including GPT-2's and LLaMA's tied heads, ViT's patch embedding and classifier
head), with round16 = round-to-nearest-even to bfloat16 or IEEE float16 and the products exact:
  forward   y  = round16(x) @ round16(W)^T + b        (sums in fp32; b fp32, added in fp32)
  backward  dx = round16(dy) @ round16(W)
            dW = round16(dy)^T @ round16(x)            (sums in fp32, into fp32 gradients)
            db = column sums of the unrounded dy
The weights are rounded from the fp32 master weights at every forward. Everything else (embedding
lookup, positions, norms, the softmax, RoPE, GELU/SwiGLU, residuals, the loss, AdamW, clipping,
norms) is the plain model, but for attention's products, which take 16-bit operands too
(LowpAttention: q, k, v, the probabilities before P V, dO and dS rounded; a 16-bit flash
kernel's rule), swapped in for gpt2_torch.attend, which every family calls. fp16 training runs the backward with the loss times a
scale (65536, dynamic loss scaling) that the optimizer divides out; as the rounding of dy happens
on the scaled gradient, the emulation scales the loss the same way (gpt2_ref.forward_backward,
train) -- a power of two, so it only matters where float16 would be subnormal or overflow.

emulate(precision) swaps torch.nn.functional.linear -- which nn.Linear.forward and the families'
F.linear heads call -- for LowpLinear while the model runs in float64, so the oracle is the
ordinary model (tests/ref/{gpt2,llama,vit}_torch.py) with only the matmuls changed. Products of
two 16-bit values are exact in float64 (8+8 or 11+11 significant bits), so the emulation differs
from dtrain only by dtrain's fp32 sums, and by the values that such an fp32-level difference moves
across a rounding boundary, which then cascade (gpt2_ref.MIXED_NOTE).

autocast_forward_backward: the real torch.autocast('cpu', dtype=torch.bfloat16) of one float32
forward/backward, for the looser second check. Autocast rounds more than dtrain does (the matmul
outputs, and with them the attention matmuls, softmax and activations run in bfloat16), so it is
not an exact oracle (gpt2_ref.AUTOCAST_NOTE); torch's CPU autocast supports bfloat16 only (this
torch refuses float16: "AutocastCPU only support Bfloat16"), so fp16 has the emulated check alone.

Only torch, numpy, math, contextlib and gpt2_torch (its attend) are used.
"""
import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F

import gpt2_torch  # attend, swapped by emulate

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ("fp32",) + tuple(DTYPES)


class LowpOverflow(ArithmeticError):
    """A value beyond the 16-bit range (float16 above 65504): dtrain's loss scaling would skip
    the step, so the parity comparison cannot go on."""


def round16(t, dtype):
    """t rounded to the 16-bit dtype (nearest even) and back to t's dtype. From float64 torch
    rounds to float32 first, then to 16 bits, as dtrain's fp32 -> 16-bit narrowing of its fp32
    values does."""
    r = t.to(dtype).to(t.dtype)
    if not torch.isfinite(r).all() and torch.isfinite(t).all():
        raise LowpOverflow("a value of magnitude %.6g overflows %s" % (float(t.abs().max()), dtype))
    return r


class LowpLinear(torch.autograd.Function):
    """y = round16(x) @ round16(W)^T + b; backward rounds dy for dx and dW, db from dy itself.
    round_dy=False is dtrain's semantics with the gradient-rounding left out (the self-test uses
    it as a wrong implementation)."""

    @staticmethod
    def forward(ctx, x, w, b, dtype, round_dy):
        xr, wr = round16(x, dtype), round16(w, dtype)
        ctx.save_for_backward(xr, wr)
        ctx.has_bias, ctx.dtype, ctx.round_dy = b is not None, dtype, round_dy
        y = torch.matmul(xr, wr.t())
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, dy):
        xr, wr = ctx.saved_tensors
        dyr = round16(dy, ctx.dtype) if ctx.round_dy else dy
        dx = torch.matmul(dyr, wr) if ctx.needs_input_grad[0] else None
        dw = dyr.reshape(-1, dy.shape[-1]).t() @ xr.reshape(-1, xr.shape[-1]) \
            if ctx.needs_input_grad[1] else None
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias and ctx.needs_input_grad[2] \
            else None
        return dx, dw, db, None, None


class LowpAttention(torch.autograd.Function):
    """dtrain's attention with 16-bit products (src/ops/cpu/kern/attention.c), for at most one
    key tile (T <= 32, where the kernel's running max is the row max):
      forward   s = R(q) R(k)^T / sqrt(hs) (masked), m = row max, e = exp(s - m), l = sum e,
                y = R(e) R(v) / l, lse = m + log l
      backward  P = exp(s - lse), D = rowsum(R(dy) y), dS = P (R(dy) R(v)^T - D) / sqrt(hs),
                dV = R(P)^T R(dy), dQ = R(dS) R(k), dK = R(dS)^T R(q)
    with R = round16."""

    @staticmethod
    def forward(ctx, q, k, v, causal, dtype):
        T = q.shape[-2]
        if T > 32:
            raise ValueError("mixed_ref.LowpAttention emulates one 32-key tile (T <= 32), got T=%d" % T)
        qr, kr, vr = round16(q, dtype), round16(k, dtype), round16(v, dtype)
        s = (qr @ kr.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        if causal:
            s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        m = s.max(-1, keepdim=True).values
        e = torch.exp(s - m)
        l = e.sum(-1, keepdim=True)
        y = (round16(e, dtype) @ vr) / l
        ctx.save_for_backward(qr, kr, vr, y, s, m + torch.log(l))
        ctx.dtype = dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        qr, kr, vr, y, s, lse = ctx.saved_tensors
        dtype, scale = ctx.dtype, 1.0 / math.sqrt(qr.shape[-1])
        dyr = round16(dy, dtype)
        p = torch.exp(s - lse)
        D = (dyr * y).sum(-1, keepdim=True)
        ds = p * (dyr @ vr.transpose(-2, -1) - D) * scale
        dsr = round16(ds, dtype)
        return dsr @ kr, dsr.transpose(-2, -1) @ qr, round16(p, dtype).transpose(-2, -1) @ dyr, None, None


class _Counter:
    calls = 0


@contextlib.contextmanager
def emulate(precision, round_dy=True):
    """Within the block every F.linear (so every nn.Linear) is LowpLinear in `precision`
    ("bf16" / "fp16"); "fp32" changes nothing. Yields a counter whose .calls is the number of
    linear calls made, so a caller can check that the swap reached every matmul."""
    count = _Counter()
    if precision == "fp32":
        yield count
        return
    dtype = DTYPES[precision]
    orig = F.linear

    def linear(x, w, b=None):
        count.calls += 1
        return LowpLinear.apply(x, w, b, dtype, round_dy)

    orig_attend = gpt2_torch.attend

    def attend(q, k, v, causal):
        return LowpAttention.apply(q, k, v, causal, dtype)

    F.linear = linear
    gpt2_torch.attend = attend
    try:
        yield count
    finally:
        F.linear = orig
        gpt2_torch.attend = orig_attend


def autocast_forward_backward(model, inputs, targets):
    """One forward/backward of the float32 `model` under torch.autocast('cpu', bfloat16).
    Returns (loss, {param name: grad}) as float64 numpy arrays (the gradients are the float32
    parameters' gradients)."""
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(inputs, targets)
    loss.float().backward()
    grads = {n: p.grad.detach().double().numpy().copy() for n, p in model.named_parameters()}
    return np.array([float(loss)], dtype=np.float64), grads
