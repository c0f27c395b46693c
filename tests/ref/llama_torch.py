"""PyTorch definition of dtrain's LLaMA family, used by the parity oracle.

Not run directly. Imported by path from:
  tests/ref/gpt2_ref.py   (float64 oracle: /usr/bin/python3 tests/ref/gpt2_ref.py DIR | --self-test)

Parameter names are exactly Hugging Face LlamaForCausalLM state-dict names, every matrix is stored
"out x in" like torch.nn.Linear.weight and nothing has a bias, so a dtrain (or HF) state dict loads
with load_state_dict(strict=True):
  model.embed_tokens.weight                              (V, C)
  model.layers.{l}.input_layernorm.weight                (C)
  model.layers.{l}.self_attn.q_proj.weight               (NH*hs, C)
  model.layers.{l}.self_attn.k_proj.weight               (NKV*hs, C)
  model.layers.{l}.self_attn.v_proj.weight               (NKV*hs, C)
  model.layers.{l}.self_attn.o_proj.weight               (C, NH*hs)
  model.layers.{l}.post_attention_layernorm.weight       (C)
  model.layers.{l}.mlp.gate_proj.weight                  (F, C)
  model.layers.{l}.mlp.up_proj.weight                    (F, C)
  model.layers.{l}.mlp.down_proj.weight                  (C, F)
  model.norm.weight                                      (C)
  lm_head.weight                                         (V, C)   only when untied
with hs = C / NH. Tied: logits = norm(x) @ embed_tokens^T and there is no lm_head.weight.

Model (the published LLaMA architecture, as HF transformers' modeling_llama defines it):
  x = embed_tokens[tok]
  per layer:  h = x + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),  n = RMSNorm(x)
              x = h + down_proj(silu(gate_proj(m)) * up_proj(m)),                  m = RMSNorm(h)
  logits = RMSNorm(x) @ head^T
RMSNorm(x) = w * x * rsqrt(mean(x^2, -1) + eps), computed in the model's dtype (HF upcasts to
float32 internally; in the float64 oracle that would only lose precision, so it is not done).
RoPE, HF "rotate-half" convention: within each head, dimension i < hs/2 is paired with i + hs/2
(not 2i with 2i+1); inv_freq[i] = theta^(-2i/hs), angle(t, i) = t * inv_freq[i] for position
t = 0..T-1, cos/sin = cat(cos(angle), cos(angle)) / cat(sin(angle), sin(angle)), and
q' = q*cos + rotate_half(q)*sin with rotate_half(x) = cat(-x2, x1). The angles are computed in the
model dtype (HF computes them in float32). With rope_scaling (HF's config.json dict: rope_type or
type linear, llama3 or yarn, and its keys), inv_freq is tests/ref/rope_scaling_ref.py's float64 rule
(the published formulas) and cos, sin are multiplied by its attention factor (yarn).
Grouped-query attention: query head h uses kv head h // (NH/NKV) (HF repeat_kv, i.e.
repeat_interleave of the kv heads); causal softmax(q k^T / sqrt(hs)) v. NKV == NH is plain
multi-head attention, NKV == 1 multi-query attention.
Loss is the mean cross-entropy over all B*T positions.

Also here: a small-random initialisation for tests, the two AdamW parameter groups (weight decay
on 2-D tensors only: every matrix, embed_tokens and lm_head included; the RMSNorm weights not) and
dtrain's learning-rate schedule (the same function as for GPT-2).

Only torch and math are used.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # keep tests/ref free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_torch  # noqa: E402  attention (mixed_ref swaps it)
import rope_scaling_ref  # noqa: E402  the float64 rope_scaling rules
from gpt2_torch import count_params, lr_at, param_groups  # noqa: E402,F401  dtrain's schedule (and rules) in one place

DEFAULT_ROPE_THETA = 10000.0
DEFAULT_NORM_EPS = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, d_model, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_cos_sin(T, hs, theta, dtype, device=None, scaling=None):
    """(T, hs) cos and sin tables: angle(t, i) = t * theta^(-2i/hs), duplicated over both halves;
    scaling: None, or an HF rope_scaling dict (its inv_freq and cos/sin factor)."""
    assert hs % 2 == 0, "head size must be even for RoPE"
    scale = 1.0
    if scaling is None:
        i = torch.arange(0, hs, 2, dtype=dtype, device=device)          # 2i
        inv_freq = 1.0 / (theta ** (i / hs))
    else:
        rule, kw = scaling
        f, scale = rope_scaling_ref.inv_freq(rule, theta, hs, **kw)
        inv_freq = torch.tensor(f, dtype=dtype, device=device)
    t = torch.arange(T, dtype=dtype, device=device)
    ang = torch.outer(t, inv_freq)                                    # (T, hs/2)
    ang = torch.cat((ang, ang), dim=-1)                               # (T, hs)
    return ang.cos() * scale, ang.sin() * scale


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x, cos, sin):
    """x: (B, heads, T, hs); cos/sin: (T, hs)."""
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, n_rep):
    """(B, NKV, T, hs) -> (B, NKV*n_rep, T, hs); output head h is input head h // n_rep."""
    if n_rep == 1:
        return x
    B, nkv, T, hs = x.shape
    return x[:, :, None, :, :].expand(B, nkv, n_rep, T, hs).reshape(B, nkv * n_rep, T, hs)


class LlamaAttention(nn.Module):
    def __init__(self, d_model, n_head, n_kv_head, rope_theta, rope_scaling=None):
        super().__init__()
        assert d_model % n_head == 0, "d_model must be divisible by n_head"
        assert n_head % n_kv_head == 0, "n_head must be divisible by n_kv_head"
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.hs = d_model // n_head
        assert self.hs % 2 == 0, "head size must be even for RoPE"
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling       # None or (rule, rope_scaling_ref.inv_freq keywords)
        self.q_proj = nn.Linear(d_model, n_head * self.hs, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_head * self.hs, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_head * self.hs, bias=False)
        self.o_proj = nn.Linear(n_head * self.hs, d_model, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        nh, nkv, hs = self.n_head, self.n_kv_head, self.hs
        # head h = rows h*hs..(h+1)*hs of q_proj (of k_proj/v_proj for kv head h)
        q = self.q_proj(x).view(B, T, nh, hs).transpose(1, 2)
        k = self.k_proj(x).view(B, T, nkv, hs).transpose(1, 2)
        v = self.v_proj(x).view(B, T, nkv, hs).transpose(1, 2)
        if self.rope_scaling is None:
            cos, sin = rope_cos_sin(T, hs, self.rope_theta, x.dtype, x.device)
        else:
            cos, sin = rope_cos_sin(T, hs, self.rope_theta, x.dtype, x.device, self.rope_scaling)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k = repeat_kv(k, nh // nkv)
        v = repeat_kv(v, nh // nkv)
        y = gpt2_torch.attend(q, k, v, True).transpose(1, 2).contiguous().view(B, T, nh * hs)
        return self.o_proj(y)


class LlamaMLP(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, d_model, n_head, n_kv_head, d_ff, rope_theta, norm_eps, rope_scaling=None):
        super().__init__()
        self.input_layernorm = RMSNorm(d_model, norm_eps)
        self.self_attn = LlamaAttention(d_model, n_head, n_kv_head, rope_theta, rope_scaling)
        self.post_attention_layernorm = RMSNorm(d_model, norm_eps)
        self.mlp = LlamaMLP(d_model, d_ff)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class LlamaModel(nn.Module):
    def __init__(self, n_layer, d_model, n_head, n_kv_head, d_ff, vocab, rope_theta, norm_eps,
                 rope_scaling=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList([
            LlamaDecoderLayer(d_model, n_head, n_kv_head, d_ff, rope_theta, norm_eps, rope_scaling)
            for _ in range(n_layer)])
        self.norm = RMSNorm(d_model, norm_eps)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class Llama(nn.Module):
    """LlamaForCausalLM: parameters model.* and, when untied, lm_head.weight."""

    def __init__(self, n_layer, d_model, n_head, n_kv_head, d_ff, vocab, context, untied,
                 rope_theta=DEFAULT_ROPE_THETA, norm_eps=DEFAULT_NORM_EPS, rope_scaling=None):
        """rope_scaling: None or an HF config.json rope_scaling dict (with
        max_position_embeddings = context for yarn's default original context)."""
        super().__init__()
        self.n_layer, self.d_model, self.n_head, self.n_kv_head = n_layer, d_model, n_head, \
            n_kv_head
        self.d_ff, self.vocab, self.context, self.untied = d_ff, vocab, context, bool(untied)
        self.rope_theta, self.norm_eps = float(rope_theta), float(norm_eps)
        scaling = None
        if rope_scaling is not None:
            scaling = rope_scaling_ref.hf_rule({"rope_scaling": rope_scaling,
                                                "max_position_embeddings": context})
            if scaling[0] in ("none", "default"):
                scaling = None
        self.model = LlamaModel(n_layer, d_model, n_head, n_kv_head, d_ff, vocab, rope_theta,
                                norm_eps, scaling)
        if self.untied:
            self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def head_weight(self):
        return self.lm_head.weight if self.untied else self.model.embed_tokens.weight

    def forward(self, idx, targets=None):
        """idx, targets: integer (B, T). Returns (logits (B,T,V), loss or None)."""
        B, T = idx.shape
        assert T <= self.context, "sequence length %d > context %d" % (T, self.context)
        x = self.model(idx)
        logits = F.linear(x, self.head_weight())
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T).long())
        return logits, loss


def llama_init_(model, std=0.02, generator=None):
    """Test initialisation: every matrix and the embedding ~ N(0, std), o_proj and down_proj
    ~ N(0, std/sqrt(2L)); RMSNorm weights 1."""
    proj_std = std / math.sqrt(2 * model.n_layer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                p.fill_(1.0)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                p.normal_(0.0, proj_std, generator=generator)
            else:
                p.normal_(0.0, std, generator=generator)
    return model
